"""``python -m bench spark``: queue_pg on Spark (needs the [spark] extra and Java 17).

Two figures. Enqueue: a DataFrame of ``--rows`` rows on ``--master`` (local[2]) through
``queue_pg.spark.enqueue`` (COPY, exactly once), beside its ceiling, a raw ``COPY`` of the same
rows straight into ``queue_pg.messages`` from psycopg (``--partitions`` connections at once, one
transaction per 100,000 rows as the sink; the COPY text made before the clock starts: the cost
of this schema's rows to the server, with none of the sink's staging, counters or exactly-once
key), Spark's own JDBC writer inserting the same JSON rows into a plain table (body jsonb,
attributes jsonb; no index, default batch size) on the same server, the JDBC writer into a
table like queue_pg.messages (its columns, identity and indexes: what any writer of messages
pays), and ``send_batch`` (batches of 1000) from one Python process. The messages table is
emptied and a CHECKPOINT taken before each. ``--rounds N`` runs every method once a round, in
an order that turns each round (a drift of a shared host falls on all of them alike), and
reports medians and the ratios of each round. Advisor: ``--history-rows`` history rows (three
queues, four types, log-normal processing times; 0 skips it), the Spark advisor (read through
JDBC, computed, collected) beside the same computation as one plain SQL query.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from bench import Scenario, db
from bench.report import (
    cpu_seconds,
    machine_info,
    machine_line,
    markdown_table,
    save_scenario,
)
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
                        help="history rows for the advisor (default 5,000,000; 0: no advisor)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of the enqueue methods, each once a round (default 1)")
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
                cpu = cpu_seconds(pid)
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


#: The raw COPY's columns: what the sink's rows fill in queue_pg.messages (the id is its identity).
RAW_COPY = ("COPY queue_pg.messages (queue_id, visible_at, expires_at, enqueued_at, body,"
            " attributes) FROM STDIN")
RAW_CHUNK = 100_000  # rows per transaction, the sink's default chunk_rows


def _raw_copy_text(queue_id: int, rows: int, parts: int) -> list[list[bytes]]:
    """The COPY text of the rows the sink sends, split as the DataFrame's partitions, in chunks
    of RAW_CHUNK rows: made before the clock starts, so only the server's work is timed."""
    now = datetime.now(timezone.utc)
    later = now + timedelta(days=4)
    head = f"{queue_id}\t{now.isoformat()}\t{later.isoformat()}\t{now.isoformat()}\t"
    attributes = json.dumps(ATTRIBUTES)
    bounds = [rows * i // parts for i in range(parts + 1)]
    out: list[list[bytes]] = []
    for lo, hi in itertools.pairwise(bounds):
        chunks = []
        for start in range(lo, hi, RAW_CHUNK):
            chunks.append("".join(
                f'{head}{{"id":{i},"name":"item-{i}","bucket":{i % 100}}}\t{attributes}\n'
                for i in range(start, min(hi, start + RAW_CHUNK))).encode())
        out.append(chunks)
    return out


def _raw_copy(dsn: str, parts: list[list[bytes]]) -> None:
    """Each partition's chunks over a connection of its own, at once, a transaction a chunk."""
    errors: list[BaseException] = []

    def write(chunks: list[bytes]) -> None:
        try:
            with db.connect(dsn, autocommit=False) as conn:
                for chunk in chunks:
                    with conn.cursor().copy(RAW_COPY) as copy:
                        copy.write(chunk)
                    conn.commit()
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(chunks,)) for chunks in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


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
    history_rows = max(0, round(args.history_rows * args.scale))
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
            options = jdbc_options(dsn)
            options["url"] += "?stringtype=unspecified"  # text into jsonb, as the server casts
            plain = df.select(F.to_json(F.struct("id", "name", "bucket")).alias("body"),
                              F.lit(json.dumps(ATTRIBUTES)).alias("attributes"))
            like = plain.select(
                F.lit(1).alias("queue_id"), F.current_timestamp().alias("visible_at"),
                (F.current_timestamp() + F.expr("INTERVAL 4 DAYS")).alias("expires_at"),
                F.current_timestamp().alias("enqueued_at"), "body", "attributes")
            with db.connect(dsn) as conn:
                row = conn.execute("SELECT id FROM queue_pg.queues WHERE name = %s",
                                   [QUEUE]).fetchone()
            assert row is not None
            raw_text = _raw_copy_text(int(row[0]), rows, args.partitions)

            def sink() -> None:
                result = enqueue(df, QUEUE, dsn=dsn, attributes=ATTRIBUTES)
                assert result.rows_written == rows

            def jdbc_into(table: str, frame: Any) -> Any:
                return lambda: (frame.write.format("jdbc").options(**options)
                                .option("dbtable", table).mode("append").save())

            def send_batch() -> None:
                assert _send_batch(dsn, rows) == rows

            methods: dict[str, Any] = {
                "enqueue": sink,
                "raw_copy": lambda: _raw_copy(dsn, raw_text),
                "jdbc": jdbc_into("public.bench_plain", plain),
                "jdbc_like": jdbc_into("public.bench_like", like),
                "send_batch": send_batch,
            }
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in methods}
            names = list(methods)
            for r in range(max(1, args.rounds)):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    _fresh(dsn)
                    cpu: dict[str, float] = {}
                    load = os.getloadavg()[0]
                    with _cpu_split(db_name(dsn), cpu):
                        secs, _ = _timed(methods[name])
                    if name == "raw_copy":
                        with db.connect(dsn) as conn:
                            got = conn.execute("SELECT count(*) FROM queue_pg.messages").fetchone()
                        assert got == (rows,), got
                    runs[name].append({"seconds": secs, "per_s": rows / secs, "cpu": cpu,
                                       "load1": load})
                    log(f"round {r + 1} {LABELS[name]}: {rows / secs:,.0f} rows/s ({secs:.1f} s,"
                        f" load {load:.1f})")
            for name, got_runs in runs.items():
                figures[name] = {
                    "seconds": statistics.median(x["seconds"] for x in got_runs),
                    "rows": rows,
                    "per_s": statistics.median(x["per_s"] for x in got_runs),
                    "cpu": {k: statistics.median(x["cpu"].get(k, 0.0) for x in got_runs)
                            for k in got_runs[0]["cpu"]},
                    "runs": got_runs,
                }
            _fresh(dsn)

            if history_rows:
                _advisor(spark, advise, dsn, history_rows, figures, log)
        finally:
            spark.stop()
    return _report(args, machine, rows, history_rows, figures, log)


def _advisor(spark: Any, advise: Any, dsn: str, history_rows: int, figures: dict[str, Any],
             log: Any) -> None:
    """The Spark advisor beside the same computation as one SQL query, on history_rows rows."""
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


LABELS = {
    "enqueue": "queue_pg.spark.enqueue (COPY, exactly once)",
    "raw_copy": "raw COPY into queue_pg.messages (psycopg, no queue_pg logic)",
    "jdbc": "Spark JDBC writer, plain table",
    "jdbc_like": "Spark JDBC writer, table like queue_pg.messages",
    "send_batch": "send_batch x1000, one Python process",
}

#: The sink's goals (issue 37): against the physical limit of the schema and against the
#: JDBC writer into a table shaped like messages.
GOALS = (("raw_copy", 0.8), ("jdbc_like", 1.5))


def _ratios(figures: dict[str, Any], other: str) -> list[float]:
    """The sink's rows/s over ``other``'s, round by round."""
    return [e["per_s"] / o["per_s"]
            for e, o in zip(figures["enqueue"]["runs"], figures[other]["runs"], strict=True)]


def _server_ratios(figures: dict[str, Any], other: str) -> list[float]:
    """``other``'s PostgreSQL CPU per row over the sink's, round by round: the ratio of rows/s
    where the server is what limits (Spark on other machines), whatever else the host runs."""
    return [o["cpu"]["postgres"] / e["cpu"]["postgres"]
            for e, o in zip(figures["enqueue"]["runs"], figures[other]["runs"], strict=True)
            if e["cpu"].get("postgres") and o["cpu"].get("postgres")]


def _report(args: argparse.Namespace, machine: dict[str, Any], rows: int, history_rows: int,
            figures: dict[str, Any], log: Any) -> int:
    rounds = len(figures["enqueue"]["runs"])

    def cpu(f: dict[str, Any], k: str) -> str:
        return f"{f['cpu'][k] / rows * 1e6:.1f}" if k in f["cpu"] else "-"

    def spread(values: list[float], fmt: str) -> str:
        return fmt.format(statistics.median(values)) + (
            f" ({fmt.format(min(values))} to {fmt.format(max(values))})" if len(values) > 1 else "")

    goals = []
    for other, goal in GOALS:
        ratios = _ratios(figures, other)
        server = _server_ratios(figures, other)
        goals.append([f"sink ÷ {LABELS[other]}", spread(ratios, "{:.2f}x"),
                      spread(server, "{:.2f}x") if server else "-", f"≥ {goal}x"])
    loads = [x["load1"] for f in figures.values() if "runs" in f for x in f["runs"]]
    lines = [
        "# queue_pg on Spark",
        "",
        f"Enqueue {rows:,} rows on `{args.master}` ({args.partitions} partitions), {rounds}"
        f" round(s), every method once a round, the order turning each round; medians (range)."
        f" Load average (1 min) at the methods' starts: {min(loads):.1f} to {max(loads):.1f}.",
        "",
        markdown_table(["method", "rows/s", "seconds", "vs JDBC writer",
                        "CPU µs/row: PostgreSQL", "Spark JVM", "Spark Python"], [
            [LABELS[name], spread([x["per_s"] for x in f["runs"]], "{:,.0f}"),
             f"{f['seconds']:.1f}", f"{f['per_s'] / figures['jdbc']['per_s']:.2f}x",
             cpu(f, "postgres"), cpu(f, "jvm"), cpu(f, "python")]
            for name, f in ((n, figures[n]) for n in LABELS)
        ], "lrrrrrr"),
        "",
        markdown_table(["the sink's goal", "rows/s ratio on this host", "by PostgreSQL CPU per"
                        " row (the server the limit)", "goal"], goals, "lrrr"),
        "",
        "CPU µs/row: CPU time of the benchmark database's backends, of the Spark JVM and of its"
        " Python workers while the method ran, per row (from /proc; load-independent, unlike"
        " rows/s on a shared host). The raw COPY's text is made before its clock starts. Ratios:"
        " median of the rounds (range). On one host Spark's JVM and Python workers take CPU from"
        " the server, which the raw COPY does not pay; where Spark runs elsewhere the server's"
        " CPU per row sets the rate: the ratio by PostgreSQL CPU.",
    ]
    if "advisor_spark" in figures:
        lines += [
            "",
            f"Advisor over {history_rows:,} history rows.",
            "",
            markdown_table(["advisor", "seconds", "advice rows"], [
                ["queue_pg.spark.advise (JDBC read + Spark)",
                 f"{figures['advisor_spark']['seconds']:.1f}", figures["advisor_spark"]["groups"]],
                ["the same as one SQL query", f"{figures['advisor_sql']['seconds']:.1f}",
                 figures["advisor_sql"]["groups"]],
            ], "lrr"),
        ]
    lines += ["", f"Machine: {machine_line(machine)}.", "",
              f"Reproduce: `{args.command_line}`"]
    return save_scenario(
        args, RESULT_NAME, machine,
        {"rows": rows, "history_rows": history_rows, "master": args.master,
         "partitions": args.partitions, "rounds": rounds},
        figures, "\n".join(lines), log,
        enqueue_vs_jdbc=figures["enqueue"]["per_s"] / figures["jdbc"]["per_s"],
        enqueue_vs_raw_copy=_ratios(figures, "raw_copy"),
        enqueue_vs_jdbc_like=_ratios(figures, "jdbc_like"),
        enqueue_vs_raw_copy_server_cpu=_server_ratios(figures, "raw_copy"),
        enqueue_vs_jdbc_like_server_cpu=_server_ratios(figures, "jdbc_like"))


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
