"""Scenario "cycle": receive + delete throughput on a pre-filled queue, for batches of 1, 10 and
100 with 1, 4 and 16 consumer processes, for queue_pg, its peers and the pgbench ceiling.

Each consumer loops "settle the last batch, receive the next" with its client's fastest public
calls (queue_pg: ``receive(delete=…)`` when the client has it, else ``delete_batch`` +
``receive``). The queue is topped up before each cell so it does not run dry (a cell that does
is marked "drained").
"""

from __future__ import annotations

import argparse

from bench import Scenario
from bench.throughput import add_common_arguments, run_grid

BATCHES = (1, 10, 100)
CONSUMERS = (1, 4, 16)
RESULT_NAME = "cycle"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, seconds=5.0)


def run(args: argparse.Namespace) -> int:
    grid = [(b, c) for b in BATCHES for c in CONSUMERS]
    run_grid(
        args,
        op="cycle",
        grid=grid,
        result_name=RESULT_NAME,
        title="Receive + delete: messages per second",
        describe=(
            "Each consumer is a process of its own that receives a batch and deletes it, for"
            " {seconds:g} s, on a queue filled beforehand; the pgbench ceiling runs the"
            " statements queue_pg's client sends (`-M prepared`, one client per consumer)."
        ),
    )
    return 0


SCENARIO = Scenario(
    name="cycle",
    help="receive + delete throughput, batches 1-100, 1/4/16 consumers, vs peers and pgbench",
    add_arguments=add_arguments,
    run=run,
)
