"""Failed jobs are kept: a long reason is cut, not a cause to drop the message; a queue with no
dead-letter queue keeps its rejected messages; a task runs only from the queues it is declared
for. Both workers (threads and asyncio), a real server, real roles."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import queue_pg
from queue_pg.aio_worker import AsyncWorker
from queue_pg.backoff import Backoff
from queue_pg.tasks import Registry
from queue_pg.worker import Worker
from tests.test_access import PRODUCER, MakeRole, make_role  # noqa: F401
from tests.test_worker import wait_until

LONG = "é" * 1500  # 3,000 bytes of UTF-8, 1,500 characters


def run_worker(kind: str, dsn: str, queues: list[str], reg: Registry,
               until: Callable[[queue_pg.Client], bool], **options: Any) -> None:
    """Run a worker of ``kind`` ("sync" or "async") on its own client until ``until(client)``
    (checked with another client), then stop it; it is stopped even if the wait fails."""
    options.setdefault("wait", 0.2)
    options.setdefault("backoff", Backoff(base=0.05, cap=0.05))
    with queue_pg.Client(dsn, sweep_interval=None) as check:
        if kind == "sync":
            with queue_pg.Client(dsn, sweep_interval=None) as c:
                worker = Worker(c, queues, reg, concurrency=2, **options)
                t = threading.Thread(target=worker.run, daemon=True)
                t.start()
                try:
                    wait_until("the worker's outcome", lambda: until(check))
                finally:
                    worker.stop()
                    t.join(10)
            return

        async def main() -> None:
            async with queue_pg.AsyncClient(dsn, sweep_interval=None) as c:
                worker = AsyncWorker(c, queues, reg, concurrency=2, **options)
                run = asyncio.create_task(worker.run())
                try:
                    deadline = time.monotonic() + 30
                    while not await asyncio.to_thread(until, check):
                        assert time.monotonic() < deadline, "timed out waiting for the worker"
                        await asyncio.sleep(0.05)
                finally:
                    worker.stop()
                    await asyncio.wait_for(run, 10)

        asyncio.run(main())


def dead_letters(client: queue_pg.Client, dlq: str) -> list[queue_pg.Message]:
    return client.peek(dlq, 10)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_long_failure_reason_is_cut_and_the_job_dead_lettered(
    client: queue_pg.Client, clean: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "queue_pg.worker")
    reg = Registry()

    @queue_pg.task(queue="mail", name="loud", retries=0, registry=reg)
    def loud() -> None:
        raise RuntimeError(LONG)

    client.create_queue("mail-dlq")
    client.create_queue("mail", dead_letter_queue="mail-dlq", max_receive_count=5)
    mid = loud.send(client=client)
    run_worker(kind, clean, ["mail"], reg, lambda c: bool(dead_letters(c, "mail-dlq")))
    (m,) = dead_letters(client, "mail-dlq")
    assert m.id == mid
    reason = m.attributes["dead_letter_reason"]
    assert len(reason.encode()) <= 1024
    assert reason.startswith("failed 1 times (retries = 0), last: RuntimeError: éé")
    assert reason.endswith(f"… [truncated, {len(('failed 1 times (retries = 0), last: RuntimeError: ' + LONG).encode())} bytes]")
    assert "DELETED" not in caplog.text and "KEPT" not in caplog.text


def test_sql_cuts_a_reason_on_a_character_boundary(sql: Any) -> None:
    sql("SELECT queue_pg.create_queue('dlq')")
    sql("SELECT queue_pg.create_queue('jobs', dead_letter_queue => 'dlq', max_receive_count => 5)")
    for text in ("a" * 1024, "a" + "€" * 700, "😀" * 600):
        sql("SELECT queue_pg.send('jobs', '1')")
        [(r,)] = sql("SELECT receipt FROM queue_pg.receive('jobs')")
        assert sql("SELECT queue_pg.dead_letter('jobs', %s, %s)", r, text) == [(True,)]
        [(kept,)] = sql("SELECT attributes->>'dead_letter_reason' FROM queue_pg.messages"
                        " ORDER BY id DESC LIMIT 1")
        n = len(text.encode())
        if n <= 1024:
            assert kept == text
        else:
            assert len(kept.encode()) <= 1024
            assert kept.endswith(f"… [truncated, {n} bytes]")
            assert text.startswith(kept[: -len(f"… [truncated, {n} bytes]")])


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_rejected_job_of_a_queue_without_dead_letter_queue_is_kept(
    client: queue_pg.Client, clean: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "queue_pg.worker")
    reg = Registry()

    @queue_pg.task(queue="bare", name="boom", retries=0, registry=reg)
    def boom() -> None:
        raise RuntimeError("no\x00pe " + LONG)

    client.create_queue("bare")
    mid = boom.send(client=client)
    run_worker(kind, clean, ["bare"], reg, lambda c: "KEPT" in caplog.text,
               backoff=Backoff(base=30, jitter=0))
    with psycopg.connect(clean) as c:  # still in its queue, coming back after the backoff
        rows = c.execute("SELECT m.id, m.attributes, m.visible_at > now() + interval '20 s'"
                         " FROM queue_pg.messages m JOIN queue_pg.queues q ON q.id = m.queue_id"
                         " WHERE q.name = 'bare'").fetchall()
    assert [(i, later) for i, _, later in rows] == [(mid, True)]
    assert rows[0][1]["error"]["message"].startswith("no\\x00pe")
    (line,) = [r for r in caplog.records if "KEPT" in r.getMessage()]
    assert "has no dead_letter_queue" in line.getMessage() and "queue-pg alter bare" in line.getMessage()
    assert line.exc_info is not None  # the traceback, once, at the end
    assert "DELETED" not in caplog.text


@pytest.fixture
def emails_and_admin(client: queue_pg.Client, make_role: MakeRole) -> Iterator[Any]:  # noqa: F811
    client.create_queue("emails-dlq")
    client.create_queue("emails", dead_letter_queue="emails-dlq", max_receive_count=5)
    client.create_queue("admin-jobs")
    producer = make_role("mailer", PRODUCER)
    client.grant("emails", producer.name, "send")
    yield producer


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_task_never_runs_from_a_queue_it_is_not_declared_for(
    client: queue_pg.Client, clean: str, kind: str, emails_and_admin: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer with a send grant on ``emails`` only names an ``admin-jobs`` task in a
    message to ``emails``: a worker serving both queues dead-letters it, never runs it."""
    caplog.set_level(logging.WARNING, "queue_pg.worker")
    reg = Registry()
    ran: list[str] = []

    @queue_pg.task(queue="admin-jobs", name="wipe_tenant", registry=reg)
    def wipe_tenant(tenant: str) -> None:
        ran.append(tenant)

    @queue_pg.task(queue="emails", name="send_mail", registry=reg)
    def send_mail(to: str) -> None:
        ran.append(f"mail {to}")

    with emails_and_admin.client() as hostile:
        with pytest.raises(queue_pg.AccessDenied):
            hostile.send("admin-jobs", {"task": "wipe_tenant", "args": ["acme"]})
        forged = hostile.send("emails", {"task": "wipe_tenant", "args": ["acme"], "kwargs": {}},
                              attributes={"type": "wipe_tenant"})
        send_mail.send(["bob"], client=hostile)
    run_worker(kind, clean, ["emails", "admin-jobs"], reg,
               lambda c: bool(dead_letters(c, "emails-dlq")) and "mail bob" in ran)
    assert ran == ["mail bob"]
    (m,) = dead_letters(client, "emails-dlq")
    assert m.id == forged
    assert m.attributes["dead_letter_reason"] == (
        "task 'wipe_tenant' runs from queue 'admin-jobs' only, not from queue 'emails':"
        " whoever sent it there may not start it")
