"""Task results: a task with ``store_result`` keeps its return value (or its last error) for
its ``result_ttl``, written by the worker as it settles the message, read by ``get`` woken by
NOTIFY, expired by the sweep, readable only with ``send`` or ``receive`` on the queue. Both
workers, a real server, real roles."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest

import queue_pg
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.tasks import Registry, TaskFailed
from tests.test_access import CONSUMER, PRODUCER, MakeRole, make_role  # noqa: F401
from tests.test_task_failures import dead_letters, run_worker


def kept(conn: psycopg.Connection[Any]) -> int:
    return conn.execute("SELECT count(*) FROM queue_pg.task_results").fetchone()[0]  # type: ignore[index]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_return_value_is_kept_and_read(
    client: queue_pg.Client, clean: str, kind: str, conn: psycopg.Connection[Any]
) -> None:
    reg = Registry()

    @queue_pg.task(queue="calc", name="add", create=True, store_result=True, registry=reg)
    def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    @queue_pg.task(queue="calc", name="clock", store_result=True, registry=reg)
    def clock() -> object:
        return time.monotonic  # not JSON

    r = add.send([2, 3], client=client)
    bad = clock.send(client=client)
    assert isinstance(r, int) and str(r) == repr(r) == str(int(r))  # the id, as before
    assert r.status == "PENDING" and not r.ready()
    run_worker(kind, clean, ["calc"], reg, lambda c: r.ready() and bad.ready())
    assert r.get(timeout=5) == {"sum": 5}
    assert r.status == "SUCCESS"
    assert client.stats("calc", exact=True).visible == 0  # the message went with the result
    # a return value that is not JSON: FAILURE naming the task, the message dead-lettered
    assert bad.status == "FAILURE"
    with pytest.raises(TaskFailed, match=r"task clock: its return value .* is not JSON"):
        bad.get(timeout=5)
    assert [m.id for m in dead_letters(client, "calc-dlq")] == [bad]
    assert kept(conn) == 2


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_failure_after_the_last_retry_is_kept(
    client: queue_pg.Client, clean: str, kind: str
) -> None:
    reg = Registry()

    @queue_pg.task(queue="f", name="broken", create=True, retries=1, store_result=True,
                   registry=reg)
    def broken() -> None:
        raise ValueError("x" * 5000)

    r = broken.send(client=client)
    run_worker(kind, clean, ["f"], reg, lambda c: r.ready())
    assert r.status == "FAILURE"
    with pytest.raises(TaskFailed) as info:
        r.get(timeout=5)
    error = info.value.error
    assert error is not None and error.startswith("failed 2 times (retries = 1), last: ValueError")
    assert len(error.encode()) <= 1024  # bounded, as dead-letter reasons
    assert r.get(timeout=5, propagate=False) == error
    assert [m.id for m in dead_letters(client, "f-dlq")] == [r]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_run_waiting_out_its_backoff_is_retry(client: queue_pg.Client, clean: str,
                                                kind: str) -> None:
    reg = Registry()

    @queue_pg.task(queue="rt", name="flaky", create=True, store_result=True, registry=reg)
    def flaky() -> None:
        raise ValueError("not yet")

    r = flaky.send(client=client)
    run_worker(kind, clean, ["rt"], reg, lambda c: r.status == "RETRY",
               backoff=Backoff(base=60, cap=60))
    assert not r.ready()
    with pytest.raises(TimeoutError):
        r.get(timeout=0.2)


def test_a_result_the_queue_refuses_fails_the_job(
    client: queue_pg.Client, clean: str
) -> None:
    reg = Registry()

    @queue_pg.task(queue="big", name="big", max_message_size=1024, store_result=True,
                   registry=reg)
    def big() -> str:
        return "y" * 2000

    @queue_pg.task(queue="big", name="nul", store_result=True, registry=reg)
    def nul() -> str:
        return "a\x00b"  # JSON, but jsonb holds no NUL

    r = big.send(client=client)
    n = nul.send(client=client)
    run_worker("sync", clean, ["big"], reg, lambda c: r.ready() and n.ready())
    with pytest.raises(TaskFailed, match="its result was refused: result is 2002 bytes"):
        r.get(timeout=5)
    with pytest.raises(TaskFailed, match="task nul: its result was refused"):
        n.get(timeout=5)


def test_aget_reads_on_an_async_client_or_in_a_thread(
    client: queue_pg.Client, clean: str
) -> None:
    reg = Registry()

    @queue_pg.task(queue="a", name="twice", create=True, store_result=True, registry=reg)
    def twice(n: int) -> int:
        return 2 * n

    r = twice.send([21], client=client)

    async def main() -> tuple[Any, Any]:
        async with queue_pg.AsyncClient(clean, sweep_interval=None) as ac:
            with pytest.raises(TimeoutError):
                await r.aget(timeout=0.2, client=ac)
            run_worker("sync", clean, ["a"], reg, lambda c: r.ready())
            return await r.aget(timeout=5, client=ac), await r.aget(timeout=5)

    assert asyncio.run(main()) == (42, 42)


def test_get_times_out_while_the_task_has_not_run(client: queue_pg.Client) -> None:
    reg = Registry()

    @queue_pg.task(queue="idle", name="idle", create=True, store_result=True, registry=reg)
    def idle() -> None: ...

    r = idle.send(client=client)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"task idle: message \d+ has no result after 0\.3s"):
        r.get(timeout=0.3)
    assert 0.3 <= time.monotonic() - t0 < 5
    assert r.status == "PENDING" and not r.ready()


def test_get_wakes_on_the_workers_notify(client: queue_pg.Client) -> None:
    """Completed while a get waits: it returns well before its 1 s re-check (NOTIFY, not
    polling). Three rounds, each bounded at 0.5 s (measured: 7 to 16 ms; the 1 s re-check
    alone takes 0.7 s here)."""
    reg = Registry()

    @queue_pg.task(queue="w", name="w", create=True, store_result=True, registry=reg)
    def w() -> None: ...

    for n in range(3):
        r = w.send(client=client)
        got: list[Any] = []

        def wait(r: queue_pg.jobs.tasks.TaskResult = r, got: list[Any] = got) -> None:
            got.append((r.get(timeout=30), time.monotonic()))

        waiter = threading.Thread(target=wait)
        waiter.start()
        try:
            time.sleep(0.3)  # the waiter is listening (its first look found nothing)
            (m,) = client.receive("w", wait=0)
            done = time.monotonic()
            assert client.complete_task("w", m.receipt, {"n": n}, 60)  # the worker's call
        finally:
            waiter.join(30)
        (value, at) = got[0]
        assert value == {"n": n}
        print(f"round {n}: get returned {at - done:.4f}s after the result")
        assert at - done < 0.5, f"get returned {at - done:.3f}s after the result"


def test_results_expire_and_the_sweep_deletes_them(
    client: queue_pg.Client, clean: str, conn: psycopg.Connection[Any]
) -> None:
    reg = Registry()

    @queue_pg.task(queue="t", name="short", create=True, store_result=True, result_ttl=1,
                   registry=reg)
    def short() -> int:
        return 7

    r = short.send(client=client)
    run_worker("sync", clean, ["t"], reg, lambda c: r.ready())
    assert r.get(timeout=5) == 7
    time.sleep(1.2)
    assert r.status == "PENDING"  # expired: not shown even before the sweep
    assert kept(conn) == 1
    client.sweep()
    assert kept(conn) == 0


def test_results_are_read_only_with_a_grant_on_their_queue(
    client: queue_pg.Client, clean: str, make_role: MakeRole,  # noqa: F811
    conn: psycopg.Connection[Any],
) -> None:
    client.create_queue("mine")
    client.create_queue("theirs")
    producer = make_role("results_p", PRODUCER)
    consumer = make_role("results_c", CONSUMER)
    client.grant("mine", producer.name, "send")
    client.grant("theirs", consumer.name, "receive")
    for q in ("mine", "theirs"):
        client.send(q, {"task": "x"})
        (m,) = client.receive(q, wait=0)
        assert client.complete_task(q, m.receipt, {"secret": q}, 60)
        assert m.id
    ids = dict(conn.execute("SELECT q.name, r.message_id FROM queue_pg.task_results r"
                            " JOIN queue_pg.queues q ON q.id = r.queue_id").fetchall())
    with producer.client() as p, consumer.client() as c:
        assert p.task_result("mine", ids["mine"]).result == {"secret": "mine"}  # send
        assert c.task_result("theirs", ids["theirs"]).result == {"secret": "theirs"}  # receive
        with pytest.raises(queue_pg.AccessDenied, match="needs privilege receive on queue 'theirs'"):
            p.task_result("theirs", ids["theirs"])
        with pytest.raises(queue_pg.AccessDenied):
            p.wait_task_result("theirs", ids["theirs"], 0.1)
        with pytest.raises(queue_pg.AccessDenied):
            c.task_result("mine", ids["mine"])
        # writing one needs receive: a producer cannot, whatever receipt it holds
        p.send("mine", {"task": "y"})
        (m,) = client.receive("mine", wait=0)
        with pytest.raises(queue_pg.AccessDenied, match="complete_task"):
            p.complete_task("mine", m.receipt, {"forged": True}, 60)
    assert kept(conn) == 2


def test_store_result_off_keeps_nothing(
    client: queue_pg.Client, clean: str, conn: psycopg.Connection[Any]
) -> None:
    reg = Registry()
    ran: list[int] = []

    @queue_pg.task(queue="plain", name="plain", create=True, registry=reg)
    def plain(n: int) -> int:
        ran.append(n)
        return n

    r = plain.send([4], client=client)
    run_worker("sync", clean, ["plain"], reg, lambda c: bool(ran)
               and c.stats("plain", exact=True).in_flight == 0
               and c.stats("plain", exact=True).visible == 0)
    assert kept(conn) == 0
    with pytest.raises(ValueError, match="task plain keeps no result"):
        r.get(timeout=1)
