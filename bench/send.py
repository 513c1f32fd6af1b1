"""Scenario "send": messages per second for batches of 1, 10, 100 and 1,000 bodies, with 1 and
4 producer processes, for queue_pg, its peers and the pgbench ceiling.

A batch of 1 is each system's single-message send; larger ones its batch send (queue_pg:
``send_batch``, PGMQ: ``send_batch``, PgQueuer: ``enqueue`` with lists, Procrastinate:
``batch_defer_async``). Every body is ``{"n": i, "payload": 64 x "x"}``.

``--dedup``: queue_pg only, every message with a dedup id of its own (none is a duplicate), so
the figures show what claiming the ids costs; written to ``send_dedup.*`` to set beside
``send.*``.
"""

from __future__ import annotations

import argparse
import os

from bench import Scenario
from bench.peers.queue_pg_driver import DEDUP_ENV
from bench.throughput import add_common_arguments, run_grid

BATCHES = (1, 10, 100, 1000)
PRODUCERS = (1, 4)
RESULT_NAME = "send"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, seconds=5.0)
    parser.add_argument("--dedup", action="store_true",
                        help="queue_pg only: every message carries a dedup id (send_dedup.*)")


def run(args: argparse.Namespace) -> int:
    grid = [(b, p) for b in BATCHES for p in PRODUCERS]
    describe = (
        "Each producer is a process of its own sending batches of the same small JSON body"
        " for {seconds:g} s through its system's Python client; the pgbench ceiling runs"
        " the statement queue_pg's client sends (`-M prepared`, one client per producer)."
    )
    if args.dedup:  # the producer processes inherit the environment
        os.environ[DEDUP_ENV] = "1"
        args.systems, args.no_ceiling = "queue_pg", True
        describe += " Every message carries a dedup id of its own (none is a duplicate)."
    try:
        run_grid(
            args,
            op="send",
            grid=grid,
            result_name=RESULT_NAME + "_dedup" * args.dedup,
            title="Send with dedup ids: messages per second" if args.dedup
            else "Send: messages per second",
            describe=describe,
        )
    finally:
        os.environ.pop(DEDUP_ENV, None)
    return 0


SCENARIO = Scenario(
    name="send",
    help="send throughput, batches 1-1000, 1 and 4 producers, vs peers and pgbench",
    add_arguments=add_arguments,
    run=run,
)
