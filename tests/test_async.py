"""queue_pg.AsyncClient: the asyncio twin of Client, on the same SQL (asyncio_mode = auto)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.pq import Format
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from queue_pg import (
    AsyncClient,
    DeleteResult,
    InvalidParameter,
    InvalidReceipt,
    LeaseLimitExceeded,
    Message,
    MessageNotFound,
    MessageTooLarge,
    OverLimit,
    QueueAlreadyExists,
    QueueConfig,
    QueueInUse,
    QueueNotFound,
    QueueStats,
    StaleReceipt,
    decode,
)


async def advance(conn: psycopg.AsyncConnection[Any], seconds: float) -> None:
    """Move this connection's queue_pg clock forward (only for calls made with conn=)."""
    await conn.execute(
        "SELECT set_config('queue_pg.time_offset', (coalesce(nullif(current_setting("
        "'queue_pg.time_offset', true), '')::interval, '0') + make_interval(secs => %s))::text, false)",
        (seconds,),
    )


@pytest.fixture
async def aclient(clean: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(clean, sweep_interval=None) as c:
        yield c


@pytest.fixture
async def aconn(clean: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(clean, autocommit=True) as c:
        yield c


async def send_later(dsn: str, queue: str, body: Any, after: float) -> float:
    """Send from another connection ``after`` seconds from now; returns when it committed."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as sender:
        await asyncio.sleep(after)
        await sender.execute("SELECT queue_pg.send(%s, %s::jsonb)", (queue, Jsonb(body)))
        return time.monotonic()


async def woken_by_send(
    client: AsyncClient, dsn: str, body: Any, after: float = 0.15
) -> tuple[float, float, float]:
    """Long-poll "jobs" while another connection sends ``body`` ``after`` seconds later; assert
    the poll got it, woken by the NOTIFY (the re-check without one comes only a second after the
    poll began). Returns when the poll started and ended and when the send committed."""
    sender = asyncio.create_task(send_later(dsn, "jobs", body, after=after))
    start = time.monotonic()
    got = await client.receive("jobs", wait=5)
    end = time.monotonic()
    committed = await sender
    assert [m.body for m in got] == [body]
    assert end - committed < 0.6
    return start, end, committed


async def test_queue_admin(aclient: AsyncClient) -> None:
    await aclient.create_queue("dlq")
    cfg = await aclient.create_queue(
        "jobs",
        visibility_timeout=timedelta(seconds=10),
        dead_letter_queue="dlq",
        max_receive_count=3,
    )
    assert isinstance(cfg, QueueConfig)
    assert (cfg.name, cfg.visibility_timeout, cfg.max_receive_count) == ("jobs", 10.0, 3)
    assert (
        await aclient.create_queue(
            "jobs", visibility_timeout=10, dead_letter_queue="dlq", max_receive_count=3
        )
        == cfg
    )
    with pytest.raises(QueueAlreadyExists):
        await aclient.create_queue("jobs", visibility_timeout=11)
    cfg = await aclient.alter_queue(
        "jobs", delay=timedelta(milliseconds=500), clear=["message_ttl"]
    )
    assert (cfg.delay, cfg.message_ttl, cfg.visibility_timeout) == (0.5, None, 10.0)
    assert await aclient.get_queue("jobs") == cfg
    assert [q.name for q in await aclient.list_queues()] == ["dlq", "jobs"]
    with pytest.raises(QueueInUse):
        await aclient.drop_queue("dlq")
    assert await aclient.drop_queue("jobs") is True
    assert await aclient.drop_queue("jobs", if_exists=True) is False
    with pytest.raises(QueueNotFound):
        await aclient.get_queue("jobs")
    with pytest.raises(InvalidParameter, match="visibility_timeout = -1"):
        await aclient.create_queue("bad", visibility_timeout=-1)
    assert [q.name for q in await aclient.list_queues()] == ["dlq"]


async def test_send_receive_delete(
    aclient: AsyncClient, aconn: psycopg.AsyncConnection[Any]
) -> None:
    await aclient.create_queue("jobs", visibility_timeout=10)
    mid = await aclient.send("jobs", {"n": 1}, attributes={"type": "t"}, ttl=60)
    ids = await aclient.send_batch("jobs", [2, 3], attributes=[None, {"type": "u"}])
    assert ids == sorted(ids) and ids[0] > mid
    [p] = await aclient.peek("jobs")
    assert (p.id, p.receipt) == (mid, None)
    got = await aclient.receive("jobs", 10, visibility_timeout=timedelta(seconds=5))
    assert [m.id for m in got] == [mid, *ids]
    m = got[0]
    assert isinstance(m, Message)
    assert (m.queue, m.body, m.attributes, m.receive_count) == ("jobs", {"n": 1}, {"type": "t"}, 1)
    assert m.first_received_at is not None and m.expires_at is not None
    assert m.visible_until - m.first_received_at == timedelta(seconds=5)
    assert m.expires_at - m.enqueued_at == timedelta(seconds=60)
    assert got[2].attributes == {"type": "u"}
    assert await aclient.delete("jobs", m.receipt or "") is True
    assert await aclient.delete("jobs", m.receipt or "") is False
    results = await aclient.delete_batch("jobs", [got[1].receipt or "", "junk"])
    assert results == [
        DeleteResult(got[1].receipt or "", True, None),
        DeleteResult("junk", False, "InvalidReceipt"),
    ]
    # the last one: extend, update, release, then redeliver after a lapse
    r = got[2].receipt or ""
    until = await aclient.change_visibility("jobs", r, 30, conn=aconn)
    assert until > got[2].visible_until
    u = await aclient.update("jobs", r, body={"n": 3}, visibility_timeout=2, conn=aconn)
    assert (u.body, u.receipt) == ({"n": 3}, r)
    await advance(aconn, 3)
    [again] = await aclient.receive("jobs", conn=aconn)
    assert (again.id, again.body, again.receive_count) == (ids[1], {"n": 3}, 2)
    with pytest.raises(StaleReceipt):
        await aclient.delete("jobs", r, conn=aconn)
    stats = await aclient.stats("jobs", conn=aconn)
    assert isinstance(stats, QueueStats)
    assert (stats.in_flight, stats.stale_receipts, stats.lease_expiries) == (1, 1, 1)
    assert await aclient.purge("jobs") == 1
    assert await aclient.sweep() == 0


async def test_errors_are_mapped(aclient: AsyncClient, aconn: psycopg.AsyncConnection[Any]) -> None:
    await aclient.create_queue(
        "jobs", max_message_size=1024, in_flight_limit=1, visibility_timeout=10, max_lease=20
    )
    with pytest.raises(QueueNotFound):
        await aclient.send("nope", 1)
    with pytest.raises(InvalidParameter):
        await aclient.send("jobs", {"text": "a \u0000 b"})
    with pytest.raises(MessageTooLarge, match="max_message_size = 1024"):
        await aclient.send("jobs", "x" * 2000)
    await aclient.send_batch("jobs", [1, 2])
    [m] = await aclient.receive("jobs", conn=aconn)
    with pytest.raises(OverLimit):
        await aclient.receive("jobs")
    assert await aclient.receive("jobs", wait=0.2) == []  # a long poll: nothing, no error
    with pytest.raises(InvalidReceipt):
        await aclient.delete("jobs", "1.2.3.0123456789abcdef")
    with pytest.raises(LeaseLimitExceeded):
        await aclient.change_visibility("jobs", m.receipt or "", 25)
    with pytest.raises(InvalidParameter, match="wait = 21"):
        await aclient.receive("jobs", wait=21)
    assert await aclient.delete("jobs", m.receipt or "") is True
    with pytest.raises(MessageNotFound):
        await aclient.update("jobs", m.receipt or "", body=5)
    assert await aclient.redrive("jobs") == 0


async def test_long_poll_wakes_up_on_a_send(aclient: AsyncClient, clean: str) -> None:
    await aclient.create_queue("jobs")
    start, end, committed = await woken_by_send(aclient, clean, "ping")
    assert end - start < 2 and end >= committed - 0.01


async def test_long_poll_waits_for_the_queue_default_and_then_returns_nothing(
    aclient: AsyncClient,
) -> None:
    await aclient.create_queue("jobs", receive_wait=0.4)
    start = time.monotonic()
    assert await aclient.receive("jobs") == []
    assert 0.38 <= time.monotonic() - start < 1.2
    start = time.monotonic()
    assert await aclient.receive("jobs", wait=0) == []
    assert time.monotonic() - start < 0.3


async def test_concurrent_long_polls_share_one_message(aclient: AsyncClient, clean: str) -> None:
    await aclient.create_queue("jobs")
    sender = asyncio.create_task(send_later(clean, "jobs", "only", after=0.15))
    results = await asyncio.gather(*(aclient.receive("jobs", wait=1) for _ in range(4)))
    await sender
    assert sorted(len(r) for r in results) == [0, 0, 0, 1]


async def test_long_poll_on_a_queue_created_again_still_wakes_up(
    aclient: AsyncClient, clean: str
) -> None:
    await aclient.create_queue("jobs")
    assert await aclient.receive("jobs", wait=0.1) == []
    await aclient.drop_queue("jobs")
    await aclient.create_queue("jobs")
    await woken_by_send(aclient, clean, "new")


async def test_send_in_the_callers_transaction(aclient: AsyncClient, clean: str) -> None:
    await aclient.create_queue("jobs")
    async with await psycopg.AsyncConnection.connect(clean) as tx:
        await aclient.send("jobs", "lost", conn=tx)
        assert await aclient.peek("jobs") == []
        await tx.rollback()
        await aclient.send("jobs", "kept", conn=tx)
        await tx.commit()
    assert [m.body for m in await aclient.peek("jobs", 10)] == ["kept"]


async def test_own_pool_loads_jsonb_with_the_faster_loader(clean: str) -> None:
    """As Client's: own connections get decode.JsonbLoader, bodies decode as json.loads would."""
    client = await AsyncClient.open(clean, min_size=1, max_size=1, sweep_interval=None)
    try:
        await client.create_queue("jobs")
        await client.send("jobs", {"a": ["é", 1.5, None]})
        (got,) = await client.receive("jobs")
        assert got.body == {"a": ["é", 1.5, None]}
        async with client._borrow() as own:
            assert own.adapters.get_loader(3802, Format.TEXT) is decode.JsonbLoader
    finally:
        await client.close()


async def test_own_pool_stays_listening_between_long_polls(clean: str) -> None:
    """As Client's: the LISTEN stays, one channel at a time, the lend check drains."""
    client = await AsyncClient.open(clean, min_size=1, max_size=1, sweep_interval=None)
    try:
        await client.create_queue("jobs")
        await client.create_queue("other")
        pool = client._pool
        assert pool is not None

        async def listening() -> list[str]:
            async with pool.connection() as c:
                cur = await c.execute("SELECT pg_listening_channels()")
                return [r[0] for r in await cur.fetchall()]

        assert await client.receive("jobs", wait=0.1) == []
        assert await listening() == [await client.channel("jobs")]
        for i in range(20):
            await client.send("jobs", i)
            await asyncio.sleep(0.003)
        async with pool.connection() as c:
            assert [n async for n in c.notifies(timeout=0.05)] == []
        assert len(await client.receive("jobs", 20, wait=1)) == 20
        await woken_by_send(client, clean, "late", after=0.2)  # by the kept LISTEN
        assert await client.receive("other", wait=0.1) == []
        assert await listening() == [await client.channel("other")]
    finally:
        await client.close()


async def test_open_lazily_and_on_a_borrowed_pool(clean: str) -> None:
    lazy = AsyncClient(clean, sweep_interval=None)  # opens its pool on first use
    try:
        await lazy.create_queue("jobs")
        assert (await lazy.stats("jobs")).visible == 0
    finally:
        await lazy.close()
    opened = await AsyncClient.open(clean, sweep_interval=None)
    try:
        await opened.send("jobs", 1)
    finally:
        await opened.close()
    async with AsyncConnectionPool(clean, min_size=1, max_size=2, open=False) as pool:
        client = AsyncClient(pool, sweep_interval=None)
        [m] = await client.receive("jobs", wait=1)
        assert m.body == 1
        await client.close()  # a borrowed pool stays open
        assert not pool.closed
        async with pool.connection() as c:
            cur = await c.execute("SELECT count(*) FROM pg_listening_channels()")
            assert await cur.fetchone() == (0,)
    with pytest.raises(TypeError):
        AsyncClient(42)  # type: ignore[arg-type]
