"""queue_pg.spark.session() in local mode: Spark's Python workers run this interpreter, and a
missing JDBC driver is one clear error (Spark tests are slow: marked spark)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
from pyspark.sql import SparkSession

from queue_pg.spark import history

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A session without the driver: a jar path that names no file."""
    nothing = tmp_path_factory.mktemp("jars") / "none.jar"
    session = history.session("local[1]", jar=nothing, conf={"spark.ui.enabled": "false"})
    yield session
    session.stop()


def test_workers_run_this_interpreter_and_a_missing_driver_says_what_to_install(
    spark: SparkSession, dsn: str
) -> None:
    assert spark.conf.get("spark.pyspark.python") == sys.executable
    assert Path(str(spark.conf.get("spark.pyspark.driver.python"))) == Path(sys.executable)
    # the workers import queue_pg: they run this interpreter, not the system's python3
    got = spark.sparkContext.parallelize([1], 1).map(
        lambda _: __import__("queue_pg").__name__).collect()
    assert got == ["queue_pg"]
    with pytest.raises(history.JdbcDriverMissing) as caught:
        history.read_queue_stats(spark, dsn=dsn)
    text = str(caught.value)
    assert "libpostgresql-jdbc-java" in text and "QUEUE_PG_JDBC_JAR" in text
