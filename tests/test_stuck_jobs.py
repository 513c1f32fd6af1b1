"""Hung work reported where an operator looks: a job running past twice its type's lease on a
'per_type' queue is logged once by the worker that runs it (WARNING), counted by the
Prometheus metric ``queue_pg_stuck_jobs`` and listed on the dashboard's Workers page; at the
hard limit (four times the lease) its heartbeat is refused, the worker logs an ERROR, fails the
attempt as the task's retries say, and the message is delivered again. Real workers (a thread,
an asyncio task) running a task that hangs, a hostile task name (it is the message's type)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from prometheus_client import generate_latest

import queue_pg
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.tasks import Registry
from queue_pg.jobs.worker import Worker
from queue_pg.ops.dashboard import Dashboard
from queue_pg.ops.metrics import registry
from tests.test_advice import add_history
from tests.test_dashboard import Http

Conn = psycopg.Connection[Any]

#: The task's name, so the messages' type: terminal escapes, a line break and a bidi override.
HOSTILE = "hang\x1b[2J\nERROR forged\u202e"
ESCAPED = "hang\\x1b[2J\\nERROR forged\\u202e"
LEASE = 3.0  #: the type's lease: 6 x p99 of 0.5 s runs
STUCK, STOP = 2 * LEASE, 4 * LEASE


def _queue(client: queue_pg.Client, conn: Conn) -> None:
    """A per_type queue whose type HOSTILE has a lease of 3 s: stuck after 6 s, stopped at 12."""
    client.create_queue("hw", visibility_timeout=30, max_lease=3600)
    add_history(conn, "hw", [0.5] * 40, type=HOSTILE)
    client.alter_tuning("hw", lease_policy="per_type")
    [limit] = client.hung_limits("hw")
    assert (limit.type, limit.type_lease, limit.stuck_after, limit.stopped_after) == (
        HOSTILE, LEASE, STUCK, STOP)


def _records(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]


def _wait(what: str, check: Callable[[], bool], seconds: float = 40) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _check_reports(client: queue_pg.Client, caplog: pytest.LogCaptureFixture, mid: int) -> None:
    """While the job hangs past its stuck point: the worker's WARNING (once, escaped), the
    metric and the dashboard's list."""
    _wait("the stuck warning", lambda: bool(_records(caplog, logging.WARNING, "is stuck")))
    [line] = _records(caplog, logging.WARNING, "is stuck")
    assert ESCAPED in line and "\x1b" not in line and "\n" not in line and "\u202e" not in line
    assert f"message {mid} of hw, attempt 1" in line
    assert f"past {STUCK:g}s" in line and f"lease of {LEASE:g}s" in line
    assert f"refused from {STOP:g}s" in line
    ran = float(line.split("it has run ")[1].split("s,")[0])
    assert STUCK <= ran < STOP
    # the metric: one stuck job of the queue and type (the label value is the type as stored)
    text = generate_latest(registry(client)).decode()
    [sample] = [x for x in text.splitlines() if x.startswith("queue_pg_stuck_jobs{")]
    assert 'queue="hw"' in sample and sample.endswith(" 1.0")
    # the type as plain text (its backslashes doubled by the exposition format's own escaping)
    assert ESCAPED.replace("\\", "\\\\") in sample
    assert "\x1b" not in text and "\u202e" not in text
    # the dashboard's Workers page reads api/stuck: the row, raw in JSON (shown as text)
    h = Http(Dashboard(client))
    try:
        status, rows, _ = h.call("api/stuck")
    finally:
        h.close()
    assert status == 200
    [row] = rows
    assert (row["queue"], row["id"], row["type"]) == ("hw", mid, HOSTILE)
    assert row["stuck_after"] == STUCK and row["stopped_after"] == STOP
    assert row["running_for"] >= STUCK and row["consumer"] is not None


def _check_end(client: queue_pg.Client, caplog: pytest.LogCaptureFixture, runs: list[int]) -> None:
    """At the hard limit: one ERROR (escaped), the attempt failed (retries=1: a second
    delivery, which finishes), the stuck warning still once."""
    _wait("the second attempt", lambda: runs == [1, 2])
    _wait("the queue to empty", lambda: client.stats("hw").in_flight == 0
          and client.stats("hw").visible == 0)
    [error] = _records(caplog, logging.ERROR, "heartbeat refused at the hard limit")
    assert ESCAPED in error and "\x1b" not in error and "\n" not in error
    assert "hung-work limit of type" in error and "delivered again" in error
    after = float(error.split("after ")[1].split("s:")[0])
    assert after >= STOP
    assert len(_records(caplog, logging.WARNING, "is stuck")) == 1


def test_a_sync_worker_reports_a_hung_task_and_fails_it_at_the_hard_limit(
    client: queue_pg.Client, conn: Conn, clean: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "queue_pg")
    _queue(client, conn)
    reg = Registry()
    runs: list[int] = []
    hung = threading.Event()  # set at the end: the first run ignores everything until then

    @queue_pg.task(queue="hw", name=HOSTILE, retries=1, registry=reg)
    def hang() -> str:
        job = queue_pg.current_job()
        runs.append(job.receive_count)
        if job.receive_count == 1:
            hung.wait(60)  # hung: no return, no check of job.cancelled
        return "done"

    with queue_pg.Client(clean, sweep_interval=None) as wc:
        worker = Worker(wc, "hw", reg, concurrency=2, wait=0.2, visibility_timeout=LEASE,
                        backoff=Backoff(base=0.05, cap=0.05))
        t = threading.Thread(target=worker.run, kwargs={"signals": ()}, daemon=True)
        t.start()
        try:
            mid = hang.send(client=client)
            _check_reports(client, caplog, int(mid))
            _check_end(client, caplog, runs)
        finally:
            hung.set()
            worker.stop()
            t.join(10)
    # the hung run's late end is ignored: the attempt was failed at the limit
    assert _records(caplog, logging.WARNING, "ended") and runs == [1, 2]


def test_an_async_worker_reports_a_hung_task_and_fails_it_at_the_hard_limit(
    client: queue_pg.Client, conn: Conn, clean: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "queue_pg")
    _queue(client, conn)
    reg = Registry()
    runs: list[int] = []

    @queue_pg.task(queue="hw", name=HOSTILE, retries=1, registry=reg)
    async def hang() -> str:
        job = queue_pg.current_job()
        runs.append(job.receive_count)
        if job.receive_count == 1:
            await asyncio.sleep(60)  # hung (the worker cancels it at the hard limit)
        return "done"

    holder: dict[str, int] = {}

    async def main() -> None:
        async with queue_pg.AsyncClient(clean, sweep_interval=None) as ac:
            worker = queue_pg.AsyncWorker(ac, "hw", reg, concurrency=2, wait=0.2,
                                          visibility_timeout=LEASE,
                                          backoff=Backoff(base=0.05, cap=0.05))
            run = asyncio.create_task(worker.run(signals=()))
            try:
                holder["mid"] = int(await asyncio.to_thread(hang.send, client=client))
                await asyncio.to_thread(_check_reports, client, caplog, holder["mid"])
                await asyncio.to_thread(_check_end, client, caplog, runs)
            finally:
                worker.stop()
                await asyncio.wait_for(run, 10)

    asyncio.run(main())

