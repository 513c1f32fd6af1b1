"""Failed jobs are kept: a long reason is cut, not a cause to drop the message; a queue with no
dead-letter queue keeps its rejected messages; a task runs only from the queues it is declared
for. Both workers (threads and asyncio), a real server, real roles."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import queue_pg
from queue_pg.jobs.aio_worker import AsyncWorker
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.job import TaskTimeout
from queue_pg.jobs.tasks import Registry
from queue_pg.jobs.worker import Worker
from tests.test_access import CONSUMER, PRODUCER, MakeRole, make_role  # noqa: F401
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
                worker = Worker(c, queues, reg, **{"concurrency": 2, **options})
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
                worker = AsyncWorker(c, queues, reg, **{"concurrency": 2, **options})
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


# --- retries by default, a dead-letter queue by default, failed jobs listed and retried -------


def test_a_task_retries_3_times_by_default_logging_the_traceback_once(
    client: queue_pg.Client, clean: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "queue_pg.worker")
    reg = Registry()
    attempts: list[int] = []

    @queue_pg.task(queue="r", name="always", create=True, registry=reg, bind=True)
    def always(job: queue_pg.Job) -> None:
        attempts.append(job.receive_count)
        raise ValueError("still broken")

    assert always.retries == 3
    always.send(client=client)  # creates r, with its dead-letter queue r-dlq
    assert client.get_queue("r").dead_letter_queue == "r-dlq"
    run_worker("sync", clean, ["r"], reg, lambda c: bool(dead_letters(c, "r-dlq")))
    assert attempts == [1, 2, 3, 4]
    retries = [r for r in caplog.records if "retry in" in r.getMessage()]
    assert len(retries) == 3 and all(r.exc_info is None for r in retries)
    (last,) = [r for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert "failed 4 times (retries = 3), last: ValueError: still broken" in last.getMessage()
    assert last.exc_info is not None


def test_a_bare_task_creates_the_default_queue_with_a_dead_letter_queue(
    client: queue_pg.Client,
) -> None:
    reg = Registry()

    @queue_pg.task(registry=reg)
    def bare() -> None: ...

    bare.send(client=client)
    assert client.get_queue("default").dead_letter_queue == "default-dlq"
    assert client.stats("default").visible == 1


def test_failed_jobs_are_listed_retried_and_purged_from_the_command_line(
    client: queue_pg.Client, clean: str
) -> None:
    from click.testing import CliRunner

    from queue_pg.ops import cli

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli.main, ["--dsn", clean, *args])
        assert result.exit_code == 0, result.output
        return result.output

    reg = Registry()

    @queue_pg.task(queue="f", name="fails", retries=0, create=True, registry=reg)
    def fails(n: int) -> None:
        raise KeyError(f"[red]n{n}")

    ids = [fails.send([n], client=client) for n in range(3)]
    run_worker("sync", clean, ["f"], reg, lambda c: len(dead_letters(c, "f-dlq")) == 3)
    listing = run("tasks", "failed")
    assert all(str(i) in listing for i in ids) and "[red]n0" in listing and "KeyError" in listing
    assert "retrying job" in run("tasks", "retry", str(ids[0]))
    assert client.stats("f").visible == 1 and len(dead_letters(client, "f-dlq")) == 2
    bad = CliRunner().invoke(cli.main, ["--dsn", clean, "tasks", "retry", str(ids[0])])
    assert bad.exit_code == 1 and f"no failed job {ids[0]}" in bad.output
    assert "retrying 2 failed jobs" in run("tasks", "retry", "--all", "--dlq", "f-dlq")
    assert client.stats("f").visible == 3
    (m,) = client.receive("f")
    client.dead_letter("f", m.receipt, "by hand")  # type: ignore[arg-type]
    assert "deleted 1 failed job " in run("tasks", "purge", "f-dlq", "--yes")
    assert "no failed jobs" in run("tasks", "failed")


def test_redrive_message_needs_manage_on_the_dead_letter_queue(
    client: queue_pg.Client, make_role: MakeRole, sql: Any  # noqa: F811
) -> None:
    client.create_queue("x-dlq")
    client.create_queue("x", dead_letter_queue="x-dlq", max_receive_count=3)
    mid = client.send("x", 1)
    (m,) = client.receive("x")
    client.dead_letter("x", m.receipt, "no")  # type: ignore[arg-type]
    stranger = make_role("stranger", CONSUMER)
    client.grant("x", stranger.name, "receive")
    with stranger.client() as c, pytest.raises(queue_pg.AccessDenied):
        c.redrive_message("x-dlq", mid)
    assert client.redrive_message("x-dlq", mid + 1000) is False
    assert client.redrive_message("x-dlq", mid) is True
    assert client.redrive_message("x-dlq", mid) is False
    assert client.stats("x").visible == 1


# --- a timeout is a failure -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_attempt_past_its_timeout_fails_whatever_it_does_after(
    client: queue_pg.Client, clean: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "queue_pg.worker")
    reg = Registry()
    finished: list[int] = []

    if kind == "sync":
        @queue_pg.task(queue="slow", name="stubborn", retries=0, timeout=0.3, create=True,
                       registry=reg, bind=True)
        def stubborn(job: queue_pg.Job) -> str:
            with contextlib.suppress(TaskTimeout):  # swallows the soft limit and returns
                time.sleep(1.0)
            finished.append(job.receive_count)
            return "late"
    else:
        @queue_pg.task(queue="slow", name="stubborn", retries=0, timeout=0.3, create=True,
                       registry=reg, bind=True)
        async def stubborn(job: queue_pg.AsyncJob) -> str:  # type: ignore[misc]
            with contextlib.suppress(asyncio.CancelledError):  # swallowed: it returns
                await asyncio.sleep(1.0)
            finished.append(job.receive_count)
            return "late"

    mid = stubborn.send(client=client)
    run_worker(kind, clean, ["slow"], reg,
               lambda c: bool(dead_letters(c, "slow-dlq")) and bool(finished))
    (m,) = dead_letters(client, "slow-dlq")
    assert m.id == mid
    assert "TaskTimeout: stubborn ran past its timeout of 0.3s" in m.attributes["dead_letter_reason"]
    with psycopg.connect(clean) as c:
        outcomes = c.execute("SELECT outcome FROM queue_pg.message_history").fetchall()
    assert outcomes == [("dead_lettered",)]  # never recorded as succeeded
    if kind == "sync":
        wait_until("the late end logged", lambda: "its result is ignored" in caplog.text)


def test_a_job_not_started_is_revoked_a_running_one_runs_on(
    client: queue_pg.Client, clean: str, make_role: MakeRole  # noqa: F811
) -> None:
    from click.testing import CliRunner

    from queue_pg.ops import cli

    reg = Registry()

    @queue_pg.task(queue="rv", name="job", create=True, registry=reg)
    def job(n: int) -> None: ...

    running, waiting, later, by_sql = (job.send([n], client=client) for n in range(4))
    (m,) = client.receive("rv")  # running: its lease is held
    assert m.id == running
    stranger = make_role("stranger", CONSUMER)
    client.grant("rv", stranger.name, "receive")
    with stranger.client() as c, pytest.raises(queue_pg.AccessDenied):
        c.cancel_message("rv", waiting)
    assert job.revoke(running, client=client) is False  # runs on
    assert job.revoke(waiting, client=client) is True
    assert job.revoke(waiting, client=client) is False  # gone
    result = CliRunner().invoke(cli.main, ["--dsn", clean, "tasks", "revoke", "rv", str(later)])
    assert result.exit_code == 0 and "revoked 1 job of rv" in result.output
    with psycopg.connect(clean, autocommit=True) as c:
        assert c.execute("SELECT queue_pg.cancel_message('rv', %s)", [by_sql]).fetchone() == (True,)
        outcomes = c.execute("SELECT outcome FROM queue_pg.message_history").fetchall()
    assert outcomes == [("purged",)] * 3
    assert client.stats("rv").in_flight == 1 and client.stats("rv").visible == 0


def test_the_soft_limit_raises_inside_a_thread_and_frees_its_slot(
    client: queue_pg.Client, clean: str
) -> None:
    """A pure-Python loop that never looks at job.cancelled is stopped at its timeout by a
    TaskTimeout raised inside it; the worker's only slot then runs the next job."""
    reg = Registry()
    seen: list[str] = []

    @queue_pg.task(queue="spin", name="spin", retries=0, timeout=0.3, create=True,
                   registry=reg)
    def spin() -> None:
        n = 0
        try:
            while True:
                n += 1
        except TaskTimeout as exc:
            seen.append(f"stopped: {exc}")
            raise

    @queue_pg.task(queue="spin", name="after", create=True, registry=reg)
    def after() -> None:
        seen.append("after")

    spin.send(client=client)
    after.send(client=client)
    run_worker("sync", clean, ["spin"], reg, lambda c: "after" in seen
               and bool(dead_letters(c, "spin-dlq")), concurrency=1)
    assert seen == ["stopped: the task ran past its timeout", "after"]
    (m,) = dead_letters(client, "spin-dlq")
    assert "TaskTimeout: spin ran past its timeout of 0.3s" in m.attributes["dead_letter_reason"]


def test_terminate_revokes_a_running_job_and_a_thread_is_told(
    client: queue_pg.Client, clean: str, make_role: MakeRole  # noqa: F811
) -> None:
    """cancel_message(terminate): the running job's message goes; its heartbeat is refused, so
    a thread-pool task sees job.cancelled (the process pool kills it:
    tests/test_worker_processes.py). From the CLI and SQL too; still `manage` only."""
    from click.testing import CliRunner

    from queue_pg.ops import cli

    reg = Registry()
    seen: list[str | None] = []

    @queue_pg.task(queue="rt", name="loop", create=True, registry=reg, bind=True)
    def loop(job: queue_pg.Job) -> None:
        deadline = time.monotonic() + 30
        while not job.cancelled and time.monotonic() < deadline:
            time.sleep(0.02)
        seen.append(job.cancel_reason)

    held = [loop.send([], client=client) for _ in range(2)]
    received = client.receive("rt", 2, visibility_timeout=60)
    assert sorted(m.id for m in received) == sorted(held)
    stranger = make_role("stranger2", CONSUMER)
    client.grant("rt", stranger.name, "receive")
    with stranger.client() as c, pytest.raises(queue_pg.AccessDenied):
        c.cancel_message("rt", held[0], terminate=True)
    result = CliRunner().invoke(cli.main, ["--dsn", clean, "tasks", "revoke", "rt",
                                           str(held[0]), "--terminate"])
    assert result.exit_code == 0 and "revoked 1 job of rt" in result.output, result.output
    with psycopg.connect(clean, autocommit=True) as c:
        assert c.execute("SELECT queue_pg.cancel_message('rt', %s, terminate => true)",
                         [held[1]]).fetchone() == (True,)
    with pytest.raises((queue_pg.MessageNotFound, queue_pg.StaleReceipt)):
        client.change_visibility("rt", received[0].receipt or "", 10)

    running = loop.send([], client=client)
    worker = Worker(client, ["rt"], reg, concurrency=1, wait=0.2, visibility_timeout=0.6)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        wait_until("running", lambda: client.stats("rt").in_flight == 1)
        assert loop.revoke(running, client=client, terminate=True)
        wait_until("the task told", lambda: seen, timeout=10)
    finally:
        worker.stop()
        t.join(10)
    assert seen == ["lease lost"]
    assert client.stats("rt").visible == 0 and client.stats("rt").in_flight == 0
