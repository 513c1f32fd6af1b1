"""What only AsyncClient has to show: many long polls in one event loop, its own pool's loader and
kept LISTEN, lazy opening and borrowed pools. Everything both clients do is in tests/client/,
which runs each test against Client and AsyncClient."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg.pq import Format
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from queue_pg import (
    AsyncClient,
    decode,
)


@pytest.fixture
async def aclient(clean: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(clean, sweep_interval=None) as c:
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
    poll began; a woken poll ends within 0.11 s of the commit on a loaded 2-core machine). The
    poll may wait 20 s, so a sender held up by the load makes it late, not empty. Returns when
    the poll started and ended and when the send committed."""
    sender = asyncio.create_task(send_later(dsn, "jobs", body, after=after))
    start = time.monotonic()
    got = await client.receive("jobs", wait=20)
    end = time.monotonic()
    committed = await sender
    assert [m.body for m in got] == [body]
    assert end - committed < 0.6
    return start, end, committed


async def test_concurrent_long_polls_share_one_message(aclient: AsyncClient, clean: str) -> None:
    await aclient.create_queue("jobs")
    sender = asyncio.create_task(send_later(clean, "jobs", "only", after=0.15))
    results = await asyncio.gather(*(aclient.receive("jobs", wait=1) for _ in range(4)))
    await sender
    assert sorted(len(r) for r in results) == [0, 0, 0, 1]


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
