"""Scenario "sqs-details": what the SQS endpoint's MessageDeduplicationId and SequenceNumber cost.

Since they are returned, a send that claims a dedup id keeps it on its message (column
``messages.dedup_id``), and a receive that asks for them runs one more statement,
``queue_pg.message_details(queue, receipts)``. Measured in statements on one connection (no
HTTP), in alternating blocks so drift hits all alike:

- ``send_batch`` of 10 to a FIFO queue, each with a dedup id of its own; beside the same to a
  FIFO queue without dedup ids, and to a standard queue without (which the change leaves as it
  was: the column stays NULL);
- ``receive`` of 10 on the FIFO queue, alone and followed by ``message_details`` of its receipts;
- ``EXPLAIN (ANALYZE, BUFFERS)`` of the statement inside ``message_details`` (auto_explain).

``--baseline DIR``: also install the SQL of another checkout (``DIR/sql``, e.g. the main branch)
in a second scratch database and time its sends the same way, for the cost of the send before
and after.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psycopg

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

__all__ = ["SCENARIO", "run"]

RESULT_NAME = "sqs_details"
BATCH = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", type=int, default=1500,
                        help="measured send batches (and receives) per case (default 1500)")
    parser.add_argument("--block", type=int, default=50, help="alternation block (default 50)")
    parser.add_argument("--baseline", default=None,
                        help="a checkout whose sql/ to time the sends of too (e.g. /work/main)")


def _install_files(dsn: str, root: Path) -> None:
    """The schema and API files of checkout ``root``, in order (as bench.db.install's fallback)."""
    with db.connect(dsn, autocommit=False) as conn:
        for path in [*sorted((root / "sql/schema").glob("*.sql")),
                     *sorted((root / "sql/api").glob("*.sql"))]:
            conn.execute(path.read_text().encode())
        conn.commit()


def _setup(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT queue_pg.create_queue('dd-fifo', fifo => true)")
    conn.execute("SELECT queue_pg.create_queue('nodd-fifo', fifo => true)")
    conn.execute("SELECT queue_pg.create_queue('plain')")


def _sends(conns: dict[str, psycopg.Connection[Any]],
           p: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Per database and case, the seconds of each send_batch of BATCH; blocks alternate over
    the cases and the databases, so load that comes and goes hits them all alike."""
    body = [f'{{"n": {i}, "pad": "{"x" * 32}"}}' for i in range(BATCH)]
    groups = [f"g{i}" for i in range(BATCH)]  # a receive of 10 then gets 10 (one per group)

    def cases(conn: psycopg.Connection[Any]) -> dict[str, Callable[[], None]]:
        def dedup() -> None:
            ids = [uuid.uuid4().hex for _ in range(BATCH)]
            conn.execute("SELECT queue_pg.send_batch('dd-fifo', %s::jsonb[], \"group\" => %s,"
                         " dedup_ids => %s)", [body, groups, ids]).fetchall()

        def fifo() -> None:
            conn.execute("SELECT queue_pg.send_batch('nodd-fifo', %s::jsonb[],"
                         " \"group\" => %s)", [body, groups]).fetchall()

        def plain() -> None:
            conn.execute("SELECT queue_pg.send_batch('plain', %s::jsonb[])", [body]).fetchall()

        return {"FIFO, dedup ids": dedup, "FIFO, no dedup ids": fifo,
                "standard, no dedup ids": plain}

    runs = {label: cases(conn) for label, conn in conns.items()}
    times: dict[str, dict[str, list[float]]] = {
        label: {k: [] for k in c} for label, c in runs.items()}
    for c in runs.values():  # warm-up
        for f in c.values():
            for _ in range(5):
                f()
    done = 0
    while done < p.batches:
        n = min(p.block, p.batches - done)
        for label, c in runs.items():
            for name, f in c.items():
                for _ in range(n):
                    t = time.perf_counter()
                    f()
                    times[label][name].append(time.perf_counter() - t)
        done += n
    return times


def _receives(conn: psycopg.Connection[Any], p: argparse.Namespace) -> dict[str, list[float]]:
    """receive of BATCH on dd-fifo (messages released again after), alone and with details."""
    times: dict[str, list[float]] = {"receive 10": [], "receive 10 + message_details": []}

    def once(details: bool) -> float:
        t = time.perf_counter()
        receipts = [r[0] for r in conn.execute(
            "SELECT receipt FROM queue_pg.receive('dd-fifo', %s)", [BATCH]).fetchall()]
        if details:
            conn.execute("SELECT * FROM queue_pg.message_details('dd-fifo', %s::text[])",
                         [receipts]).fetchall()
        took = time.perf_counter() - t
        conn.execute("SELECT queue_pg.change_visibility('dd-fifo', r, 0) FROM unnest(%s::text[]) r",
                     [receipts])
        return took

    done = 0
    while done < p.batches:
        n = min(p.block, p.batches - done)
        for details, name in ((False, "receive 10"), (True, "receive 10 + message_details")):
            for _ in range(n):
                times[name].append(once(details))
        done += n
    return times


def _explain(conn: psycopg.Connection[Any]) -> tuple[str, float, int]:
    """The plan of message_details' statement for 10 receipts, its time and buffers."""
    receipts = [r[0] for r in conn.execute(
        "SELECT receipt FROM queue_pg.receive('dd-fifo', %s)", [BATCH]).fetchall()]
    with db.nested_plans(conn) as plans:
        conn.execute("SELECT * FROM queue_pg.message_details('dd-fifo', %s::text[])",
                     [receipts]).fetchall()
    if not plans:
        return "(auto_explain not loadable)", float("nan"), 0
    inner = [x for x in plans if "queue_pg.messages" in x.text] or plans
    best = inner[0]
    return best.text, best.duration_ms, sum(best.buffers.values())


def run(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else DEFAULT_OUT
    log: Callable[[str], None] = (lambda _: None) if args.quiet else print
    began = time.perf_counter()
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(db.scratch_database(args.dsn, args.database, keep=args.keep))
        db.install(dsn)
        conns = {"this": stack.enter_context(db.connect(dsn))}
        if args.baseline:
            base_dsn = stack.enter_context(
                db.scratch_database(args.dsn, args.database + "_base", keep=args.keep))
            _install_files(base_dsn, Path(args.baseline))
            conns["baseline"] = stack.enter_context(db.connect(base_dsn))
        conn = conns["this"]
        machine = machine_info(conn)
        for c in conns.values():
            _setup(c)
        log("sends...")
        all_sends = _sends(conns, args)
        sends, base = all_sends["this"], all_sends.get("baseline", {})
        row = conn.execute(
            "SELECT avg(pg_column_size(m.*)) FILTER (WHERE m.dedup_id IS NOT NULL),"
            " avg(pg_column_size(m.*))"
            "  FILTER (WHERE m.dedup_id IS NULL AND m.group_id IS NOT NULL)"
            " FROM queue_pg.messages m").fetchone()
        row_bytes = {"with dedup id": float(row[0] or 0), "without": float(row[1] or 0)} \
            if row else {}
        log("receives...")
        receives = _receives(conn, args)
        plan, plan_ms, plan_buffers = _explain(conn)
    summary = {
        "send_batch": {k: LatencySummary.of(v) for k, v in sends.items()},
        "send_batch_baseline": {k: LatencySummary.of(v) for k, v in base.items()},
        "receive": {k: LatencySummary.of(v) for k, v in receives.items()},
    }
    result: dict[str, Any] = {
        "scenario": "sqs-details",
        "command": args.command_line,
        "dsn": redact_dsn(args.dsn),
        "machine": machine,
        "parameters": {"batches": args.batches, "block": args.block, "batch": BATCH,
                       "baseline": args.baseline},
        "row_bytes": row_bytes,
        "message_details_plan": {"ms": plan_ms, "buffers": plan_buffers, "text": plan},
        "figures": {k: {n: asdict(s) for n, s in v.items()} for k, v in summary.items()},
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    rows = []
    for name, s in summary["send_batch"].items():
        b = summary["send_batch_baseline"].get(name)
        rows.append((f"send_batch of {BATCH}, {name}", f"{s.p50_ms:.3f}", f"{s.p90_ms:.3f}",
                     f"{b.p50_ms:.3f}" if b else "-"))
    for name, s in summary["receive"].items():
        rows.append((name, f"{s.p50_ms:.3f}", f"{s.p90_ms:.3f}", "-"))
    md = "\n".join([
        "# SQS MessageDeduplicationId and SequenceNumber: what they cost",
        "",
        f"Statements on one connection per database, {args.batches:,} per case in blocks of"
        f" {args.block} alternating over the cases and databases; baseline: the SQL of"
        f" `{args.baseline}` in a database of its own.",
        "",
        markdown_table(["statement", "p50 ms", "p90 ms", "baseline p50 ms"], rows, "lrrr"),
        "",
        f"Row size of a FIFO message (pg_column_size): {row_bytes.get('with dedup id', 0):.0f}"
        f" bytes with a 32-character dedup id, {row_bytes.get('without', 0):.0f} without.",
        "",
        f"message_details' statement for the {BATCH} receipts of a receive: {plan_ms:.3f} ms,"
        f" {plan_buffers} buffers:",
        "",
        "```",
        plan,
        "```",
        "",
        f"Machine: {machine_line(machine)}",
        "",
        f"Reproduce: `{args.command_line}`",
    ])
    for path in write_results(out, RESULT_NAME, result, md):
        log(f"wrote {path}")
    log(md)
    return 0


SCENARIO = Scenario(
    name="sqs-details",
    help="the cost of keeping dedup ids on messages and of message_details",
    add_arguments=add_arguments,
    run=run,
)
