"""queue_pg.spark on Spark in local mode against a real PostgreSQL.

One SparkSession for the module (local[2], up to 4 attempts per task, so a failed task is
retried as on a cluster). Skipped only when pyspark is not installed.
"""

from __future__ import annotations

import math
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from queue_pg import Client

pytestmark = pytest.mark.spark


def test_import_queue_pg_does_not_import_spark() -> None:
    code = "import sys, queue_pg, queue_pg.ops.cli; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pyarrow', 'pandas', 'py4j', 'queue_pg.spark')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'queue-pg[spark]'")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from queue_pg.spark import enqueue  # noqa: E402

JDBC_JAR = "/usr/share/java/postgresql.jar"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("queue_pg tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.jars", JDBC_JAR)
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def jobs(client: Client) -> Client:
    client.create_queue("jobs")
    return client


def rows(spark: SparkSession, n: int, parts: int = 2) -> DataFrame:
    return spark.range(0, n, 1, parts).select(F.col("id"), F.concat(F.lit("r"), F.col("id")).alias("name"))


def message_ids(dsn: str) -> list[int]:
    """The row id in each message's body, in message order."""
    with psycopg.connect(dsn) as c:
        return [r[0] for r in c.execute("SELECT (body->>'id')::bigint FROM queue_pg.messages ORDER BY id")]


def test_every_row_becomes_one_message_with_its_body_and_attributes(
    spark: SparkSession, jobs: Client, clean: str
) -> None:
    df = rows(spark, 300).withColumn("kind", F.when(F.col("id") % 2 == 0, "even").otherwise("odd"))
    result = enqueue(df, "jobs", dsn=clean, body=F.struct("id", "name"),
                     attributes=F.create_map(F.lit("type"), F.col("kind")), chunk_rows=64)
    assert (result.rows_written, result.chunks_skipped, result.partitions_skipped) == (300, 0, 0)
    assert result.chunks_written == 6  # 150 rows a partition: chunks of 64, 64, 22
    with psycopg.connect(clean) as c:
        got = c.execute("SELECT body, attributes FROM queue_pg.messages ORDER BY (body->>'id')::int").fetchall()
    assert got == [({"id": i, "name": f"r{i}"}, {"type": "odd" if i % 2 else "even"}) for i in range(300)]
    # default body: the whole row; a JSON-text column is sent as it is; literal attributes
    jobs.purge("jobs")
    enqueue(rows(spark, 3, 1), "jobs", dsn=clean, attributes={"type": "t"})
    enqueue(spark.createDataFrame([('[1, {"a": null}]',)], "j string"), "jobs", dsn=clean, body="j", delay=60)
    with psycopg.connect(clean) as c:
        got = c.execute("SELECT body, attributes, visible_at > now() + interval '50 s' FROM queue_pg.messages ORDER BY id").fetchall()
    assert got == [({"id": i, "name": f"r{i}"}, {"type": "t"}, False) for i in range(3)] + [([1, {"a": None}], None, True)]


def test_a_job_run_again_with_the_same_write_id_sends_nothing_twice(
    spark: SparkSession, jobs: Client, clean: str
) -> None:
    df = rows(spark, 500)
    first = enqueue(df, "jobs", dsn=clean, write_id="daily-2025-05-01", chunk_rows=100)
    again = enqueue(df, "jobs", dsn=clean, write_id="daily-2025-05-01", chunk_rows=100)
    assert (first.rows_written, first.chunks_written) == (500, 6)
    assert (again.rows_written, again.chunks_skipped, again.partitions_skipped) == (0, 6, 2)
    assert sorted(message_ids(clean)) == list(range(500))
    other = enqueue(df, "jobs", dsn=clean, write_id="daily-2025-05-02", chunk_rows=100)
    assert other.rows_written == 500


@pytest.fixture
def fail_once(clean: str) -> Iterator[None]:
    """The first insert of row 850's message fails (a sequence counts: it survives the rollback)."""
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("""
            CREATE SEQUENCE public.fail_once;
            CREATE FUNCTION public.fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.body->>'id' = '850' AND nextval('public.fail_once') = 1 THEN
                    RAISE EXCEPTION 'injected failure while writing row 850';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER fail_once BEFORE INSERT ON queue_pg.messages
            FOR EACH ROW EXECUTE FUNCTION public.fail_once();
        """)
    yield
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("DROP TRIGGER fail_once ON queue_pg.messages; DROP FUNCTION public.fail_once();"
                  " DROP SEQUENCE public.fail_once")


def test_a_task_that_fails_midway_is_retried_and_each_row_is_sent_once(
    spark: SparkSession, jobs: Client, clean: str, fail_once: None
) -> None:
    """Partition 1 (rows 500-999) fails in its chunk of rows 800-899 on the first attempt,
    after its first three chunks committed; the retry skips those and sends the rest."""
    result = enqueue(rows(spark, 1000), "jobs", dsn=clean, write_id="retry", chunk_rows=100)
    with psycopg.connect(clean) as c:
        assert c.execute("SELECT last_value FROM public.fail_once").fetchone() == (2,)
    assert (result.rows_written, result.chunks_written, result.chunks_skipped) == (700, 7, 3)
    assert sorted(message_ids(clean)) == list(range(1000))


def test_dedup_ids_through_a_retried_task_and_a_second_write(
    spark: SparkSession, jobs: Client, clean: str, fail_once: None
) -> None:
    """Each row's dedup id goes with it: a task retried after a failure sends each row once, and
    the same rows under another write_id (a new write, inside the dedup window) send nothing."""
    # the last 50 rows of each partition (0-499, 500-999) repeat the keys of its first 50
    key = F.when(F.col("id") % 500 >= 450, F.col("id") - 450).otherwise(F.col("id"))
    df = rows(spark, 1000).withColumn("key", F.concat(F.lit("order-"), key.cast("string")))
    sent = [i for i in range(1000) if i % 500 < 450]
    first = enqueue(df, "jobs", dsn=clean, write_id="dedup-1", chunk_rows=100, dedup_id="key")
    with psycopg.connect(clean) as c:
        assert c.execute("SELECT last_value FROM public.fail_once").fetchone() == (2,)
    # partition 1's retry skips the 3 chunks its first attempt committed (300 rows)
    assert (first.rows_written, first.chunks_written, first.chunks_skipped) == (900 - 300, 7, 3)
    assert sorted(message_ids(clean)) == sent
    again = enqueue(df, "jobs", dsn=clean, write_id="dedup-2", chunk_rows=100, dedup_id=F.col("key"))
    assert (again.rows_written, again.chunks_written) == (0, 10)  # every id within the window
    assert sorted(message_ids(clean)) == sent


def test_groups_through_the_sink_reach_a_fifo_queue_in_row_order(
    spark: SparkSession, client: Client, clean: str
) -> None:
    client.create_queue("ordered", fifo=True)
    df = rows(spark, 400, parts=2).withColumn("tenant", (F.col("id") % 3).cast("string"))
    result = enqueue(df, "ordered", dsn=clean, group="tenant", chunk_rows=64)
    assert result.rows_written == 400
    with psycopg.connect(clean) as c:
        got = c.execute("SELECT group_id, array_agg((body->>'id')::int ORDER BY id),"
                        " count(*) FILTER (WHERE visible_at < 'infinity')"
                        " FROM queue_pg.messages GROUP BY 1 ORDER BY 1").fetchall()
    assert [g for g, _, _ in got] == ["0", "1", "2"]
    for _, ids, heads in got:
        assert heads == 1
        # within a partition, a group's messages are in row order (partitions run side by side)
        for lo, hi in ((0, 200), (200, 400)):
            part = [i for i in ids if lo <= i < hi]
            assert part == sorted(part)
    assert sorted(i for _, ids, _ in got for i in ids) == list(range(400))


def test_concurrent_duplicate_attempts_send_each_row_once(
    spark: SparkSession, jobs: Client, clean: str
) -> None:
    """What a speculative copy does to the database: a second attempt of every task of one
    write, at the same time. Spark launches speculative copies only on a cluster (local mode
    starts no speculation thread), so two jobs of one write_id run at once here."""
    df = rows(spark, 2000, parts=4)
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(
            enqueue(df, "jobs", dsn=clean, write_id="twice", chunk_rows=100)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sum(r.rows_written for r in results) == 2000
    assert sum(r.chunks_written for r in results) == 20
    assert sorted(message_ids(clean)) == list(range(2000))


def test_the_data_source_writes_once_per_write_id(spark: SparkSession, jobs: Client, clean: str) -> None:
    from queue_pg.spark.source import register

    register(spark)
    df = rows(spark, 200).select(F.to_json(F.struct("id", "name")).alias("body"),
                                 F.lit('{"type": "t"}').alias("attributes"))
    for _ in range(2):
        (df.write.format("queue_pg").mode("append").option("dsn", clean).option("queue", "jobs")
         .option("write_id", "ds").option("chunk_rows", 30).save())
    assert sorted(message_ids(clean)) == list(range(200))
    # dedup_id and group columns: a new write of the same ids sends nothing
    keyed = df.withColumn("dedup_id", F.get_json_object("body", "$.id")).withColumn("group", F.lit("g"))
    for write_id in ("ds-keyed-1", "ds-keyed-2"):
        (keyed.write.format("queue_pg").mode("append").option("dsn", clean).option("queue", "jobs")
         .option("write_id", write_id).save())
    with psycopg.connect(clean) as c:
        assert c.execute("SELECT count(*), count(DISTINCT body) FROM queue_pg.messages WHERE group_id = 'g'"
                         ).fetchone() == (200, 200)
    with pytest.raises(Exception, match="allowed 'append'"):
        df.write.format("queue_pg").mode("overwrite").option("dsn", clean).option("queue", "jobs").save()


# --- history and the advisor ----------------------------------------------------------------------

NOW = datetime.now(timezone.utc).replace(microsecond=0)
T = NOW - timedelta(hours=1)


def percentile_cont(values: list[float], f: float) -> float:
    """PostgreSQL's percentile_cont: linear interpolation between the closest ranks."""
    v = sorted(values)
    pos = f * (len(v) - 1)
    lo = math.floor(pos)
    return v[lo] + (pos - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo])


def history_row(queue: str, type_: str | None, outcome: str, processing: float | None, *,
                waiting: float | None = 0.5, receives: int = 1, expiries: int = 0,
                finished: datetime = T) -> tuple[Any, ...]:
    """A history row finished at ``finished`` whose final lease took ``processing`` seconds."""
    last = None if processing is None else finished - timedelta(seconds=processing)
    first = None if waiting is None else (last or finished) - timedelta(seconds=1)
    enqueued = (first or finished) - timedelta(seconds=waiting or 0)
    return (queue, outcome, enqueued, first, last, finished, receives, expiries, type_)


KNOWN = (
    [history_row("mixed", "a", "deleted", float(i)) for i in range(1, 101)]
    + [history_row("mixed", "b", "deleted", 100 * i + 0.3) for i in range(1, 51)]
    + [history_row("mixed", None, "deleted", 3.0) for _ in range(5)]
    + [history_row("mixed", None, "dead_lettered", 7.0, receives=3, expiries=2) for _ in range(2)]
    + [history_row("mixed", "a", "deleted", 1e6, finished=T - timedelta(hours=5))]  # outside
    + [history_row("lapsing", "x", "deleted", 2.0, receives=2, expiries=1) for _ in range(40)]
    + [history_row("idle", None, "expired", None, waiting=None, receives=0) for _ in range(3)]
)


@pytest.fixture
def known_history(client: Client, clean: str) -> str:
    client.create_queue("mixed", visibility_timeout=30)
    client.create_queue("lapsing", visibility_timeout=30, max_lease=50)
    client.create_queue("idle", visibility_timeout=45)
    with psycopg.connect(clean) as c, c.cursor() as cur:
        cur.executemany(
            "INSERT INTO queue_pg.message_history (queue_id, queue, message_id, outcome, enqueued_at,"
            " first_received_at, last_received_at, finished_at, receive_count, lease_expiries, type)"
            " SELECT q.id, q.name, %s, %s, %s, %s, %s, %s, %s, %s, %s FROM queue_pg.queues q WHERE q.name = %s",
            [(i, *r[1:], r[0]) for i, r in enumerate(KNOWN)],
        )
    return clean


def test_the_history_window_and_queues_reach_postgresql(
    spark: SparkSession, known_history: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from queue_pg.spark import read_history, read_queue_stats

    df = read_history(spark, dsn=known_history, queues=["mixed"], since=T - timedelta(hours=1),
                      until=T + timedelta(hours=1), partitions=3)
    assert df.rdd.getNumPartitions() == 3
    assert df.count() == 157
    df.explain("formatted")
    plan = capsys.readouterr().out
    pushed = next(line for line in plan.splitlines() if "PushedFilters" in line)
    assert "GreaterThanOrEqual(finished_at" in pushed and "LessThan(finished_at" in pushed
    assert "In(queue, [mixed])" in pushed or "EqualTo(queue,mixed)" in pushed
    stats = {r["queue"]: r for r in read_queue_stats(spark, dsn=known_history).collect()}
    assert set(stats) == {"mixed", "lapsing", "idle"}


def test_the_advisor_gives_the_known_answer(spark: SparkSession, known_history: str) -> None:
    from queue_pg.spark import advise

    got = advise(spark, dsn=known_history, since=T - timedelta(hours=1), until=T + timedelta(hours=1))
    rows = {(r["queue"], r["scope"], r["type"]): r.asDict() for r in got.advice.collect()}
    assert sorted(rows, key=str) == sorted([
        ("mixed", "queue", None), ("mixed", "type", "a"), ("mixed", "type", "b"), ("mixed", "type", None),
        ("lapsing", "queue", None), ("lapsing", "type", "x"), ("idle", "queue", None), ("idle", "type", None),
    ], key=str)

    a = rows[("mixed", "type", "a")]
    assert (a["messages"], a["samples"], a["confidence"]) == (100, 100, "medium")
    assert a["p50"] == pytest.approx(50.5) and a["p99"] == pytest.approx(99.01) and a["max"] == 100
    assert a["wait_p50"] == pytest.approx(0.5)
    assert a["recommended_timeout"] == 595  # ceil(6 * 99.01)
    assert a["heartbeat_interval"] == pytest.approx(595 / 3)
    b = rows[("mixed", "type", "b")]
    assert b["p99"] == pytest.approx(4951.3) and b["recommended_timeout"] == 29708
    untyped = rows[("mixed", "type", None)]
    assert (untyped["samples"], untyped["messages"], untyped["confidence"]) == (5, 7, "low")
    # 4 of 11 receives lapsed and the current 30 s >= 6 x p99 = 18: twice the current
    assert untyped["expiry_rate"] == pytest.approx(4 / 11) and untyped["recommended_timeout"] == 60
    assert untyped["dead_letter_rate"] == pytest.approx(2 / 7)

    mixed = rows[("mixed", "queue", None)]
    samples = [float(i) for i in range(1, 101)] + [100 * i + 0.3 for i in range(1, 51)] + [3.0] * 5
    assert (mixed["messages"], mixed["samples"]) == (157, 155)
    for f, col in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
        assert mixed[col] == pytest.approx(percentile_cont(samples, f), rel=1e-12)
    # leases lapsed in 4 of 161 receives (> 1%), but the current 30 s is under 6 x p99: that stands
    assert mixed["expiry_rate"] == pytest.approx(4 / 161)
    assert mixed["recommended_timeout"] == math.ceil(6 * percentile_cont(samples, 0.99))
    assert (mixed["redeliveries"], mixed["dead_letter_rate"]) == (4, pytest.approx(2 / 157))
    assert mixed["confidence"] == "medium"
    assert mixed["split_advised"] is True
    assert mixed["spread_ratio"] == pytest.approx(4951.3 / 99.01)

    # half the receives lapsed and the current 30 s >= 6 x p99 = 12: twice the current, capped
    # by max_lease = 50
    lapsing = rows[("lapsing", "queue", None)]
    assert (lapsing["expiry_rate"], lapsing["recommended_timeout"]) == (0.5, 50)
    assert lapsing["heartbeat_interval"] == pytest.approx(50 / 3)
    assert (lapsing["split_advised"], lapsing["spread_ratio"]) == (False, None)  # one type

    idle = rows[("idle", "queue", None)]
    assert (idle["samples"], idle["recommended_timeout"], idle["confidence"]) == (0, None, "none")
    assert (idle["expiry_rate"], idle["dead_letter_rate"], idle["split_advised"]) == (None, 0.0, False)

    counts = {(r["queue"], r["receive_count"]): r["messages"] for r in got.receive_counts.collect()}
    assert counts == {("mixed", 1): 155, ("mixed", 3): 2, ("lapsing", 2): 40, ("idle", 0): 3}


@pytest.mark.parametrize(("rolled", "weighted"), [(False, False), (True, False), (False, True), (True, True)],
                         ids=["rows", "rollups", "weighted-rows", "weighted-rollups"])
def test_the_spark_advisor_agrees_with_the_sql_advice(
    spark: SparkSession, known_history: str, rolled: bool, weighted: bool
) -> None:
    """One definition, two engines: queue_pg.timeout_advice(since, until) in PostgreSQL and the
    PySpark advisor give the same figures on the same history: exactly when SQL reads the
    history rows, and within the histogram's 1% (percentiles, and the timeouts drawn from
    them) once sweep has rolled the history up by minute. Weighted: rows of a sampled history
    (each standing for `weight` messages) count weight times in both."""
    from queue_pg.spark import advise

    if weighted:
        with psycopg.connect(known_history, autocommit=True) as c:
            c.execute("UPDATE queue_pg.message_history SET weight = 1 + message_id % 7")
    since, until = T - timedelta(hours=1), T + timedelta(hours=1)
    got = advise(spark, dsn=known_history, since=since, until=until)
    theirs = {(r["queue"], r["scope"], r["type"]): r.asDict() for r in got.advice.collect()}
    with psycopg.connect(known_history, autocommit=True) as c:
        if rolled:
            while c.execute("SELECT queue_pg._rollup_history(clock_timestamp(), 100000)").fetchone()[0]:  # type: ignore[index]
                pass
            # every history row is in a rolled-up minute: the advice reads rollups only
            assert c.execute("SELECT sum(messages) FROM queue_pg.history_rollups WHERE minutes = 1").fetchone() == c.execute(
                "SELECT sum(weight) FROM queue_pg.message_history").fetchone()
        cur = c.execute("SELECT * FROM queue_pg.timeout_advice(%s, %s)", [since, until])
        names = [d.name for d in cur.description or ()]
        ours = {(r["queue"], r["scope"], r["type"]): r
                for r in (dict(zip(names, row, strict=True)) for row in cur.fetchall())}
    assert set(ours) == set(theirs)
    # rollups: a percentile within 1%, a timeout ceil(6 x p99) within 1% and one rounding up
    quantile = 0.01 if rolled else 1e-9
    exact = ("samples", "redeliveries", "confidence", "split_advised") + (
        () if rolled else ("recommended_timeout",))
    close = ("p50", "p95", "p99", "heartbeat_interval")
    for key, sql_row in ours.items():
        spark_row = theirs[key]
        for col in exact:
            assert sql_row[col] == spark_row[col], (key, col)
        for col in ("max", "expiry_rate", "dead_letter_rate"):  # exact either way
            if sql_row[col] is None:
                assert spark_row[col] is None, (key, col)
            else:
                assert sql_row[col] == pytest.approx(spark_row[col], rel=1e-9), (key, col)
        for col in close:
            if sql_row[col] is None:
                assert spark_row[col] is None, (key, col)
            else:
                assert spark_row[col] == pytest.approx(sql_row[col], rel=quantile, abs=1 if rolled and col == "heartbeat_interval" else 0), (key, col)
        if rolled and sql_row["recommended_timeout"] is not None:
            assert abs(sql_row["recommended_timeout"] - spark_row["recommended_timeout"]) <= 0.01 * spark_row["recommended_timeout"] + 1, key
        assert (sql_row["p99_spread"] is None) == (spark_row["spread_ratio"] is None), key
        if sql_row["p99_spread"] is not None:
            assert spark_row["spread_ratio"] == pytest.approx(sql_row["p99_spread"], rel=2.1 * quantile)


def test_the_advise_command_writes_its_files_and_applies(
    spark: SparkSession, known_history: str, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from queue_pg.ops.cli import main

    out = tmp_path / "advice"
    result = CliRunner().invoke(main, ["--dsn", known_history, "spark", "advise", "--since", "3h",
                                       "--output", str(out), "--apply"])
    assert result.exit_code == 0, result.output
    assert "lapsing: visibility_timeout 30 -> 50" in result.output
    for name in ("advice", "receive_counts", "quantiles"):
        assert list((out / f"{name}.parquet").glob("*.parquet")), name
    assert spark.read.parquet(str(out / "advice.parquet")).count() == 8
    summary = (out / "summary.md").read_text()
    assert "## mixed" in summary and "Split advised" in summary
    assert (out / "processing_times.png").read_bytes()[:4] == b"\x89PNG"
    with Client(known_history, sweep_interval=None) as c:
        assert c.get_queue("lapsing").visibility_timeout == 50
        assert c.get_queue("idle").visibility_timeout == 45  # no samples: no advice
