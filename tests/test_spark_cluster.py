"""The sink on a real Spark standalone cluster (``--master spark://``) with real speculation.

Local mode never launches speculative copies (it has no speculation thread), so this module
starts a master and two one-core workers from the pip pyspark package (``$SPARK_HOME`` is its
folder), one worker on 127.0.0.1 and one on 127.0.0.2: Spark launches a speculative copy only on
a host where the task is not running already, and every 127/8 address is this machine.
Skipped only where Java or pyspark is missing; a cluster that does not come up fails the test
with its log.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from queue_pg import Client

pytestmark = pytest.mark.spark

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed: pip install 'queue-pg[spark]'")
if shutil.which("java") is None:
    pytest.skip("java is not on PATH: Spark needs Java 17 or 21", allow_module_level=True)

SPARK_HOME = Path(pyspark.__file__).parent
REPO = Path(__file__).resolve().parent.parent
APP = REPO / "tests" / "spark_apps" / "speculation.py"


#: short-lived JVMs start faster with the client compiler only and a serial collector
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",  # the master's and workers' own heaps
        SPARK_DAEMON_JAVA_OPTS=FAST_JVM,
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p),
    )
    return env


@dataclass
class Cluster:
    url: str
    logs: list[Path]

    def tail(self) -> str:
        return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-25:])
                         for p in self.logs if p.exists())


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A standalone master and two workers (1 core, 512 MB each), stopped with all they started."""
    root = tmp_path_factory.mktemp("spark_cluster")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    env = _env()
    env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
    commands = {
        "master": [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                   "--port", str(port), "--webui-port", str(_free_port())],
    }
    for i, host in enumerate(("127.0.0.1", "127.0.0.2")):
        commands[f"worker{i}"] = [
            spark_class, "org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "1",
            "--memory", "512m", "--webui-port", str(_free_port()), "--work-dir", str(root / f"work{i}"), url,
        ]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = [root / f"{name}.log" for name in commands]
    c = Cluster(url, logs)
    try:
        for (name, cmd), log in zip(commands.items(), logs, strict=True):
            # a session of its own: the process group holds the JVM and the executors it starts
            with log.open("wb") as out:
                procs[name] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True)
        for (name, proc), log in zip(procs.items(), logs, strict=False):
            expect = "I have been elected leader" if name == "master" else "Successfully registered with master"
            if not _wait_for(log, expect, proc, 90):
                pytest.fail(f"the Spark {name} did not come up:\n{c.tail()}")
        yield c
    finally:
        for proc in reversed(procs.values()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def _events(folder: Path) -> list[dict[str, object]]:
    return [json.loads(line) for f in folder.iterdir() if f.is_file() for line in f.read_text().splitlines()]


def test_a_speculative_copy_on_a_cluster_sends_each_row_once(
    cluster: Cluster, client: Client, clean: str, tmp_path: Path
) -> None:
    """Partition 1's first attempt commits its first chunk, then stalls; Spark launches a
    speculative copy on the other host, which skips that chunk, sends the rest and wins; the
    first is killed. Every row is one message."""
    client.create_queue("speculated")
    marks, events = tmp_path / "marks", tmp_path / "events"
    marks.mkdir()
    events.mkdir()
    conf = {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.memory": "512m",
        "spark.executor.memory": "512m",
        "spark.executorEnv.PYTHONPATH": str(REPO),
        "spark.executor.extraJavaOptions": FAST_JVM,
        "spark.pyspark.python": sys.executable,
        "spark.sql.execution.arrow.maxRecordsPerBatch": "100",
        "spark.speculation": "true",
        "spark.speculation.interval": "100ms",
        "spark.speculation.quantile": "0.5",  # after 1 of the 2 tasks finished
        "spark.speculation.multiplier": "1.2",
        "spark.speculation.minTaskRuntime": "500ms",
        "spark.speculation.efficiency.enabled": "false",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": str(events),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }
    cmd = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.url, "--driver-java-options", FAST_JVM]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    cmd += [str(APP), clean, "speculated", "spec-1", "3000", "500", str(marks)]
    run = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{run.stderr[-4000:]}\n{cluster.tail()}"
    result = json.loads(run.stdout.strip().splitlines()[-1])

    # Spark's own record: partition 1 had a speculative attempt, and it is the one that succeeded
    tasks = [e for e in _events(events) if e["Event"] in ("SparkListenerTaskStart", "SparkListenerTaskEnd")]
    info = [(e["Event"], e["Task Info"]["Index"], e["Task Info"]["Attempt"], e["Task Info"]["Speculative"],  # type: ignore[index]
             e["Task Info"]["Host"]) for e in tasks]  # type: ignore[index]
    started = {(i, a): (spec, host) for ev, i, a, spec, host in info if ev == "SparkListenerTaskStart"}
    assert started[(1, 1)][0] is True, info
    assert started[(1, 0)][0] is False and started[(1, 0)][1] != started[(1, 1)][1], info
    assert ("SparkListenerTaskEnd", 1, 1, True, started[(1, 1)][1]) in info

    # both attempts wrote: the first committed chunk 0 and stalled, the copy skipped chunk 0
    first = (marks / "part1-attempt0").read_text()
    assert "stalled after 1000 rows" in first and "chunk 0 committed" in first, first
    assert "done after 1500 rows" in (marks / "part1-attempt1").read_text()
    assert result["chunks_skipped"] == 1 and result["chunks_written"] == 5, result
    assert result["rows_written"] == 2500  # the winning attempts' sends; chunk 0 of part 1 was the first's

    with psycopg.connect(clean) as c:
        ids = [r[0] for r in c.execute("SELECT (body->>'id')::bigint FROM queue_pg.messages ORDER BY 1")]
        keys = c.execute("SELECT part, chunk, messages FROM queue_pg.bulk_writes WHERE write_id = 'spec-1'"
                         " ORDER BY 1, 2").fetchall()
    assert ids == list(range(3000))
    assert keys == [(p, ch, 500) for p in (0, 1) for ch in range(3)]
