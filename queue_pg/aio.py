"""The asyncio twin of :class:`queue_pg.Client`: same methods, same SQL (from ``_ops``), awaited.

Open it with ``await AsyncClient.open(dsn)`` or ``async with AsyncClient(dsn) as client``; a
client used without either opens its pool on first use.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from queue_pg import _ops, _retry
from queue_pg._ops import Call
from queue_pg.client import _merge_conninfo, _safe_dsn
from queue_pg.errors import translate
from queue_pg.types import (
    JSON,
    DeleteResult,
    Grant,
    Message,
    QueueConfig,
    QueueStats,
    Seconds,
    seconds,
)

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

    from queue_pg.migrate import MigrationResult
    from queue_pg.types import QueueSettings

__all__ = ["AsyncClient"]

logger = logging.getLogger("queue_pg")

T = TypeVar("T")
AsyncConnection = psycopg.AsyncConnection[Any]


async def _configure(conn: AsyncConnection) -> None:
    """Each new connection of the client's own pool: the faster jsonb loader (see _ops)."""
    _ops.fast_jsonb(conn.adapters)


async def _execute(conn: AsyncConnection, call: Call[T]) -> T:
    """Run one Call on ``conn`` and decode its rows (no commit, no error translation)."""
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(call.query, call.params or None)
        columns = _ops.columns(cur.pgresult)
        rows = await cur.fetchall() if columns is not None else []
    return call.decode(columns or (), rows)


@asynccontextmanager
async def _contained(conn: AsyncConnection, *, own: bool) -> AsyncIterator[None]:
    """Async twin of ``client._contained``: an error in the block leaves the transaction of
    ``conn`` as it was (own connection: a transaction per block; caller's: a savepoint)."""
    if own:
        try:
            yield
        except BaseException:
            if not conn.autocommit and not conn.closed:
                await conn.rollback()
            raise
        if not conn.autocommit:
            await conn.commit()
        return
    status = conn.info.transaction_status
    if status == TransactionStatus.INTRANS:
        async with conn.transaction():
            yield
    elif status == TransactionStatus.IDLE and not conn.autocommit:
        try:
            yield
        except BaseException:
            if not conn.closed:
                await conn.rollback()
            raise
    else:
        yield


async def _resolve(value: Any) -> Any:
    """A pool's conninfo / kwargs: a value, or a sync or async callable returning it."""
    if callable(value):
        value = value()
        if inspect.isawaitable(value):
            value = await value
    return value


class AsyncClient:
    """Queue operations on a ``psycopg_pool.AsyncConnectionPool``.

    ``source`` is a DSN (the client owns a pool of autocommit connections, closed by
    :meth:`close`), an ``AsyncConnectionPool`` (borrowed: opened by its owner, never closed
    here), or None (``queue_pg.embedded.resolve_dsn``). Every method takes ``conn=``, a psycopg
    ``AsyncConnection``, to run inside the caller's transaction without committing it.
    """

    def __init__(
        self,
        source: str | AsyncConnectionPool[Any] | None = None,
        *,
        min_size: int = 1,
        max_size: int = 10,
        sweep_interval: float | None = 60.0,
    ) -> None:
        self._pool: AsyncConnectionPool[Any] | None = None
        self._dsn: str | None = None
        self._owns_pool = False
        self._opened = False
        self._open_lock = asyncio.Lock()
        self._min_size = min_size
        self._max_size = max_size
        if isinstance(source, AsyncConnectionPool):
            self._pool = source
            self._opened = True
        elif isinstance(source, str):
            self._dsn = source
        elif source is not None:
            raise TypeError(
                "AsyncClient source must be a DSN, a psycopg_pool.AsyncConnectionPool or None,"
                f" not {type(source).__name__}"
            )
        self._sweep_interval = sweep_interval
        self._woken: dict[str, float] = {}  # queue -> when its last NOTIFY arrived
        # own pooled connection -> the channel it still LISTENs on (see Client._listen)
        self._listening: weakref.WeakKeyDictionary[AsyncConnection, str] = (
            weakref.WeakKeyDictionary()
        )
        self._next_sweep = monotonic()
        # warns once when the server is lost, informs when it is back (see queue_pg._retry)
        self._outage = _retry.Outage(logging.getLogger("queue_pg.client"), "queue_pg async client")

    # --- lifecycle ------------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        source: str | AsyncConnectionPool[Any] | None = None,
        *,
        min_size: int = 1,
        max_size: int = 10,
        sweep_interval: float | None = 60.0,
    ) -> AsyncClient:
        """Create a client and open its pool (an async pool cannot open in a constructor)."""
        client = cls(source, min_size=min_size, max_size=max_size, sweep_interval=sweep_interval)
        await client._ensure_open()
        return client

    async def _ensure_open(self) -> AsyncConnectionPool[Any]:
        if self._opened and self._pool is not None:
            return self._pool
        async with self._open_lock:
            if self._pool is None:
                dsn = self._dsn
                if dsn is None:
                    from queue_pg.embedded import resolve_dsn

                    # may start the embedded server: keep the event loop free meanwhile
                    resolved, origin = await asyncio.to_thread(resolve_dsn, None)
                    logger.info("queue_pg: using %s (%s)", _safe_dsn(resolved), origin)
                    self._dsn = dsn = resolved
                # fail now with libpq's message rather than with a silent PoolTimeout later
                await (await psycopg.AsyncConnection.connect(dsn, connect_timeout=10)).close()
                self._pool = AsyncConnectionPool(
                    dsn,
                    min_size=self._min_size,
                    max_size=self._max_size,
                    kwargs={"autocommit": True},
                    open=False,
                    name="queue_pg",
                    check=self._check_lent,
                    configure=_configure,
                )
                self._owns_pool = True
                await self._pool.open()
            self._opened = True
            return self._pool

    async def close(self) -> None:
        """Close the pool if the client opened it; a borrowed pool stays open."""
        if self._owns_pool and self._pool is not None:
            await self._pool.close()

    async def __aenter__(self) -> Self:
        await self._ensure_open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def migrate(self) -> MigrationResult:
        """Upgrade the queue_pg schema to head (runs the synchronous migrator in a thread)."""
        from queue_pg.migrate import migrate

        pool = await self._ensure_open()
        if self._dsn is not None:
            conninfo = self._dsn
        else:
            conninfo = _merge_conninfo(await _resolve(pool.conninfo), await _resolve(pool.kwargs))
        return await asyncio.to_thread(migrate, conninfo)

    # --- plumbing -------------------------------------------------------------------------------

    @asynccontextmanager
    async def _borrow(self) -> AsyncIterator[AsyncConnection]:
        pool = await self._ensure_open()
        async with pool.connection() as conn:
            yield conn

    async def _check_lent(self, conn: AsyncConnection) -> None:
        """The pool's check of a connection it lends: a dead one is replaced (a listening one
        first drops its notifications, as in Client._check_lent)."""
        try:
            if conn in self._listening:
                async for _ in conn.notifies(timeout=0):
                    pass
            await _retry.acheck(conn)
        except Exception as exc:
            self._outage.failed(exc)
            raise

    @contextmanager
    def _watching(self) -> Iterator[None]:
        """Translate errors; note a lost server (warning) and its return (info)."""
        try:
            yield
        except psycopg.Error as exc:
            if _retry.is_connection_error(exc):
                self._outage.failed(exc)
            translate(exc)
        self._outage.recovered()

    async def _run(self, call: Call[T], conn: AsyncConnection | None) -> T:
        with self._watching():
            if conn is not None:
                return await _execute(conn, call)
            async with self._borrow() as own:
                return await _execute(own, call)

    # --- queues ---------------------------------------------------------------------------------

    async def create_queue(
        self, name: str, *, conn: AsyncConnection | None = None, **settings: Unpack[QueueSettings]
    ) -> QueueConfig:
        """Create a queue; a no-op if it exists with the same settings (else QueueAlreadyExists)."""
        return await self._run(_ops.create_queue(name, settings), conn)

    async def alter_queue(
        self,
        name: str,
        *,
        clear: Iterable[str] | None = None,
        conn: AsyncConnection | None = None,
        **settings: Unpack[QueueSettings],
    ) -> QueueConfig:
        """Change some settings; the rest stay. ``clear=["message_ttl"]`` sets settings to NULL."""
        return await self._run(_ops.alter_queue(name, settings, clear), conn)

    async def drop_queue(
        self, name: str, *, if_exists: bool = False, conn: AsyncConnection | None = None
    ) -> bool:
        return await self._run(_ops.drop_queue(name, if_exists), conn)

    async def list_queues(self, *, conn: AsyncConnection | None = None) -> list[QueueConfig]:
        return await self._run(_ops.list_queues(), conn)

    async def get_queue(self, name: str, *, conn: AsyncConnection | None = None) -> QueueConfig:
        return await self._run(_ops.get_queue(name), conn)

    async def channel(self, queue: str, *, conn: AsyncConnection | None = None) -> str:
        """The queue's LISTEN channel (not cached: a queue created again has another one)."""
        return await self._run(_ops.channel(queue), conn)

    # --- messages -------------------------------------------------------------------------------

    async def send(
        self,
        queue: str,
        body: JSON,
        *,
        delay: Seconds | None = None,
        ttl: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: AsyncConnection | None = None,
    ) -> int:
        return await self._run(
            _ops.send(queue, body, delay, ttl, attributes, debounce=conn is None), conn
        )

    async def send_batch(
        self,
        queue: str,
        bodies: Iterable[JSON],
        *,
        delay: Seconds | None = None,
        ttl: Seconds | None = None,
        attributes: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        conn: AsyncConnection | None = None,
    ) -> list[int]:
        return await self._run(
            _ops.send_batch(queue, bodies, delay, ttl, attributes, debounce=conn is None), conn
        )

    async def receive(
        self,
        queue: str,
        max_messages: int = 1,
        *,
        visibility_timeout: Seconds | None = None,
        wait: Seconds | None = None,
        delete: Sequence[str] | None = None,
        conn: AsyncConnection | None = None,
    ) -> list[Message]:
        """Lease up to ``max_messages`` messages; long-polls on LISTEN as Client.receive does;
        ``delete`` deletes a finished batch first, in the same transaction, as there."""
        with self._watching():
            if conn is not None:
                await self._maybe_sweep(None)
                return await self._receive(
                    conn, None, queue, max_messages, visibility_timeout, wait, delete
                )
            async with self._borrow() as own:
                await self._maybe_sweep(own)
                return await self._receive(
                    own, own, queue, max_messages, visibility_timeout, wait, delete
                )

    async def _receive(
        self,
        conn: AsyncConnection,
        own: AsyncConnection | None,
        queue: str,
        max_messages: int,
        visibility_timeout: Seconds | None,
        wait: Seconds | None,
        delete: Sequence[str] | None = None,
    ) -> list[Message]:
        start = monotonic()
        call = _ops.receive(queue, max_messages, visibility_timeout, wait, delete)
        is_own = own is not None

        async def attempt() -> list[Message]:
            if not is_own:
                return await _execute(conn, call)  # the caller's transaction: never commit it
            async with _contained(conn, own=True):
                return await _execute(conn, call)

        first = await attempt()
        if first or (wait is not None and seconds(wait) <= 0):
            return first
        call = _ops.receive(queue, max_messages, visibility_timeout, wait)  # deleted once
        if wait is not None:
            timeout = seconds(wait)
        else:
            async with _contained(conn, own=is_own):
                timeout = (await _execute(conn, _ops.get_queue(queue))).receive_wait
        if timeout <= 0:
            return first

        deadline = start + timeout
        async with self._listener(own) as listener:
            channel = await self.channel(queue, conn=listener)
            keep = self._owns_pool  # a caller's pool gets its connections back clean
            try:
                await self._listen(listener, channel, keep)
                woken = self._woken.get(queue)
                while True:
                    result = await attempt()
                    if result:
                        return result
                    remaining = deadline - monotonic()
                    if remaining <= 0:
                        return []
                    wake = min(remaining, _ops.RECHECK_INTERVAL)
                    follow = None if woken is None else woken + _ops.FOLLOW_UP - monotonic()
                    if follow is not None and follow > 0:  # once, just after the last NOTIFY
                        wake = min(wake, follow)
                    woken = None
                    async for _ in listener.notifies(timeout=wake, stop_after=1):
                        woken = self._woken[queue] = monotonic()
            finally:
                if not keep:
                    await self._unlisten(listener, channel)

    @asynccontextmanager
    async def _listener(self, own: AsyncConnection | None) -> AsyncIterator[AsyncConnection]:
        if own is not None:
            yield own
        else:
            async with self._borrow() as conn:
                yield conn

    async def _listen(self, listener: AsyncConnection, channel: str, keep: bool) -> None:
        """LISTEN on ``channel``; ``keep`` as in Client._listen."""
        if keep and self._listening.get(listener) == channel:
            async for _ in listener.notifies(timeout=0):
                pass
            return
        old = self._listening.pop(listener, None)
        if old is not None:
            await _execute(listener, _ops.unlisten(old))
        await _execute(listener, _ops.listen(channel))
        if not listener.autocommit:
            await listener.commit()  # LISTEN takes effect at commit
        if keep:
            self._listening[listener] = channel

    @staticmethod
    async def _unlisten(listener: AsyncConnection, channel: str) -> None:
        if listener.closed or listener.info.transaction_status not in (
            TransactionStatus.IDLE,
            TransactionStatus.INTRANS,
        ):
            return
        try:
            async with _contained(listener, own=True):
                await _execute(listener, _ops.unlisten(channel))
            async for _ in listener.notifies(timeout=0):
                pass
        except psycopg.Error:
            logger.debug("queue_pg: UNLISTEN %s failed", channel, exc_info=True)

    async def _maybe_sweep(self, own: AsyncConnection | None) -> None:
        """Sweep if sweep_interval has passed, never inside a caller's transaction; log errors."""
        if self._sweep_interval is None:
            return
        now = monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._sweep_interval
        try:
            if own is not None:
                async with _contained(own, own=True):
                    n = await _execute(own, _ops.sweep())
            else:
                async with self._borrow() as conn:
                    n = await _execute(conn, _ops.sweep())
            if n:
                logger.debug("queue_pg: sweep removed %d expired messages", n)
        except Exception:
            logger.warning("queue_pg: periodic sweep failed", exc_info=True)

    async def delete(
        self, queue: str, receipt: str, *, conn: AsyncConnection | None = None
    ) -> bool:
        return await self._run(_ops.delete(queue, receipt), conn)

    async def delete_batch(
        self, queue: str, receipts: Iterable[str], *, conn: AsyncConnection | None = None
    ) -> list[DeleteResult]:
        return await self._run(_ops.delete_batch(queue, receipts), conn)

    async def change_visibility(
        self,
        queue: str,
        receipt: str,
        timeout: Seconds,
        *,
        release: bool = False,
        conn: AsyncConnection | None = None,
    ) -> datetime:
        return await self._run(_ops.change_visibility(queue, receipt, timeout, release), conn)

    async def update(
        self,
        queue: str,
        receipt: str,
        *,
        body: JSON | None = None,
        visibility_timeout: Seconds | None = 0,
        attributes: Mapping[str, JSON] | None = None,
        conn: AsyncConnection | None = None,
    ) -> Message:
        return await self._run(
            _ops.update(queue, receipt, body, visibility_timeout, attributes), conn
        )

    async def dead_letter(
        self,
        queue: str,
        receipt: str,
        reason: str | None = None,
        *,
        conn: AsyncConnection | None = None,
    ) -> bool:
        return await self._run(_ops.dead_letter(queue, receipt, reason), conn)

    async def peek(
        self, queue: str, n: int = 1, *, conn: AsyncConnection | None = None
    ) -> list[Message]:
        return await self._run(_ops.peek(queue, n), conn)

    async def purge(self, queue: str, *, conn: AsyncConnection | None = None) -> int:
        return await self._run(_ops.purge(queue), conn)

    async def sweep(self, *, conn: AsyncConnection | None = None) -> int:
        return await self._run(_ops.sweep(), conn)

    async def stats(self, queue: str, *, conn: AsyncConnection | None = None) -> QueueStats:
        return await self._run(_ops.stats(queue), conn)

    async def redrive(
        self,
        dlq: str,
        *,
        to: str | None = None,
        limit: int | None = None,
        conn: AsyncConnection | None = None,
    ) -> int:
        return await self._run(_ops.redrive(dlq, to, limit), conn)

    # --- access ---------------------------------------------------------------------------------

    async def grant(
        self, queue: str, role: str, privilege: str, *, conn: AsyncConnection | None = None
    ) -> bool:
        return await self._run(_ops.grant(queue, role, privilege), conn)

    async def revoke(
        self, queue: str, role: str, privilege: str, *, conn: AsyncConnection | None = None
    ) -> bool:
        return await self._run(_ops.revoke(queue, role, privilege), conn)

    async def list_grants(
        self, queue: str | None = None, *, conn: AsyncConnection | None = None
    ) -> list[Grant]:
        return await self._run(_ops.list_grants(queue), conn)
