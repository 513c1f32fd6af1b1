"""The AsyncClient driven from synchronous test code, so one test body checks both clients.

An event loop runs in a thread of its own; :class:`BlockingClient` runs each AsyncClient method
there and waits for it, and :class:`BlockingConnection` does the same for a psycopg
AsyncConnection (raw SQL in a test, and ``conn=`` handed to the client: it is unwrapped).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg

from queue_pg import AsyncClient

T = TypeVar("T")


class Loop:
    """An event loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Result:
    """A fetched cursor: what tests read of ``conn.execute(...)``."""

    def __init__(self, rows: list[Any], description: Any, rowcount: int) -> None:
        self.rows, self.description, self.rowcount = rows, description, rowcount

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)


class BlockingConnection:
    """A psycopg AsyncConnection used like a sync one."""

    def __init__(self, loop: Loop, aconn: psycopg.AsyncConnection[Any]) -> None:
        self.loop, self.aconn = loop, aconn

    def execute(self, query: Any, params: Any = None) -> Result:
        async def run() -> Result:
            cur = await self.aconn.execute(query, params)
            rows = await cur.fetchall() if cur.description else []
            return Result(rows, cur.description, cur.rowcount)

        return self.loop.run(run())

    def notifies(self, **kwargs: Any) -> list[psycopg.Notify]:
        async def collect() -> list[psycopg.Notify]:
            return [n async for n in self.aconn.notifies(**kwargs)]

        return self.loop.run(collect())

    def commit(self) -> None:
        self.loop.run(self.aconn.commit())

    def rollback(self) -> None:
        self.loop.run(self.aconn.rollback())

    @contextmanager
    def transaction(self) -> Iterator[None]:
        tx = self.aconn.transaction()
        self.loop.run(tx.__aenter__())
        try:
            yield
        except BaseException as exc:
            self.loop.run(tx.__aexit__(type(exc), exc, exc.__traceback__))
            raise
        self.loop.run(tx.__aexit__(None, None, None))

    def __enter__(self) -> BlockingConnection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.loop.run(self.aconn.__aexit__(*exc))  # commit or roll back, as psycopg's do

    def __getattr__(self, name: str) -> Any:
        return getattr(self.aconn, name)


class BlockingClient:
    """An AsyncClient whose coroutine methods are called and waited for."""

    def __init__(self, loop: Loop, client: AsyncClient) -> None:
        self.loop, self.client = loop, client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if isinstance(kwargs.get("conn"), BlockingConnection):
                kwargs["conn"] = kwargs["conn"].aconn
            return self.loop.run(attr(*args, **kwargs))

        return call
