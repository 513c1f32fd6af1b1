"""Scenario "fifo": receive latency on a FIFO queue of 10,000 groups x 100 messages beside one
of a single group (and a plain queue as the reference).

A FIFO receive must not cost more with the number of groups the way a scan over every group
would: the waiting messages of a group sit at ``visible_at = 'infinity'``, out of the claim's
path, so a receive walks only the heads it takes. Three queues in one scratch database:

- ``fifo_many``: 10,000 groups x 100 messages (sent round-robin, one message per group a batch);
- ``fifo_one``: one group (one message deliverable at a time);
- ``plain``: a standard queue, the same number of messages as ``fifo_one``.

Measured through the Python client after ``VACUUM ANALYZE``: ``receive(max_messages)`` then
``delete_batch`` of what it got, in alternating blocks on the queues so drift hits all alike,
plus ``EXPLAIN (ANALYZE, BUFFERS)`` of the whole ``queue_pg.receive`` call (rolled back). The
figure of merit is fifo_many / plain receive latency; fifo_one returns one message a receive.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from psycopg import sql

from bench import Scenario, db
from bench.report import (
    DEFAULT_OUT,
    LatencySummary,
    machine_info,
    machine_line,
    markdown_table,
    redact_dsn,
    write_results,
)

__all__ = ["SCENARIO", "Params", "run"]

RESULT_NAME = "fifo"
MANY, ONE, PLAIN = "fifo_many", "fifo_one", "plain"
QUEUES = (MANY, ONE, PLAIN)


@dataclass(frozen=True)
class Params:
    scale: float
    groups: int  #: groups of fifo_many
    per_group: int  #: messages per group of fifo_many
    small: int  #: messages of fifo_one and of plain
    receives: int  #: measured receives per queue
    max_messages: int
    warmup: int
    block: int
    explain_runs: int
    database: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Params:
        groups = max(100, round(10_000 * args.scale))
        receives = args.receives
        return cls(
            scale=args.scale,
            groups=groups,
            per_group=args.per_group,
            small=(receives + args.warmup) * args.max_messages + 100,
            receives=receives,
            max_messages=args.max_messages,
            warmup=args.warmup,
            block=args.block,
            explain_runs=args.explain_runs,
            database=args.database,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--per-group", type=int, default=100,
                        help="messages per group of fifo_many (default 100)")
    parser.add_argument("--receives", type=int, default=1000,
                        help="measured receives per queue (default 1000)")
    parser.add_argument("--max-messages", type=int, default=10,
                        help="max_messages of each receive (default 10)")
    parser.add_argument("--warmup", type=int, default=50,
                        help="unmeasured receives per queue (default 50)")
    parser.add_argument("--block", type=int, default=50,
                        help="receives per turn on one queue (default 50)")
    parser.add_argument("--explain-runs", type=int, default=20,
                        help="EXPLAIN ANALYZE runs per queue (default 20)")


@dataclass(frozen=True)
class QueueFigures:
    receive: LatencySummary  #: client latency of receive(max_messages) alone
    delete: LatencySummary  #: of the delete_batch after it (on FIFO: the next heads made visible)
    messages_per_receive: float
    server_p50_ms: float  #: Execution Time of queue_pg.receive, EXPLAIN ANALYZE, rolled back
    server_buffers: dict[str, int]  #: of the median run


_FILL = (
    "SELECT count(*) FROM queue_pg.send_batch(%(queue)s, ARRAY("
    " SELECT jsonb_build_object('n', g) FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) g"
    " ORDER BY g), \"group\" => ARRAY("
    " SELECT 'g' || (g %% %(groups)s) FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) g"
    " ORDER BY g))"
)


def _fill_grouped(conn: Any, queue: str, count: int, groups: int) -> float:
    """``count`` messages round-robin over ``groups`` groups, batches of up to 10,000."""
    began = time.perf_counter()
    done = 0
    while done < count:
        size = min(10_000, count - done)
        with conn.transaction():
            conn.execute(_FILL, {"queue": queue, "lo": done, "hi": done + size - 1,
                                 "groups": groups})
        done += size
    return time.perf_counter() - began


def _prepare(dsn: str, p: Params, log: Callable[[str], None]) -> dict[str, float]:
    db.install(dsn)
    timings: dict[str, float] = {}
    with db.connect(dsn) as conn:
        conn.execute("SELECT queue_pg.create_queue(%s, fifo => true)", [MANY])
        conn.execute("SELECT queue_pg.create_queue(%s, fifo => true)", [ONE])
        conn.execute("SELECT queue_pg.create_queue(%s)", [PLAIN])
        log(f"fill {MANY}: {p.groups:,} groups x {p.per_group} messages...")
        timings["fill_many_s"] = _fill_grouped(conn, MANY, p.groups * p.per_group, p.groups)
        timings["fill_one_s"] = _fill_grouped(conn, ONE, p.small, 1)
        timings["fill_plain_s"] = db.fill(conn, PLAIN, p.small)
        timings["vacuum_s"] = db.vacuum_analyze(conn)
    return timings


def _client_loop(dsn: str, p: Params) -> dict[str, tuple[list[float], list[float], int]]:
    from queue_pg import Client

    times: dict[str, list[float]] = {q: [] for q in QUEUES}
    deletes: dict[str, list[float]] = {q: [] for q in QUEUES}
    got = dict.fromkeys(QUEUES, 0)
    with Client(dsn, min_size=1, max_size=1, sweep_interval=None) as client:

        def once(queue: str, record: bool) -> None:
            t0 = time.perf_counter()
            msgs = client.receive(queue, p.max_messages)
            t1 = time.perf_counter()
            receipts = [m.receipt for m in msgs if m.receipt is not None]
            if receipts:
                client.delete_batch(queue, receipts)
            if record:
                times[queue].append(t1 - t0)
                deletes[queue].append(time.perf_counter() - t1)
                got[queue] += len(msgs)

        for queue in QUEUES:
            for _ in range(p.warmup):
                once(queue, record=False)
        done = turn = 0
        while done < p.receives:
            n = min(p.block, p.receives - done)
            order = QUEUES if turn % 2 == 0 else QUEUES[::-1]
            for queue in order:
                for _ in range(n):
                    once(queue, record=True)
            done += n
            turn += 1
    return {q: (times[q], deletes[q], got[q]) for q in QUEUES}


def _server_side(dsn: str, p: Params, queue: str) -> tuple[float, dict[str, int]]:
    runs = []
    with db.connect(dsn, autocommit=False) as conn:
        query = sql.SQL("SELECT * FROM queue_pg.receive({}, {})").format(
            sql.Literal(queue), sql.Literal(p.max_messages))
        for _ in range(p.explain_runs):
            runs.append(db.explain_analyze(conn, query))
            conn.rollback()
    runs.sort(key=lambda r: r.execution_ms)
    median = runs[len(runs) // 2]
    return statistics.median(r.execution_ms for r in runs), median.buffers


def run(args: argparse.Namespace) -> int:
    p = Params.from_args(args)
    out = Path(args.out) if args.out else DEFAULT_OUT
    log: Callable[[str], None] = (lambda _: None) if args.quiet else print
    began = time.perf_counter()
    with db.scratch_database(args.dsn, p.database, keep=args.keep) as dsn:
        timings = _prepare(dsn, p, log)
        with db.connect(dsn) as conn:
            machine = machine_info(conn)
            sizes = db.relation_sizes(conn)
        log(f"client: {p.receives:,} receives per queue...")
        loop = _client_loop(dsn, p)
        figures = {}
        for q in QUEUES:
            server_ms, buffers = _server_side(dsn, p, q)
            lat, dels, n = loop[q]
            figures[q] = QueueFigures(LatencySummary.of(lat), LatencySummary.of(dels),
                                      n / max(1, len(lat)), server_ms, buffers)
    ratio = figures[MANY].receive.p50_ms / figures[PLAIN].receive.p50_ms
    result: dict[str, Any] = {
        "scenario": "fifo",
        "command": args.command_line,
        "dsn": redact_dsn(args.dsn),
        "machine": machine,
        "parameters": asdict(p),
        "setup": {**timings, "relation_bytes": sizes},
        "queues": figures,
        "ratio_many_over_plain_p50": ratio,
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    md = _markdown(result, p, figures, ratio)
    paths = write_results(out, RESULT_NAME, result, md)
    log(md)
    for path in paths:
        log(f"wrote {path}")
    return 0


def _markdown(result: dict[str, Any], p: Params, figures: dict[str, QueueFigures],
              ratio: float) -> str:
    label = {MANY: f"FIFO, {p.groups:,} groups x {p.per_group}", ONE: "FIFO, one group",
             PLAIN: "standard queue"}
    rows = [
        (label[q], f"{f.receive.p50_ms:.3f}", f"{f.receive.p90_ms:.3f}", f"{f.receive.p99_ms:.3f}",
         f"{f.messages_per_receive:.1f}", f"{f.delete.p50_ms:.3f}", f"{f.server_p50_ms:.3f}",
         f.server_buffers.get("hit", 0) + f.server_buffers.get("read", 0))
        for q, f in figures.items()
    ]
    return "\n".join([
        "# FIFO receive with many groups",
        "",
        f"receive(max_messages={p.max_messages}) then delete_batch, {p.receives:,} receives per"
        " queue in alternating blocks; server: EXPLAIN (ANALYZE, BUFFERS) of queue_pg.receive,"
        " rolled back.",
        "",
        markdown_table(
            ["queue", "receive p50 ms", "p90 ms", "p99 ms", "messages / receive",
             "delete_batch p50 ms", "server receive p50 ms", "buffers"],
            rows, "lrrrrrrr"),
        "",
        f"FIFO with {p.groups:,} groups / standard queue, client p50: {ratio:.2f}x",
        "",
        f"Machine: {machine_line(result['machine'])}",
        "",
        f"Reproduce: `{result['command']}`",
    ])


SCENARIO = Scenario(
    name="fifo",
    help="FIFO receive latency with 10,000 groups x 100 messages beside one group",
    add_arguments=add_arguments,
    run=run,
)
