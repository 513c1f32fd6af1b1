"""Scenario "client-cpu": the Python CPU a receive costs the consumer process, beside bare psycopg.

On a 2-core machine the consumers share the cores with the server, so their CPU per call is
part of every throughput figure (it is most of the gap to the pgbench ceiling). This scenario
isolates it: one process, one connection, ``receive`` of 1, 10 and 100 messages with a
visibility timeout of 0 (the messages come due again at once, so the queue never drains and
every call returns a full batch), timed with ``time.process_time`` (this process only: the
server's work is not in it). Three ways to run the same statement:

- ``psycopg``: the statement ``Client.receive`` sends, from a bare psycopg connection, rows left
  as tuples (psycopg's default loaders): what any Python client pays;
- ``queue_pg``: ``Client.receive`` on the client's own pool (the faster jsonb loader, Message
  objects, pool checkout, error translation);
- ``queue_pg, conn=``: ``Client.receive(conn=…)`` on a caller's connection (psycopg's own jsonb
  loader).

Each figure is the least of ``--repeats`` rounds (the VM's noise only ever adds); the three
take turns round by round, so drift (dead rows, the host's load) hits them alike.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from bench import Scenario, db
from bench.report import machine_info, machine_line, markdown_table, save_scenario
from bench.throughput import logger

RESULT_NAME = "client_cpu"
QUEUE = "cpu"
BATCHES = (1, 10, 100)
CALLS_PER_ROUND = 1_000  #: at --scale 1
VARIANTS = ("psycopg", "queue_pg", "queue_pg, conn=")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=5, help="rounds per figure (default 5)")


def _per_call(call: Callable[[], int], calls: int) -> tuple[float, float]:
    """Process CPU and wall time per call over ``calls`` calls."""
    got = 0
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        got += call()
    c1, w1 = time.process_time(), time.perf_counter()
    if got == 0:
        raise RuntimeError("the queue returned nothing: the measurement would be empty")
    return (c1 - c0) / calls, (w1 - w0) / calls


def run(args: argparse.Namespace) -> int:
    from queue_pg import Client, _ops

    log = logger(args.quiet)
    results: list[dict[str, Any]] = []
    with db.scratch_database(args.dsn, args.database, keep=args.keep) as dsn:
        log(f"installed queue_pg ({db.install(dsn)})")
        with db.connect(dsn) as conn:
            machine = machine_info(conn)
            conn.execute("SELECT queue_pg.create_queue(%s)", [QUEUE])
            db.fill(conn, QUEUE, max(BATCHES) * 2)
        client = Client(dsn, min_size=1, max_size=1, sweep_interval=None)
        bare = psycopg.connect(dsn, autocommit=True)
        caller = psycopg.connect(dsn, autocommit=True)
        try:
            for batch in BATCHES:
                call = _ops.receive(QUEUE, batch, 0, 0)

                def plain(call: Any = call) -> int:
                    with bare.cursor(row_factory=tuple_row) as cur:
                        cur.execute(call.query, call.params)
                        return len(cur.fetchall())

                def own(batch: int = batch) -> int:
                    return len(client.receive(QUEUE, batch, visibility_timeout=0, wait=0))

                def theirs(batch: int = batch) -> int:
                    got = client.receive(QUEUE, batch, visibility_timeout=0, wait=0, conn=caller)
                    return len(got)

                calls = max(20, round(CALLS_PER_ROUND * args.scale))
                fns = dict(zip(VARIANTS, (plain, own, theirs), strict=True))
                for fn in fns.values():
                    for _ in range(10):  # warm: prepared statements, pool, caches
                        fn()
                best = {name: (float("inf"), float("inf")) for name in fns}
                for _ in range(args.repeats):  # rounds take turns, so drift hits all alike
                    for name, fn in fns.items():
                        cpu, wall = _per_call(fn, calls)
                        best[name] = (min(best[name][0], cpu), min(best[name][1], wall))
                row: dict[str, Any] = {"batch": batch, "calls": calls}
                for name, (cpu, wall) in best.items():
                    row[name] = {"cpu_us": cpu * 1e6, "wall_us": wall * 1e6}
                    log(f"batch {batch:>3} {name:<16} cpu {cpu * 1e6:7.1f} us/call"
                        f"  wall {wall * 1e6:7.1f} us/call")
                results.append(row)
        finally:
            client.close()
            bare.close()
            caller.close()

    headers = ["batch", *[f"{v} µs/call" for v in VARIANTS], "queue_pg minus psycopg µs",
               "queue_pg µs/message"]
    rows = []
    for r in results:
        ours, base = r["queue_pg"]["cpu_us"], r["psycopg"]["cpu_us"]
        rows.append([r["batch"], *[f"{r[v]['cpu_us']:,.1f}" for v in VARIANTS],
                     f"{ours - base:+,.1f}", f"{ours / r['batch']:,.1f}"])
    md = "\n".join([
        "# Client CPU per receive",
        "",
        "CPU time of the consumer process per `receive` call (least of"
        f" {args.repeats} rounds; the server's work is not in it), visibility timeout 0 so each"
        " call returns a full batch. `psycopg`: the same statement from bare psycopg, rows left"
        " as tuples; `queue_pg`: `Client.receive` on its own pool; `queue_pg, conn=`: on a"
        " caller's connection (psycopg's own jsonb loader).",
        "",
        markdown_table(headers, rows, "rrrrrr"),
        "",
        f"Machine: {machine_line(machine)}.",
        "",
        f"Reproduce: `{args.command_line}`",
    ])
    return save_scenario(args, RESULT_NAME, machine, {"repeats": args.repeats, "scale": args.scale},
                         results, md, log)


SCENARIO = Scenario(
    name="client-cpu",
    help="CPU the consumer process spends per receive of 1/10/100: queue_pg's client vs psycopg",
    add_arguments=add_arguments,
    run=run,
)
