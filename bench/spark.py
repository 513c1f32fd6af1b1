"""``python -m bench spark``: queue_pg on Spark (needs the [spark] extra and Java 17).

Two figures. Enqueue: a DataFrame of ``--rows`` rows on ``--master`` (local[2]) through
``queue_pg.spark.enqueue`` (COPY, exactly once), beside Spark's own JDBC writer inserting the
same JSON rows into a plain table (body jsonb, attributes jsonb; no index, default batch size)
on the same server, the JDBC writer into a table like queue_pg.messages (its columns, identity
and indexes: what any writer of messages pays), and ``send_batch`` (batches of 1000) from one
Python process. The
messages table is emptied and a CHECKPOINT taken before each. Advisor: ``--history-rows``
history rows (three queues, four types, log-normal processing times), the Spark advisor
(read through JDBC, computed, collected) beside the same computation as one plain SQL query.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from bench import Scenario, db
from bench.report import machine_info, machine_line, markdown_table, redact_dsn, write_results
from bench.throughput import logger

RESULT_NAME = "spark"
QUEUE = "spark_bench"
ATTRIBUTES = {"type": "bench"}
SEND_BATCH = 1000

#: The advice over the window as one plain SQL query: the definition in docs/spark.md.
ADVICE_SQL = """
WITH t AS (
    SELECT h.queue, h.type, h.outcome, h.receive_count, h.lease_expiries,
           CASE WHEN h.outcome = 'deleted' AND h.last_received_at IS NOT NULL
                THEN extract(epoch FROM h.finished_at - h.last_received_at)::float8
           END AS processing,
           extract(epoch FROM h.first_received_at - h.enqueued_at)::float8 AS waiting
    FROM queue_pg.message_history h
    WHERE h.finished_at >= %(since)s AND h.finished_at < %(until)s
), g AS (
    SELECT queue, CASE WHEN grouping(type) = 1 THEN 'queue' ELSE 'type' END AS scope, type,
           count(*) AS messages, count(processing) AS samples,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY processing) AS p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY processing) AS p95,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY processing) AS p99,
           max(processing) AS max,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY waiting) AS wait_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY waiting) AS wait_p95,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY waiting) AS wait_p99,
           max(waiting) AS wait_max,
           sum(receive_count) AS receives, sum(lease_expiries) AS lease_expiries,
           count(*) FILTER (WHERE outcome = 'dead_lettered') AS dead_lettered,
           sum(greatest(receive_count - 1, 0)) AS redeliveries
    FROM t GROUP BY GROUPING SETS ((queue), (queue, type))
), a AS (
    SELECT g.*, lease_expiries::float8 / nullif(receives, 0) AS expiry_rate,
           dead_lettered::float8 / messages AS dead_letter_rate,
           q.visibility_timeout, q.max_lease,
           least(q.max_lease, greatest(1, ceil(6 * p99))) AS base
    FROM g LEFT JOIN queue_pg.list_queues() q ON q.name = g.queue
), s AS (
    SELECT queue, count(*) AS types, max(p99) AS hi, min(p99) AS lo
    FROM a WHERE scope = 'type' AND samples >= 30 GROUP BY queue
)
SELECT a.*, r.recommended_timeout, r.recommended_timeout / 3 AS heartbeat_interval,
       CASE WHEN samples = 0 THEN 'none' WHEN samples < 30 THEN 'low'
            WHEN samples < 300 THEN 'medium' ELSE 'high' END AS confidence,
       coalesce(s.types >= 2 AND s.hi > 0 AND s.hi >= 10 * s.lo, false) AS split_advised,
       CASE WHEN s.types >= 2 AND s.lo > 0 THEN s.hi / s.lo END AS spread_ratio
FROM a
CROSS JOIN LATERAL (SELECT CASE WHEN a.samples = 0 THEN NULL
                                WHEN a.expiry_rate > 0.01 AND a.visibility_timeout >= a.base
                                THEN least(a.max_lease, ceil(2 * a.visibility_timeout))
                                ELSE a.base END AS recommended_timeout) r
LEFT JOIN s USING (queue)
"""

#: Five million rows in a few statements: three queues, four types whose processing times are
#: log-normal around 0.5 s to 60 s, waiting up to a minute, some lapsed leases and dead letters.
FILL_HISTORY_SQL = """
INSERT INTO queue_pg.message_history (queue_id, queue, message_id, outcome, enqueued_at,
    first_received_at, last_received_at, finished_at, receive_count, lease_expiries, type)
SELECT q.id, q.name, g.i, o.outcome, f.at - make_interval(secs => p.secs + w.secs),
       f.at - make_interval(secs => p.secs), f.at - make_interval(secs => p.secs), f.at,
       r.receives, r.receives - 1, t.type
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g(i)
CROSS JOIN LATERAL (SELECT (ARRAY['resize', 'email', 'report', 'sync'])[1 + g.i %% 4] AS type) t
CROSS JOIN LATERAL (SELECT (ARRAY[0.5, 2, 10, 60])[1 + g.i %% 4]
                           * exp(0.8 * sqrt(-2 * ln(random())) * cos(2 * pi() * random()))
                           AS secs) p
CROSS JOIN LATERAL (SELECT 60 * random() AS secs) w
CROSS JOIN LATERAL (SELECT CASE WHEN random() < 0.03 THEN 2 ELSE 1 END AS receives) r
CROSS JOIN LATERAL (SELECT CASE WHEN random() < 0.005 THEN 'dead_lettered' ELSE 'deleted' END
                    AS outcome) o
CROSS JOIN LATERAL (SELECT now() - make_interval(secs => 3600 * random()) AS at) f
JOIN queue_pg.queues q ON q.name = 'history_' || (g.i %% 3)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=2_000_000,
                        help="rows of the DataFrame to enqueue (default 2,000,000)")
    parser.add_argument("--history-rows", type=int, default=5_000_000,
                        help="history rows for the advisor (default 5,000,000)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--partitions", type=int, default=2,
                        help="partitions of the DataFrame (default 2)")
    parser.add_argument("--driver-memory", default="4g",
                        help="Spark driver memory; local mode runs everything in it (default 4g)")


def _fresh(dsn: str) -> None:
    with db.connect(dsn) as conn:
        conn.execute("TRUNCATE queue_pg.messages, queue_pg.bulk_writes")
        conn.execute("DROP TABLE IF EXISTS public.bench_plain, public.bench_like")
        conn.execute("CREATE TABLE public.bench_plain (body jsonb, attributes jsonb)")
        # the messages table's columns, defaults, identity, indexes and storage settings
        conn.execute("CREATE TABLE public.bench_like (LIKE queue_pg.messages INCLUDING ALL)")
        conn.execute("CHECKPOINT")


#: What a process is, by its command line: PostgreSQL backends of the bench's database, the
#: Spark JVM (local mode: driver and executors), Spark's Python workers.
_KINDS = (("postgres", "postgres: "), ("jvm", "org.apache.spark"), ("python", "pyspark"))


def _cpu_seconds(pid: str) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@contextlib.contextmanager
def _cpu_split(database: str, into: dict[str, float]) -> Iterator[None]:
    """CPU seconds spent in the block by kind of process (_KINDS), whatever else runs on the
    host: /proc sampled every 50 ms, each process counted from its first sample (or 0 for one
    started in the block) to its last (backends exit when a partition's connection closes).
    Linux only; elsewhere ``into`` stays empty. Load-independent where throughput is not."""
    if not os.path.isdir("/proc/self"):
        yield
        return
    first: dict[str, float] = {}
    last: dict[str, tuple[str, float]] = {}
    stop = threading.Event()

    def kind(pid: str) -> str | None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return None
        if cmd.startswith("postgres: "):
            return "postgres" if f" {database} " in cmd else None
        return next((k for k, mark in _KINDS[1:] if mark in cmd), None)

    def sample(initial: bool) -> None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            k = last[pid][0] if pid in last else kind(pid)
            if k is None:
                continue
            try:
                cpu = _cpu_seconds(pid)
            except OSError:
                continue
            if pid not in first:
                first[pid] = cpu if initial else 0.0
            last[pid] = (k, cpu)

    def loop() -> None:
        while not stop.wait(0.05):
            sample(False)

    sample(True)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sample(False)
        for pid, (k, cpu) in last.items():
            into[k] = into.get(k, 0.0) + cpu - first[pid]


def db_name(dsn: str) -> str:
    return str(conninfo_to_dict(dsn).get("dbname") or "")


def _timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _send_batch(dsn: str, rows: int) -> int:
    from queue_pg import Client

    sent = 0
    with Client(dsn, min_size=1, max_size=1, sweep_interval=None) as client:
        for start in range(0, rows, SEND_BATCH):
            bodies = [{"id": i, "name": f"item-{i}", "bucket": i % 100}
                      for i in range(start, min(rows, start + SEND_BATCH))]
            sent += len(client.send_batch(QUEUE, bodies, attributes=[ATTRIBUTES] * len(bodies)))
    return sent


def _fill_history(dsn: str, rows: int) -> None:
    with db.connect(dsn) as conn:
        for i in range(3):
            conn.execute("SELECT queue_pg.create_queue(%s)", [f"history_{i}"])
        step = 1_000_000
        for first in range(0, rows, step):
            conn.execute(FILL_HISTORY_SQL, {"first": first, "last": min(rows, first + step) - 1})
        conn.execute("ANALYZE queue_pg.message_history")


def run(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    from queue_pg.spark import advise, enqueue, jdbc_options, session

    log = logger(args.quiet)
    rows = max(1, round(args.rows * args.scale))
    history_rows = max(1, round(args.history_rows * args.scale))
    figures: dict[str, Any] = {}
    with db.scratch_database(args.dsn, args.database, keep=args.keep) as dsn:
        log(f"installed queue_pg ({db.install(dsn)})")
        with db.connect(dsn) as conn:
            machine = machine_info(conn)
            conn.execute("SELECT queue_pg.create_queue(%s)", [QUEUE])
        spark = session(args.master, app_name="queue_pg bench",
                        conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                              "spark.sql.shuffle.partitions": "2",
                              # exact percentiles hold each group's values in memory
                              "spark.driver.memory": args.driver_memory})
        spark.sparkContext.setLogLevel("ERROR")
        try:
            df = spark.range(0, rows, 1, args.partitions).select(
                "id", F.concat(F.lit("item-"), F.col("id")).alias("name"),
                (F.col("id") % 100).alias("bucket"))
            enqueue(df.limit(10), QUEUE, dsn=dsn)  # warm: JVM, Python workers, Arrow
            _fresh(dsn)
            cpu: dict[str, float] = {}
            with _cpu_split(db_name(dsn), cpu):
                secs, result = _timed(lambda: enqueue(df, QUEUE, dsn=dsn, attributes=ATTRIBUTES))
            assert result.rows_written == rows
            figures["enqueue"] = {"seconds": secs, "rows": rows, "per_s": rows / secs, "cpu": cpu}
            log(f"queue_pg.spark.enqueue: {rows / secs:,.0f} msgs/s ({secs:.1f} s)")

            _fresh(dsn)
            options = jdbc_options(dsn)
            options["url"] += "?stringtype=unspecified"  # text into jsonb, as the server casts
            plain = df.select(F.to_json(F.struct("id", "name", "bucket")).alias("body"),
                              F.lit(json.dumps(ATTRIBUTES)).alias("attributes"))
            cpu = {}
            with _cpu_split(db_name(dsn), cpu):
                secs, _ = _timed(lambda: plain.write.format("jdbc").options(**options)
                                 .option("dbtable", "public.bench_plain").mode("append").save())
            figures["jdbc"] = {"seconds": secs, "rows": rows, "per_s": rows / secs, "cpu": cpu}
            log(f"Spark JDBC writer (plain table): {rows / secs:,.0f} rows/s ({secs:.1f} s)")

            _fresh(dsn)
            like = plain.select(
                F.lit(1).alias("queue_id"), F.current_timestamp().alias("visible_at"),
                (F.current_timestamp() + F.expr("INTERVAL 4 DAYS")).alias("expires_at"),
                F.current_timestamp().alias("enqueued_at"), "body", "attributes")
            cpu = {}
            with _cpu_split(db_name(dsn), cpu):
                secs, _ = _timed(lambda: like.write.format("jdbc").options(**options)
                                 .option("dbtable", "public.bench_like").mode("append").save())
            figures["jdbc_like"] = {"seconds": secs, "rows": rows, "per_s": rows / secs, "cpu": cpu}
            log(f"Spark JDBC writer (table like queue_pg.messages): {rows / secs:,.0f} rows/s"
                f" ({secs:.1f} s)")

            _fresh(dsn)
            cpu = {}
            with _cpu_split(db_name(dsn), cpu):
                secs, sent = _timed(lambda: _send_batch(dsn, rows))
            assert sent == rows
            figures["send_batch"] = {"seconds": secs, "rows": rows, "per_s": rows / secs,
                                     "cpu": cpu}
            log(f"send_batch, one process: {rows / secs:,.0f} msgs/s ({secs:.1f} s)")
            _fresh(dsn)

            log(f"filling {history_rows:,} history rows")
            _fill_history(dsn, history_rows)
            until = datetime.now(timezone.utc)  # the history ends within the last hour
            since = until - timedelta(hours=2)
            secs, got = _timed(lambda: _advise(spark, advise, dsn, since, until))
            figures["advisor_spark"] = {"seconds": secs, "rows": history_rows, "groups": len(got)}
            log(f"advisor on Spark: {secs:.1f} s ({len(got)} advice rows)")
            with db.connect(dsn) as conn:
                cur = conn.cursor(row_factory=dict_row)
                secs, plain_rows = _timed(lambda: cur.execute(
                    ADVICE_SQL, {"since": since, "until": until}).fetchall())
            plain_advice = {(r["queue"], r["scope"], r["type"]): r["recommended_timeout"]
                            for r in plain_rows}
            same = plain_advice == got
            figures["advisor_sql"] = {"seconds": secs, "rows": history_rows,
                                      "groups": len(plain_rows), "same_advice": same}
            log(f"advisor as one SQL query: {secs:.1f} s ({len(plain_rows)} advice rows;"
                f" same recommended timeouts: {same})")
        finally:
            spark.stop()

    ratio = figures["enqueue"]["per_s"] / figures["jdbc"]["per_s"]
    md = "\n".join([
        "# queue_pg on Spark",
        "",
        f"Enqueue {rows:,} rows on `{args.master}` ({args.partitions} partitions); advisor over"
        f" {history_rows:,} history rows.",
        "",
        markdown_table(["method", "rows/s", "seconds", "vs JDBC writer",
                        "CPU µs/row: PostgreSQL", "Spark JVM", "Spark Python"], [
            [name, f"{f['per_s']:,.0f}", f"{f['seconds']:.1f}",
             f"{f['per_s'] / figures['jdbc']['per_s']:.2f}x",
             *(f"{f['cpu'][k] / rows * 1e6:.1f}" if k in f["cpu"] else "-"
               for k in ("postgres", "jvm", "python"))]
            for name, f in (("queue_pg.spark.enqueue (COPY, exactly once)", figures["enqueue"]),
                            ("Spark JDBC writer, plain table", figures["jdbc"]),
                            ("Spark JDBC writer, table like queue_pg.messages",
                             figures["jdbc_like"]),
                            ("send_batch x1000, one Python process", figures["send_batch"]))
        ], "lrrrrrr"),
        "",
        "CPU µs/row: CPU time of the benchmark database's backends, of the Spark JVM and of its"
        " Python workers while the method ran, per row (from /proc; load-independent, unlike"
        " rows/s on a shared host).",
        "",
        markdown_table(["advisor", "seconds", "advice rows"], [
            ["queue_pg.spark.advise (JDBC read + Spark)",
             f"{figures['advisor_spark']['seconds']:.1f}", figures["advisor_spark"]["groups"]],
            ["the same as one SQL query", f"{figures['advisor_sql']['seconds']:.1f}",
             figures["advisor_sql"]["groups"]],
        ], "lrr"),
        "",
        f"Machine: {machine_line(machine)}.",
        "",
        f"Reproduce: `{args.command_line}`",
    ])
    result = {"scenario": RESULT_NAME, "dsn": redact_dsn(args.dsn), "machine": machine,
              "parameters": {"rows": rows, "history_rows": history_rows, "master": args.master,
                             "partitions": args.partitions},
              "results": figures, "enqueue_vs_jdbc": ratio}
    for p in write_results(args.out, RESULT_NAME, result, md):
        log(f"wrote {p}")
    return 0


def _advise(spark: Any, advise: Any, dsn: str, since: datetime, until: datetime) -> dict[Any, Any]:
    """The Spark advisor, every table computed and collected: recommended timeout by group."""
    got = advise(spark, dsn=dsn, since=since, until=until)
    got.receive_counts.collect()
    got.quantiles.collect()
    return {(r["queue"], r["scope"], r["type"]): r["recommended_timeout"]
            for r in got.advice.collect()}


SCENARIO = Scenario(
    name="spark",
    help="Spark: DataFrame enqueue vs Spark's JDBC writer vs send_batch; advisor vs plain SQL",
    add_arguments=add_arguments,
    run=run,
)
