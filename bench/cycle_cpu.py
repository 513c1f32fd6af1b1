"""Scenario "cycle-cpu": the server's CPU per receive + delete cycle, queue_pg against PGMQ.

Throughput on a shared 2-core machine moves with everyone else's load; the CPU time one backend
spends on a cycle moves much less. Each system runs in one session of its own (autocommit,
``synchronous_commit = off`` in the session, so no WAL flush wait is counted), and the
backend's own CPU time is read from ``/proc/<pid>/schedstat`` around ``--cycles`` cycles; the
systems take turns, round after round, and each figure is the median of the rounds. The
server must be on this machine (its backends' ``/proc`` readable).

Systems: ``plain`` (``delete_batch`` of the finished batch, then ``receive``: two calls),
``combined`` (``receive(delete=previous)``: one call), and PGMQ's ``read`` + ``delete`` of its
own client's statements when the ``pgmq`` wheel is installed, and ``floor``: the least this design
does per message (``bench/peers/floor_driver.py``, one statement a cycle). ``--baseline DSN`` adds
queue_pg's two idioms on a database another checkout installed (A/B against a change).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench import Scenario, db
from bench.report import machine_info, machine_line, markdown_table, redact_dsn, save_scenario
from bench.throughput import logger

RESULT_NAME = "cycle_cpu"
QUEUE = "cycle_cpu"
PAYLOAD = "x" * 100  #: the cycle bench's 100-byte bodies
BATCHES = (10, 100)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=12, help="rounds taking turns (default 12)")
    parser.add_argument("--cycles", type=int, default=None,
                        help="cycles per round (default 1,000 messages' worth, times --scale)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)),
                        help="comma-separated batch sizes (default 10,100)")
    parser.add_argument("--baseline", default=None,
                        help="DSN of a database where another checkout installed queue_pg:"
                        " its two idioms are measured too, taking turns (A/B)")


def backend_cpu_ns(pid: int) -> int:
    """CPU time backend ``pid`` has run so far (ns): schedstat's first field, its own time only."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


@dataclass
class _System:
    label: str
    conn: psycopg.Connection[Any]
    cycle: Callable[[], int]  #: one cycle; returns the messages received
    pgmq: bool = False
    floor: bool = False
    dsn: str = ""  #: the floor's, to top its table up
    held: list[Any] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return int(self.conn.info.backend_pid)


def _queue_pg(label: str, dsn: str, batch: int, combined: bool) -> _System:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET synchronous_commit = off")
    conn.execute("SELECT queue_pg.create_queue(%s) WHERE NOT EXISTS"
                 " (SELECT 1 FROM queue_pg.queues WHERE name = %s)", [QUEUE, QUEUE])
    # the statements queue_pg's client sends (queue_pg/_ops.py)
    receive = ("SELECT * FROM queue_pg._receive(%s, %s::int, NULL::float8, NULL::float8, false,"
               " %b::text[], NULL::int)")

    def cycle() -> int:
        if combined:
            rows = conn.execute(receive, [QUEUE, batch, s.held or None]).fetchall()
        else:
            if s.held:
                conn.execute("SELECT * FROM queue_pg.delete_batch(%s, %b::text[])",
                              [QUEUE, s.held]).fetchall()
            rows = conn.execute(receive, [QUEUE, batch, None]).fetchall()
        s.held = [r[4] for r in rows]
        return len(rows)

    s = _System(label, conn, cycle)
    return s


def _pgmq(dsn: str, batch: int) -> _System:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET synchronous_commit = off")
    conn.execute("SELECT pgmq.create(%s)", [QUEUE])

    def cycle() -> int:  # the statements of pgmq's Python client (read_batch, delete_batch)
        if s.held:
            conn.execute("SELECT * FROM pgmq.delete(queue_name=>%s::text, msg_ids=>%s::bigint[])",
                         [QUEUE, s.held]).fetchall()
        rows = conn.execute("SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message,"
                            " headers FROM pgmq.read(queue_name=>%s::text, vt=>%s::integer,"
                            " qty=>%s::integer)", [QUEUE, 30, batch]).fetchall()
        s.held = [r[0] for r in rows]
        return len(rows)

    s = _System("PGMQ", conn, cycle, pgmq=True)
    return s


def _floor(dsn: str, batch: int) -> _System:
    """The floor (bench/peers/floor_driver.py): the design's least work, one statement a cycle."""
    from bench.peers.floor_driver import Floor

    driver = Floor(dsn)
    driver.conn.execute("SET synchronous_commit = off")

    def cycle() -> int:
        s.held = driver.cycle(s.held, batch)
        return len(s.held)

    s = _System("floor", driver.conn, cycle, floor=True, dsn=dsn)
    return s


def _top_up(s: _System, need: int) -> None:
    """At least ``need`` visible messages, outside the measured time."""
    if s.floor:
        from bench.peers.floor_driver import TABLE, Floor

        missing = need - db.count(s.conn, f"SELECT count(*) FROM {TABLE} WHERE vt <= now()")
        if missing > 0:
            Floor.fill(s.dsn, missing * 2)
        s.conn.execute("ANALYZE")
        return
    if s.pgmq:
        have = db.count(s.conn,
                        f"SELECT count(*) FROM pgmq.q_{QUEUE} WHERE vt <= clock_timestamp()")
    else:
        have = db.count(s.conn, "SELECT count(*) FROM queue_pg.messages m JOIN queue_pg.queues q"
                                " ON q.id = m.queue_id WHERE q.name = %s"
                                " AND m.visible_at <= clock_timestamp()", [QUEUE])
    missing = need - have
    fn = "pgmq.send_batch" if s.pgmq else "queue_pg.send_batch"
    while missing > 0:
        k = min(missing * 2, 10_000)
        s.conn.execute(f"SELECT count(*) FROM {fn}(%s, ARRAY(SELECT jsonb_build_object('n', g,"
                       " 'payload', %s::text) FROM generate_series(1, %s) g))",
                       [QUEUE, PAYLOAD, k])
        missing -= k
    s.conn.execute("ANALYZE")


def _measure(systems: list[_System], cycles: int, rounds: int, batch: int) -> None:
    for r in range(rounds + 1):  # round 0 warms every session (plans, caches) and is dropped
        for s in systems:
            _top_up(s, batch * (cycles + 10))
            for _ in range(5):
                s.cycle()
            before = backend_cpu_ns(s.pid)
            got = sum(s.cycle() for _ in range(cycles))
            spent = backend_cpu_ns(s.pid) - before
            if got < batch * cycles:
                raise RuntimeError(f"{s.label}: the queue ran short ({got} messages)")
            if r:
                s.cpu_us.append(spent / cycles / 1000)


def run(args: argparse.Namespace) -> int:
    log = logger(args.quiet)
    batches = [int(b) for b in str(args.batches).split(",") if b]
    results: list[dict[str, Any]] = []
    with db.scratch_database(args.dsn, args.database, keep=args.keep) as dsn:
        log(f"installed queue_pg ({db.install(dsn)})")
        from bench.peers.floor_driver import Floor

        Floor.install(dsn)
        with db.connect(dsn) as conn:
            machine = machine_info(conn)
        try:
            from pgmq import install_pgmq_from_sql
        except ImportError:
            has_pgmq = False
        else:
            install_pgmq_from_sql(dsn=dsn)
            has_pgmq = True
        for batch in batches:
            cycles = args.cycles or max(10, round(1000 / batch * float(args.scale)))
            systems = [_queue_pg("plain", dsn, batch, False),
                       _queue_pg("combined", dsn, batch, True)]
            if args.baseline:
                systems += [_queue_pg("baseline plain", args.baseline, batch, False),
                            _queue_pg("baseline combined", args.baseline, batch, True)]
            if has_pgmq:
                systems.append(_pgmq(dsn, batch))
            systems.append(_floor(dsn, batch))
            try:
                _measure(systems, cycles, args.rounds, batch)
            finally:
                for s in systems:
                    s.conn.close()
            row: dict[str, Any] = {
                "batch": batch, "cycles": cycles,
                "cpu_us": {s.label: statistics.median(s.cpu_us) for s in systems},
                "rounds": {s.label: s.cpu_us for s in systems}}
            for s in systems:
                log(f"batch {batch:>3} {s.label:<18} server CPU {row['cpu_us'][s.label]:8.1f} µs"
                    f" a cycle (rounds {min(s.cpu_us):.0f} to {max(s.cpu_us):.0f})")
            results.append(row)
    labels = list(results[0]["cpu_us"]) if results else []
    rows = [[r["batch"], *[f"{r['cpu_us'][k]:,.0f}" for k in labels]] for r in results]
    md = "\n".join([
        "# Server CPU per receive + delete cycle",
        "",
        f"The backend's own CPU time per cycle (µs, median of {args.rounds} rounds taking turns;"
        " `synchronous_commit = off` in each session, so no flush wait is counted).",
        "",
        markdown_table(["batch", *[f"{k} µs" for k in labels]], rows, "r" * (len(labels) + 1)),
        "",
        f"Machine: {machine_line(machine)}.",
        "",
        f"Reproduce: `{args.command_line}`",
    ])
    return save_scenario(args, RESULT_NAME, machine,
                         {"rounds": args.rounds, "batches": batches, "scale": args.scale,
                          "baseline": redact_dsn(args.baseline) if args.baseline else None},
                         results, md, log)


SCENARIO = Scenario(
    name="cycle-cpu",
    help="server CPU per receive + delete cycle (backend's /proc time): queue_pg vs PGMQ, A/B",
    add_arguments=add_arguments,
    run=run,
)
