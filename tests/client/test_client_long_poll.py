"""The client tests, long polling: run against both clients (see conftest.py)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool
from sqlalchemy import create_engine

from client.helpers import sqlalchemy_url
from queue_pg import (
    Client,
    InvalidParameter,
    OverLimit,
)


def send_later(
    dsn: str, queue: str, body: Any, after: float
) -> tuple[threading.Thread, dict[str, float]]:
    """Send ``body`` from another thread and connection ``after`` seconds from now."""
    times: dict[str, float] = {}
    sender = psycopg.connect(dsn, autocommit=True)

    def run() -> None:
        with sender:
            time.sleep(after)
            times["sent"] = time.monotonic()
            sender.execute(
                "SELECT queue_pg.send(%s, %s::jsonb)", (queue, psycopg.types.json.Jsonb(body))
            )
            times["committed"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, times


def woken_by_send(
    client: Client, dsn: str, body: Any, after: float = 0.15
) -> tuple[float, float, dict[str, float]]:
    """Long-poll "jobs" while another connection sends ``body`` ``after`` seconds later; assert
    the poll got it, woken by the NOTIFY (the re-check without one comes only a second after the
    poll began; a woken poll ends within 0.11 s of the commit on a loaded 2-core machine). The
    poll may wait 20 s, so a sender held up by the load makes it late, not empty. Returns when
    the poll started and ended, and the sender's times."""
    thread, times = send_later(dsn, "jobs", body, after=after)
    start = time.monotonic()
    got = client.receive("jobs", wait=20)
    end = time.monotonic()
    thread.join()
    assert [m.body for m in got] == [body]
    assert end - times["committed"] < 0.6
    return start, end, times


@pytest.fixture(params=["dsn", "pool", "engine"])
def any_client(request: pytest.FixtureRequest, clean: str) -> Iterator[Client]:
    """A Client on each kind of source (a caller's pool is not autocommit, nor is an engine)."""
    if request.param == "dsn":
        with Client(clean, sweep_interval=None) as c:
            yield c
    elif request.param == "pool":
        with ConnectionPool(clean, min_size=1, max_size=4, open=True) as pool:
            yield Client(pool, sweep_interval=None)
    else:
        engine = create_engine(sqlalchemy_url(clean))
        yield Client(engine, sweep_interval=None)
        engine.dispose()


def test_long_poll_wakes_up_on_a_send(any_client: Client, clean: str) -> None:
    any_client.create_queue("jobs")
    any_client.receive("jobs")  # warm the connection up
    start, end, times = woken_by_send(any_client, clean, {"wake": "up"})
    assert end - start < 2
    assert end >= times["sent"]  # it waited for the message rather than returning early


def test_long_poll_in_the_callers_transaction_wakes_up_and_rolls_back(
    client: Client, clean: str, connect: Callable[[], Any]
) -> None:
    client.create_queue("jobs")
    with connect() as tx:
        thread, times = send_later(clean, "jobs", "hi", after=0.15)
        got = client.receive("jobs", wait=5, conn=tx)
        end = time.monotonic()
        thread.join()
        assert [m.body for m in got] == ["hi"]
        assert times["sent"] <= end < times["committed"] + 0.6
        tx.rollback()  # the lease was part of the caller's transaction
    [m] = client.peek("jobs")
    assert m.receive_count == 0


def test_long_poll_returns_nothing_after_about_the_wait(client: Client) -> None:
    client.create_queue("jobs")
    for wait in (0.6, timedelta(milliseconds=400)):
        start = time.monotonic()
        assert client.receive("jobs", wait=wait) == []
        elapsed = time.monotonic() - start
        expected = wait.total_seconds() if isinstance(wait, timedelta) else wait
        assert expected - 0.02 <= elapsed < expected + 0.5


def test_long_poll_picks_up_a_delayed_message_when_it_comes_due(client: Client) -> None:
    client.create_queue("jobs")
    mid = client.send("jobs", "later", delay=0.5)
    start = time.monotonic()
    got = client.receive("jobs", wait=3)
    elapsed = time.monotonic() - start
    assert [m.id for m in got] == [mid]
    assert 0.45 <= elapsed < 2


def test_long_poll_picks_up_a_lapsed_lease(client: Client) -> None:
    client.create_queue("jobs")
    client.send("jobs", "x")
    [first] = client.receive("jobs", visibility_timeout=0.3)
    start = time.monotonic()
    [again] = client.receive("jobs", wait=3)
    assert again.id == first.id and again.receive_count == 2
    assert time.monotonic() - start < 2


def test_over_limit_on_a_long_poll_returns_nothing(client: Client, clean: str) -> None:
    client.create_queue("jobs", in_flight_limit=1)
    client.send_batch("jobs", [1, 2])
    [held] = client.receive("jobs")
    with pytest.raises(OverLimit):
        client.receive("jobs")
    start = time.monotonic()
    assert client.receive("jobs", wait=0.4) == []
    assert time.monotonic() - start >= 0.38
    # a slot that frees up during the poll is taken
    timer = threading.Timer(0.2, client.delete, ("jobs", held.receipt))
    timer.start()
    start = time.monotonic()
    got = client.receive("jobs", wait=3)
    timer.join()
    assert [m.body for m in got] == [2]
    assert 0.2 <= time.monotonic() - start < 2


def test_receive_wait_of_the_queue_is_used_when_wait_is_none(client: Client, clean: str) -> None:
    client.create_queue("jobs", receive_wait=0.5)
    start = time.monotonic()
    assert client.receive("jobs") == []
    assert 0.48 <= time.monotonic() - start < 1.2
    start = time.monotonic()
    assert client.receive("jobs", wait=0) == []  # an explicit 0 is a short poll
    assert time.monotonic() - start < 0.3
    client.alter_queue("jobs", receive_wait=20)  # a sender held up by load: late, not empty
    thread, times = send_later(clean, "jobs", "x", after=0.15)
    got = client.receive("jobs")
    end = time.monotonic()
    thread.join()
    assert [m.body for m in got] == ["x"]
    assert end - times["committed"] < 0.6


@pytest.mark.parametrize("wait", [25, 20.001, -1, math.nan, math.inf, timedelta(seconds=-0.5)])
def test_wait_out_of_range_is_invalid_parameter(
    client: Client, conn: psycopg.Connection, wait: Any
) -> None:
    client.create_queue("jobs")
    for where in (None, conn):
        start = time.monotonic()
        with pytest.raises(InvalidParameter, match=r"wait = \S+ is out of range: allowed 0 to 20"):
            client.receive("jobs", wait=wait, conn=where)
        assert time.monotonic() - start < 0.3


def test_a_long_poll_leaves_no_listener_on_the_pooled_connection(clean: str) -> None:
    with ConnectionPool(clean, min_size=1, max_size=1, open=True) as pool:
        client = Client(pool, sweep_interval=None)
        client.create_queue("jobs")
        assert client.receive("jobs", wait=0.2) == []
        thread, _ = send_later(clean, "jobs", 1, after=0.1)
        assert len(client.receive("jobs", wait=3)) == 1
        thread.join()
        client.send("jobs", 2)  # a NOTIFY nobody listens to any more
        with pool.connection() as c:
            assert c.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
            assert list(c.notifies(timeout=0.05)) == []


def test_own_pool_stays_listening_between_long_polls(clean: str) -> None:
    """The client's own connection keeps its LISTEN after a long poll (no UNLISTEN round trip
    on the woken poll's way back, no LISTEN on the next), one channel at a time, and the pool's
    lend check drops what arrives meanwhile, so nothing piles up or looks like a dead socket."""
    with Client(clean, min_size=1, max_size=1, sweep_interval=None) as client:
        client.create_queue("jobs")
        client.create_queue("other")
        assert client._pool is not None

        def listening() -> list[str]:
            assert client._pool is not None
            with client._pool.connection() as c:
                return [r[0] for r in c.execute("SELECT pg_listening_channels()").fetchall()]

        assert client.receive("jobs", wait=0.1) == []
        assert listening() == [client.channel("jobs")]
        for i in range(20):
            client.send("jobs", i)  # each may NOTIFY the client's own listening connection
            time.sleep(0.003)  # past the 2 ms debounce
        with client._pool.connection() as c:  # lent: the check has drained them
            assert list(c.notifies(timeout=0.05)) == []
        assert len(client.receive("jobs", 20, wait=1)) == 20
        woken_by_send(client, clean, "late", after=0.2)  # by the kept LISTEN
        assert client.receive("other", wait=0.1) == []
        assert listening() == [client.channel("other")]


def test_long_poll_on_a_queue_dropped_and_created_again_still_wakes_up(
    client: Client, clean: str
) -> None:
    client.create_queue("jobs")
    assert client.receive("jobs", wait=0.1) == []  # the client has listened for "jobs" once
    client.drop_queue("jobs")
    client.create_queue("jobs")  # a new queue (new id) with the same name
    woken_by_send(client, clean, "new")


class CountingConnection(psycopg.Connection):  # type: ignore[type-arg]
    """A real connection that counts the statements the client runs on it."""

    statements = 0

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        CountingConnection.statements += 1
        return super().cursor(*args, **kwargs)


class CountingAsyncConnection(psycopg.AsyncConnection):  # type: ignore[type-arg]
    statements = 0

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        CountingAsyncConnection.statements += 1
        return super().cursor(*args, **kwargs)


def flood(dsn: str, channel: str, stop: threading.Event) -> None:
    """NOTIFY ``channel`` as fast as one connection can: 100 notifications per commit."""
    with psycopg.connect(dsn, autocommit=True) as c:
        while not stop.is_set():
            c.execute("SELECT pg_notify(%s, i::text) FROM generate_series(1, 100) i", (channel,))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_notify_flood_costs_an_idle_poller_a_few_attempts_a_second(
    kind: str, clean: str, loop: Any
) -> None:
    """Any role may NOTIFY a channel it knows. A poller woken for nothing waits longer before
    each next look (draining what arrives meanwhile), so a flood does not turn into one receive
    transaction per notification."""
    from client.blocking import BlockingClient
    from queue_pg import AsyncClient

    wait = 2.0
    if kind == "sync":
        pool: Any = ConnectionPool(clean, min_size=1, max_size=2, open=True,
                                   connection_class=CountingConnection,
                                   kwargs={"autocommit": True})
        client: Any = Client(pool, sweep_interval=None)
        counter: Any = CountingConnection
    else:
        from psycopg_pool import AsyncConnectionPool

        async def open_pool() -> AsyncConnectionPool:
            p = AsyncConnectionPool(clean, min_size=1, max_size=2, open=False,
                                    connection_class=CountingAsyncConnection,
                                    kwargs={"autocommit": True})
            await p.open()
            return p

        pool = loop.run(open_pool())
        client = BlockingClient(loop, AsyncClient(pool, sweep_interval=None))
        counter = CountingAsyncConnection
    try:
        client.create_queue("jobs")
        channel = client.channel("jobs")
        stop = threading.Event()
        flooder = threading.Thread(target=flood, args=(clean, channel, stop))
        flooder.start()
        try:
            time.sleep(0.2)
            counter.statements = 0
            start = time.monotonic()
            assert client.receive("jobs", wait=wait) == []
            took = time.monotonic() - start
        finally:
            stop.set()
            flooder.join()
        assert wait - 0.1 < took < wait + 3  # it waited the wait out (loose: a loaded host lags)
        # unbounded, this was one attempt per notification read: thousands in two seconds
        assert counter.statements < 40, counter.statements
    finally:
        if kind == "sync":
            pool.close()
        else:
            loop.run(pool.close())
