"""The timeout advisor on Spark: per queue and per message type, how long work takes and what
visibility timeout and heartbeat that asks for (the same definition as the SQL view
``queue_pg.timeout_advice``; docs/spark.md states it).

Rows: one per (queue, type) with ``scope = 'type'`` (a NULL type is a group of its own) and one
per queue over all types with ``scope = 'queue'`` and type NULL.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from queue_pg.spark.history import read_history, read_queues, window

#: Samples below which advice is weak: confidence 'low' under the first, 'medium' under the second.
CONFIDENCE_STEPS = (30, 300)
#: A group whose leases lapsed in more than this share of its receives ran past its timeout.
EXPIRY_RATE_LIMIT = 0.01
#: Types with at least this many samples take part in the split test.
SPLIT_MIN_SAMPLES = 30
#: p99 spread between a queue's slowest and fastest type from which they belong apart.
SPLIT_RATIO = 10
#: Quantiles of each queue's processing time that the chart draws.
CHART_QUANTILES = [i / 100 for i in range(1, 100)]

ADVICE_COLUMNS = [
    "queue",
    "scope",
    "type",
    "messages",
    "samples",
    "p50",
    "p95",
    "p99",
    "max",
    "wait_p50",
    "wait_p95",
    "wait_p99",
    "wait_max",
    "receives",
    "lease_expiries",
    "expiry_rate",
    "dead_lettered",
    "dead_letter_rate",
    "redeliveries",
    "visibility_timeout",
    "max_lease",
    "recommended_timeout",
    "heartbeat_interval",
    "confidence",
    "split_advised",
    "spread_ratio",
]


@dataclass(frozen=True)
class Advice:
    """The advisor's DataFrames for one window."""

    since: datetime
    until: datetime
    advice: DataFrame  #: ADVICE_COLUMNS, by queue, scope ('queue' first), type
    receive_counts: DataFrame  #: queue, receive_count, messages: how often messages were delivered
    quantiles: DataFrame  #: queue, quantiles (CHART_QUANTILES of the processing time, seconds)


def _seconds_between(later: str, earlier: str) -> Column:
    return (F.unix_micros(F.col(later)) - F.unix_micros(F.col(earlier))) / F.lit(1_000_000.0)


def timings(history: DataFrame) -> DataFrame:
    """History rows with ``processing`` (the final lease's work, deleted messages only) and
    ``waiting`` (enqueue to first receive) in seconds; NULL where the row has none. ``weight``:
    the finished messages the row stands for (a busy queue's history is a sample; 1 on a
    schema without the column)."""
    weight = F.col("weight") if "weight" in history.columns else F.lit(1)
    return history.select(
        "queue",
        "type",
        "outcome",
        "receive_count",
        "lease_expiries",
        weight.cast("long").alias("weight"),
        F.when(
            (F.col("outcome") == "deleted") & F.col("last_received_at").isNotNull(),
            _seconds_between("finished_at", "last_received_at"),
        ).alias("processing"),
        F.when(
            F.col("first_received_at").isNotNull(),
            _seconds_between("first_received_at", "enqueued_at"),
        ).alias("waiting"),
    )


#: The percentiles reported, as (fraction, column suffix).
PERCENTILES = ((0.5, "p50"), (0.95, "p95"), (0.99, "p99"))


def _figures() -> list[Column]:
    """The aggregates of a group, each row counted ``weight`` times (as the SQL figures do). One
    exact percentile aggregate per time column, with every fraction at once: each holds the
    group's distinct values in memory, so one is a third of three."""
    p, w, n = F.col("processing"), F.col("waiting"), F.col("weight")
    fractions = [f for f, _ in PERCENTILES]
    return [
        F.sum(n).alias("messages"),
        F.coalesce(F.sum(F.when(p.isNotNull(), n)), F.lit(0)).alias("samples"),
        F.percentile(p, fractions, n).alias("p"),
        F.max(p).alias("max"),
        F.percentile(w, fractions, n).alias("wait_p"),
        F.max(w).alias("wait_max"),
        F.sum(F.col("receive_count") * n).alias("receives"),
        F.sum(F.col("lease_expiries") * n).alias("lease_expiries"),
        F.coalesce(F.sum(F.when(F.col("outcome") == "dead_lettered", n)), F.lit(0)).alias(
            "dead_lettered"),
        F.sum(F.greatest(F.col("receive_count") - 1, F.lit(0)) * n).alias("redeliveries"),
    ]


def _percentile_columns(df: DataFrame) -> DataFrame:
    """The percentile arrays of _figures as one column each (NULL for a group without values)."""
    for i, (_, name) in enumerate(PERCENTILES):
        df = df.withColumn(name, F.col("p")[i]).withColumn(f"wait_{name}", F.col("wait_p")[i])
    return df.drop("p", "wait_p")


def advice_frame(t: DataFrame, queues: DataFrame) -> DataFrame:
    """The advice rows for ``t`` (``timings`` of the window's history) and ``queues`` (queue,
    visibility_timeout, max_lease)."""
    by_type = t.groupBy("queue", "type").agg(*_figures()).withColumn("scope", F.lit("type"))
    by_queue = (
        t.groupBy("queue")
        .agg(*_figures())
        .withColumn("type", F.lit(None).cast("string"))
        .withColumn("scope", F.lit("queue"))
    )
    groups = _percentile_columns(by_queue.unionByName(by_type)).join(queues, "queue", "left")

    expiry_rate = F.when(F.col("receives") > 0, F.col("lease_expiries") / F.col("receives"))
    base = F.least(
        F.col("max_lease"), F.greatest(F.lit(1.0), F.ceil(6 * F.col("p99")).cast("double"))
    )
    lapsed = (F.col("expiry_rate") > EXPIRY_RATE_LIMIT) & (
        F.col("visibility_timeout") >= F.col("base")
    )
    recommended = (
        F.when(F.col("samples") == 0, F.lit(None).cast("double"))
        .when(
            lapsed,
            F.least(F.col("max_lease"), F.ceil(2 * F.col("visibility_timeout")).cast("double")),
        )
        .otherwise(F.col("base"))
    )
    low, medium = CONFIDENCE_STEPS
    advice = (
        groups.withColumn("expiry_rate", expiry_rate)
        .withColumn("dead_letter_rate", F.col("dead_lettered") / F.col("messages"))
        .withColumn("base", base)
        .withColumn("recommended_timeout", recommended)
        .withColumn("heartbeat_interval", F.col("recommended_timeout") / 3)
        .withColumn(
            "confidence",
            F.when(F.col("samples") == 0, "none")
            .when(F.col("samples") < low, "low")
            .when(F.col("samples") < medium, "medium")
            .otherwise("high"),
        )
    )
    split = F.coalesce(F.col("split_advised"), F.lit(False)).alias("split_advised")
    columns = [split if c == "split_advised" else F.col(c) for c in ADVICE_COLUMNS]
    return advice.join(split_advice(advice), "queue", "left").select(*columns)


def split_advice(advice: DataFrame) -> DataFrame:
    """Per queue: whether its types belong in separate queues (at least two types with enough
    samples, the slowest p99 at least SPLIT_RATIO times the fastest) and that spread."""
    typed = advice.where((F.col("scope") == "type") & (F.col("samples") >= SPLIT_MIN_SAMPLES))
    spread = typed.groupBy("queue").agg(
        F.count(F.lit(1)).alias("types"), F.max("p99").alias("hi"), F.min("p99").alias("lo")
    )
    return spread.select(
        "queue",
        (
            (F.col("types") >= 2) & (F.col("hi") > 0) & (F.col("hi") >= SPLIT_RATIO * F.col("lo"))
        ).alias("split_advised"),
        F.when((F.col("types") >= 2) & (F.col("lo") > 0), F.col("hi") / F.col("lo")).alias(
            "spread_ratio"
        ),
    )


def advise(
    spark: SparkSession,
    *,
    dsn: str,
    since: datetime | timedelta | None = None,
    until: datetime | None = None,
    queues: list[str] | None = None,
    partitions: int | None = None,
) -> Advice:
    """The advice over the history finished in ``[since, until)`` (default: the last 24 hours)."""
    start, end = window(since, until)
    history = read_history(
        spark, dsn=dsn, queues=queues, since=start, until=end, partitions=partitions
    )
    t = timings(history).cache()
    advice = advice_frame(t, read_queues(spark, dsn=dsn))
    order = [F.col("queue"), F.col("scope").desc(), F.col("type").asc_nulls_first()]
    receive_counts = (
        t.groupBy("queue", "receive_count")
        .agg(F.sum("weight").alias("messages"))
        .orderBy("queue", "receive_count")
    )
    quantiles = (
        t.where(F.col("processing").isNotNull())
        .groupBy("queue")
        .agg(F.percentile("processing", CHART_QUANTILES, F.col("weight")).alias("quantiles"))
        .orderBy("queue")
    )
    return Advice(start, end, advice.orderBy(*order), receive_counts, quantiles)
