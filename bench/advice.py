"""``python -m bench advice``: what the history views cost at 10,000,000 history rows.

``--history-rows`` rows (10 queues, two types each: log-normal processing times around 0.2 s
and 20 s) spread evenly over 7 days in ``finished_at`` order, as a live queue writes them, in
day partitions. Timed, best of ``--repeat``: ``timeout_advice`` over the last 24 hours and the
last hour, ``processing_times`` over 24 hours and a tuning step, first reading every history
row of the window (no rollups: the figures before revision 0010), then after sweep's per-minute
rollups have caught up. Also: the catch-up (rows per second), one sweep's rollup of a fresh
minute, and the largest difference between the exact and the rolled-up percentiles.
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from typing import Any

from bench import Scenario, db
from bench.report import machine_info, machine_line, markdown_table, save_scenario
from bench.throughput import logger

RESULT_NAME = "advice"
QUEUES = 10
DAYS = 7

#: Rows first..last of the history, evenly over the DAYS days before now, oldest first; queue
#: and type by row number, processing times log-normal (sigma 0.6) around 0.2 s and 20 s.
FILL_SQL = """
INSERT INTO queue_pg.message_history (queue_id, queue, message_id, outcome, enqueued_at,
    first_received_at, last_received_at, finished_at, receive_count, lease_expiries, type)
SELECT q.id, q.name, g.i, CASE WHEN g.i %% 500 = 0 THEN 'dead_lettered' ELSE 'deleted' END,
       f.at - make_interval(secs => p.secs + 2 * random()), f.at - make_interval(secs => p.secs),
       f.at - make_interval(secs => p.secs), f.at, 1 + (g.i %% 97 = 0)::int, (g.i %% 97 = 0)::int,
       CASE WHEN g.i / %(queues)s %% 20 = 0 THEN 'slow' ELSE 'fast' END
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g(i)
CROSS JOIN LATERAL (SELECT %(start)s::timestamptz + make_interval(secs => g.i * %(step)s) AS at) f
CROSS JOIN LATERAL (SELECT CASE WHEN g.i / %(queues)s %% 20 = 0 THEN 20 ELSE 0.2 END
                           * exp(0.6 * sqrt(-2 * ln(random())) * cos(2 * pi() * random()))
                           AS secs) p
JOIN queue_pg.queues q ON q.name = 'q' || (g.i %% %(queues)s)
"""

FIGURES = ("p50", "p95", "p99", "wait_p50", "wait_p95", "wait_p99")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--history-rows", type=int, default=10_000_000,
                        help="history rows over 7 days (default 10,000,000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each query (best is kept)")


def _fill(conn: Any, rows: int) -> None:
    for i in range(QUEUES):
        conn.execute("SELECT queue_pg.create_queue(%s, max_lease => 3600)", [f"q{i}"])
    # a day partition for each of the last days, as sweep would have made them
    for d in range(DAYS + 1, -1, -1):
        day = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date - %s", [d]).fetchone()[0]
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS queue_pg.message_history_{day:%Y%m%d} PARTITION OF"
            f" queue_pg.message_history FOR VALUES FROM ('{day} 00:00+00')"
            f" TO ('{day + timedelta(days=1)} 00:00+00')")
    start = conn.execute("SELECT now() - interval '7 days'").fetchone()[0]
    step = DAYS * 86400 / rows
    chunk = 1_000_000
    for first in range(0, rows, chunk):
        conn.execute(FILL_SQL, {"first": first, "last": min(rows, first + chunk) - 1,
                                "start": start, "step": step, "queues": QUEUES})
    conn.execute("VACUUM ANALYZE queue_pg.message_history")


def _one(conn: Any, query: str) -> Any:
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def _best(conn: Any, query: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        conn.execute(query).fetchall()
        best = min(best, time.perf_counter() - t0)
    return best


QUERIES = {
    "timeout_advice, 24 hours": "SELECT * FROM queue_pg.timeout_advice",
    "timeout_advice, 1 hour":
        "SELECT * FROM queue_pg.timeout_advice(now() - interval '1 hour', now())",
    "processing_times, 24 hours": "SELECT * FROM queue_pg.processing_times",
    "tune('q1', apply => false)": "SELECT * FROM queue_pg.tune('q1', apply => false)",
}


def _figures(conn: Any, fn: str, until: Any) -> dict[tuple[str, str, str | None], dict[str, Any]]:
    cur = conn.execute(f"SELECT queue, scope, type, messages, samples, {', '.join(FIGURES)}"
                       f" FROM queue_pg.{fn}(%s - interval '24 hours', %s, NULL)", [until, until])
    names = [d.name for d in cur.description]
    return {(r[0], r[1], r[2]): dict(zip(names, r, strict=True)) for r in cur.fetchall()}


def run(args: argparse.Namespace) -> int:
    log = logger(args.quiet)
    rows = max(1000, round(args.history_rows * args.scale))
    figures: dict[str, Any] = {"before": {}, "after": {}}
    scratch = db.scratch_database(args.dsn, args.database, keep=args.keep)
    with scratch as dsn, db.connect(dsn) as conn:
        log(f"installed queue_pg ({db.install(dsn)})")
        machine = machine_info(conn)
        t0 = time.perf_counter()
        _fill(conn, rows)
        log(f"filled {rows:,} history rows in {time.perf_counter() - t0:.0f} s")
        figures["rows_in_24h"] = _one(conn, "SELECT count(*) FROM queue_pg.message_history"
                                            " WHERE finished_at >= now() - interval '24 hours'")
        for name, query in QUERIES.items():
            figures["before"][name] = _best(conn, query, args.repeat)
            log(f"rows:    {name}: {figures['before'][name] * 1000:,.0f} ms")

        t0 = time.perf_counter()
        calls = 0
        while _one(conn, "SELECT queue_pg._rollup_history(clock_timestamp(), 200000)"):
            calls += 1
        secs = time.perf_counter() - t0
        figures["catch_up"] = {"seconds": secs, "rows_per_s": rows / secs, "calls": calls}
        log(f"rolled up {rows:,} rows in {secs:.0f} s ({rows / secs:,.0f} rows/s)")
        # a sweep's share in a live queue: one more minute of history (this fill's rate), rolled
        per_minute = max(1, round(rows / (DAYS * 1440)))
        conn.execute(
            "INSERT INTO queue_pg.message_history (queue_id, queue, message_id, outcome,"
            " enqueued_at, first_received_at, last_received_at, finished_at, receive_count,"
            " lease_expiries, type)"
            " SELECT q.id, q.name, -g, 'deleted', t - interval '2 s', t - interval '1 s',"
            "        t - interval '1 s', t, 1, 0, 'fast'"
            " FROM generate_series(1, %s) g, queue_pg.queues q, LATERAL (SELECT"
            "  queue_pg._floor_to(now(), 60) - interval '1 minute' + g * interval '1 ms' AS t) x"
            " WHERE q.name = 'q' || (g %% 10)", [per_minute])
        t0 = time.perf_counter()
        conn.execute("SELECT queue_pg._rollup_history(now() + interval '1 minute', 20000)")
        figures["rollup_one_minute"] = {"seconds": time.perf_counter() - t0, "rows": per_minute}
        log(f"one minute ({per_minute:,} rows) rolled up in"
            f" {figures['rollup_one_minute']['seconds'] * 1000:.0f} ms")
        conn.execute("VACUUM ANALYZE queue_pg.history_rollups")
        for name, query in QUERIES.items():
            figures["after"][name] = _best(conn, query, args.repeat)
            log(f"rollups: {name}: {figures['after'][name] * 1000:,.0f} ms")
        until = _one(conn, "SELECT now()")
        exact = _figures(conn, "_history_figures_exact", until)
        rolled = _figures(conn, "_history_figures", until)
        worst = 0.0
        for key, e in exact.items():
            r = rolled[key]
            assert (r["messages"], r["samples"]) == (e["messages"], e["samples"]), key
            for col in FIGURES:
                if e[col]:
                    worst = max(worst, abs(r[col] - e[col]) / abs(e[col]))
        figures["worst_relative_error"] = worst
        log(f"largest relative difference of a percentile, rolled up vs exact: {worst:.4%}")

    md = "\n".join([
        "# The history views at scale",
        "",
        f"{rows:,} history rows over {DAYS} days in {QUEUES} queues (two types each),"
        f" {figures['rows_in_24h']:,} of them in the last 24 hours. Best of {args.repeat}.",
        "",
        markdown_table(["query", "every row of the window", "rollups by minute and hour"], [
            [name, f"{figures['before'][name] * 1000:,.0f} ms",
             f"{figures['after'][name] * 1000:,.0f} ms"] for name in QUERIES], "lrr"),
        "",
        f"Rolling up the whole history: {figures['catch_up']['seconds']:.0f} s"
        f" ({figures['catch_up']['rows_per_s']:,.0f} rows/s). A sweep's rollup of one minute"
        f" ({figures['rollup_one_minute']['rows']:,} rows):"
        f" {figures['rollup_one_minute']['seconds'] * 1000:.0f} ms. Largest difference of a"
        f" percentile from the exact one: {worst:.3%} (bound: 0.995%).",
        "",
        f"Machine: {machine_line(machine)}.",
        "",
        f"Reproduce: `{args.command_line}`",
    ])
    return save_scenario(args, RESULT_NAME, machine,
                         {"history_rows": rows, "queues": QUEUES, "days": DAYS,
                          "repeat": args.repeat},
                         figures, md, log)


SCENARIO = Scenario(
    name="advice",
    help="the advice and processing-time views at 10 M history rows, before and after rollups",
    add_arguments=add_arguments,
    run=run,
)
