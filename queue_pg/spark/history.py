"""The queues' history and statistics as DataFrames, read through Spark's JDBC source.

The PostgreSQL JDBC driver must be on Spark's classpath: ``session()`` adds the jar a user names
(or ``$QUEUE_PG_JDBC_JAR``, or Debian's ``libpostgresql-jdbc-java`` at
/usr/share/java/postgresql.jar); on a cluster, ``spark.jars.packages
org.postgresql:postgresql:<version>`` as usual.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from psycopg import conninfo
from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F

from queue_pg.dsn import libpq_dsn
from queue_pg.errors import QueueError

JDBC_DRIVER = "org.postgresql.Driver"
DEBIAN_JAR = Path("/usr/share/java/postgresql.jar")
JAR_ENV = "QUEUE_PG_JDBC_JAR"


class JdbcDriverMissing(QueueError, RuntimeError):
    """Spark has no PostgreSQL JDBC driver on its classpath."""


MISSING_DRIVER = (
    "Spark has no PostgreSQL JDBC driver (class org.postgresql.Driver): install Debian's"
    f" libpostgresql-jdbc-java ({DEBIAN_JAR}), or set ${JAR_ENV} to the driver's jar, or pass"
    " session(jar=...); on a cluster, spark.jars.packages org.postgresql:postgresql:<version>"
)


def load(reader: DataFrameReader) -> DataFrame:
    """``reader.load()``, with a missing JDBC driver said in one clear error (Spark's own is a
    Java stack trace about a class not found)."""
    try:
        return reader.load()
    except Exception as exc:
        if f"ClassNotFoundException: {JDBC_DRIVER}" in str(exc):
            raise JdbcDriverMissing(MISSING_DRIVER) from None
        raise


def jdbc_jar(path: str | os.PathLike[str] | None = None) -> str | None:
    """The driver jar to add: the one given, else $QUEUE_PG_JDBC_JAR, else Debian's if present."""
    if path is not None:
        return str(path)
    if os.environ.get(JAR_ENV):
        return os.environ[JAR_ENV]
    return str(DEBIAN_JAR) if DEBIAN_JAR.exists() else None


def session(
    master: str | None = None,
    *,
    jar: str | os.PathLike[str] | None = None,
    app_name: str = "queue_pg",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession (``master`` None: Spark's default, e.g. from spark-submit) with the JDBC
    driver added and ``conf`` set; the session time zone is UTC, so time windows read the same
    everywhere. In local mode Spark's Python workers run this interpreter (a virtualenv's
    python started by its path would otherwise leave them on the system's ``python3``, which
    lacks queue_pg), unless ``conf`` or $PYSPARK_PYTHON says otherwise."""
    builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    if master is not None:
        builder = builder.master(master)
    found = jdbc_jar(jar)
    if found is not None:
        builder = builder.config("spark.jars", found)
    conf = dict(conf or {})
    if _local(master or conf.get("spark.master")) and not os.environ.get("PYSPARK_PYTHON"):
        conf.setdefault("spark.pyspark.python", sys.executable)
        conf.setdefault("spark.pyspark.driver.python", sys.executable)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _local(master: str | None) -> bool:
    """Whether a session with this master runs its Python workers on this machine: a local
    master, or none outside spark-submit (which starts the gateway itself and names the master)."""
    if master is None:
        return "PYSPARK_GATEWAY_PORT" not in os.environ
    return master.startswith("local")


def jdbc_options(dsn: str) -> dict[str, str]:
    """Spark JDBC options (url, user, password, driver) for a libpq DSN."""
    params = conninfo.conninfo_to_dict(libpq_dsn(dsn))
    hosts = str(params.get("host") or "localhost").split(",")
    ports = str(params.get("port") or "5432").split(",")
    if any(h.startswith("/") for h in hosts):
        raise ValueError(f"host = {params.get('host')!r} is a Unix socket: JDBC needs a TCP host"
                         " (the embedded server listens on one after `queue-pg server start"
                         " --tcp`, which prints its TCP DSN)")
    ports = ports * len(hosts) if len(ports) == 1 else ports
    netloc = ",".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=True))
    options = {
        "url": f"jdbc:postgresql://{netloc}/{params.get('dbname') or params.get('user') or ''}",
        "driver": JDBC_DRIVER,
    }
    for key in ("user", "password"):
        if params.get(key):
            options[key] = str(params[key])
    if params.get("sslmode"):
        options["sslmode"] = str(params["sslmode"])
    return options


def window(since: datetime | timedelta | None, until: datetime | None) -> tuple[datetime, datetime]:
    """``[since, until)`` as aware datetimes: until defaults to now, since to a day before it;
    a timedelta since counts back from until."""
    end = until or datetime.now(timezone.utc)
    if end.tzinfo is None:
        raise ValueError("until is a naive datetime: allowed an aware one (with tzinfo)")
    if since is None:
        since = timedelta(days=1)
    start = end - since if isinstance(since, timedelta) else since
    if start.tzinfo is None:
        raise ValueError("since is a naive datetime: allowed an aware one (with tzinfo)")
    return start, end


def _spark_time(spark: SparkSession, at: datetime) -> str:
    """``at`` as Spark reads a timestamp bound: wall time in the session's time zone."""
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(str(spark.conf.get("spark.sql.session.timeZone")))
    return at.astimezone(zone).replace(tzinfo=None).isoformat(sep=" ")


def read_history(
    spark: SparkSession,
    *,
    dsn: str,
    queues: list[str] | None = None,
    since: datetime | timedelta | None = None,
    until: datetime | None = None,
    partitions: int | None = None,
) -> DataFrame:
    """``queue_pg.message_history`` rows finished in ``[since, until)`` (default: the last 24
    hours), of ``queues`` (default all), read in ``partitions`` parallel finished_at ranges
    (default: Spark's default parallelism). The window and the queue list reach PostgreSQL as
    the WHERE of every partition's query (see ``df.explain()``: PushedFilters)."""
    start, end = window(since, until)
    n = partitions or spark.sparkContext.defaultParallelism
    df = load(
        spark.read.format("jdbc")
        .options(**jdbc_options(dsn))
        .option("dbtable", "queue_pg.message_history")
        .option("partitionColumn", "finished_at")
        .option("lowerBound", _spark_time(spark, start))
        .option("upperBound", _spark_time(spark, end))
        .option("numPartitions", str(max(1, n)))
        .option("fetchsize", "10000")
    )
    cond: Column = (F.col("finished_at") >= F.lit(start)) & (F.col("finished_at") < F.lit(end))
    if queues is not None:
        cond = cond & F.col("queue").isin(list(queues))
    return df.where(cond)


def read_queue_stats(
    spark: SparkSession, *, dsn: str, queues: list[str] | None = None
) -> DataFrame:
    """The ``queue_pg.queue_stats`` view (one row per queue: depth, in flight, ages, counters)."""
    df = load(
        spark.read.format("jdbc")
        .options(**jdbc_options(dsn))
        .option("dbtable", "queue_pg.queue_stats")
    )
    return df if queues is None else df.where(F.col("queue").isin(list(queues)))


def read_queues(spark: SparkSession, *, dsn: str) -> DataFrame:
    """Each queue's settings (``queue_pg.list_queues()``: the queues the caller may see)."""
    options: dict[str, Any] = jdbc_options(dsn)
    return load(
        spark.read.format("jdbc")
        .options(**options)
        .option(
            "query",
            "SELECT name AS queue, visibility_timeout, max_lease FROM queue_pg.list_queues()",
        )
    )
