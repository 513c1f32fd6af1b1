"""queue_pg.spark.session() in local mode: Spark's Python workers run this interpreter, and a
missing JDBC driver is one clear error (Spark tests are slow: marked spark).

The check runs in a process of its own: a JVM keeps the classpath of the first session made in
it, so after another test's session (with the driver) no later session can lack the driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parent.parent

CHECK = r"""
import json, sys
from pathlib import Path
from queue_pg.spark import history

session = history.session("local[1]", jar=Path(sys.argv[1]) / "none.jar",
                          conf={"spark.ui.enabled": "false"})
try:
    got = session.sparkContext.parallelize([1], 1).map(
        lambda _: __import__("queue_pg").__name__).collect()
    try:
        history.read_queue_stats(session, dsn=sys.argv[2])
        missing = None
    except history.JdbcDriverMissing as exc:
        missing = str(exc)
    print(json.dumps({"python": session.conf.get("spark.pyspark.python"),
                      "driver_python": session.conf.get("spark.pyspark.driver.python"),
                      "workers": got, "missing": missing}))
finally:
    session.stop()
"""


def test_workers_run_this_interpreter_and_a_missing_driver_says_what_to_install(
    dsn: str, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("QUEUE_PG_JDBC_JAR", None)
    done = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path), dsn], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["python"] == sys.executable
    assert Path(out["driver_python"]) == Path(sys.executable)
    # the workers import queue_pg: they run this interpreter, not the system's python3
    assert out["workers"] == ["queue_pg"]
    assert out["missing"] is not None, "no JdbcDriverMissing without a driver jar"
    assert "libpostgresql-jdbc-java" in out["missing"] and "QUEUE_PG_JDBC_JAR" in out["missing"]
