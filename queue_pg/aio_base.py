"""The asyncio client's connections: its pool, transactions, LISTEN and the long poll, sweeps.

The source of :mod:`queue_pg.client_base` (see :mod:`queue_pg.aio` and tools/unasync.py).
"""

from __future__ import annotations

import asyncio  # async-only
import inspect  # async-only
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from queue_pg import _ops, decode, outage  # async-only

# sync: from queue_pg import _ops, _sqla, decode, outage
from queue_pg._ops import Call
from queue_pg.dsn import checked_dsn, merge_conninfo, pooler_of, safe_dsn
from queue_pg.errors import InvalidParameter, QueueError, translate, translating
from queue_pg.longpoll import RECHECK_INTERVAL, LongPoll
from queue_pg.types import (
    Message,
    Seconds,
    StoredResult,
    seconds,
)

if TYPE_CHECKING:
    from typing_extensions import Self

    from queue_pg.install import MigrationResult

__all__ = ["AsyncClientBase", "AsyncConnection", "execute"]

logger = logging.getLogger("queue_pg")

T = TypeVar("T")
AsyncConnection = psycopg.AsyncConnection[Any]

_SOURCES = "a DSN, a psycopg_pool.AsyncConnectionPool or None"  # async-only
# sync: _SOURCES = "a DSN, a psycopg_pool.ConnectionPool, a SQLAlchemy Engine or None"


async def execute(conn: AsyncConnection, call: Call[T]) -> T:
    """Run one Call on ``conn`` and decode its rows (no commit, no error translation)."""
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(call.query, call.params or None)
        columns = decode.columns(cur.pgresult)
        rows = await cur.fetchall() if columns is not None else []
    return call.decode(columns or (), rows)


def _log_warning(diag: psycopg.errors.Diagnostic) -> None:
    """A server WARNING on a connection of the client's own (not every NOTICE): logged."""
    if diag.severity_nonlocalized == "WARNING":
        logger.warning("queue_pg: server says: %s", diag.message_primary)


async def _configure(conn: AsyncConnection) -> None:
    """Each new connection of the client's own pool: the faster jsonb loader (see decode)."""
    decode.fast_jsonb(conn.adapters)


@asynccontextmanager
async def _contained(conn: AsyncConnection, *, own: bool) -> AsyncIterator[None]:
    """Run a block so that an error in it leaves ``conn``'s transaction as it found it.

    Needed where an error is expected and handled (OverLimit during a long poll, a failed
    sweep) and the connection is used again afterwards. On the client's own connection each block
    is its own transaction. On the caller's connection the block becomes a savepoint inside the
    caller's transaction, and nothing is ever committed.
    """
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
        async with conn.transaction():  # a savepoint: psycopg nests inside the open transaction
            yield
    elif status == TransactionStatus.IDLE and not conn.autocommit:
        # The statement starts the caller's transaction; if it fails, nothing else is in it.
        try:
            yield
        except BaseException:
            if not conn.closed:
                await conn.rollback()
            raise
    else:
        yield


async def _resolve(value: Any) -> Any:
    """A pool's conninfo / kwargs: a value, or a callable returning it."""
    if callable(value):
        value = value()
        if inspect.isawaitable(value):  # async-only
            value = await value  # async-only
    return value


class _OwnPool(AsyncConnectionPool[Any]):
    """The client's own pool: reconnects with its backoff capped at ``reconnect_max``."""

    def __init__(self, conninfo: str, *, reconnect_max: float, **kwargs: Any) -> None:
        self.reconnect_max = reconnect_max
        super().__init__(conninfo, **kwargs)

    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        if attempt is None:
            attempt = outage.CappedAttempt(timeout=self.reconnect_timeout, cap=self.reconnect_max)
        await super()._add_connection(attempt, growing)


class AsyncClientBase:
    """What both clients do besides calling SQL: own or borrow connections, keep their
    transactions whole, long-poll on LISTEN, sweep now and then, notice a lost server."""

    def __init__(
        self,
        source: str | AsyncConnectionPool[Any] | None = None,  # async-only
        # sync: source: str | ConnectionPool[Any] | _sqla.Engine | None = None,
        *,
        min_size: int = 1,
        max_size: int = 10,
        sweep_interval: float | None = 60.0,
        pooler: str | None = None,
        listen_dsn: str | None = None,
        pool_timeout: float | None = None,
        reconnect_max: float | None = None,
    ) -> None:
        # what sits between this client and PostgreSQL (queue_pg.dsn.POOLERS): the argument, the
        # DSN's queue_pg_pooler option, or QUEUE_PG_POOLER; and a DSN that reaches the server
        # directly for LISTEN (a transaction pooler's connections never hear a NOTIFY)
        dsn, self._pooler = pooler_of(pooler, source if isinstance(source, str) else None)
        self._pooler_given = pooler
        self._listen_dsn = listen_dsn or os.environ.get("QUEUE_PG_LISTEN_DSN") or None
        self._listen_pool: AsyncConnectionPool[Any] | None = None
        self._warned_no_listen = False
        self._pool: AsyncConnectionPool[Any] | None = None
        # sync: self._engine: _sqla.Engine | None = None
        self._dsn: str | None = None
        self._owns_pool = False
        self._opened = False
        self._open_lock = asyncio.Lock()  # async-only
        # sync: self._open_lock = threading.Lock()
        self._min_size = min_size
        self._max_size = max_size
        # how long a call waits for a pooled connection (e.g. during an outage) before it fails,
        # and the longest pause between the pool's reconnect attempts
        self._pool_timeout = outage.client_setting(pool_timeout, "QUEUE_PG_POOL_TIMEOUT", 30.0)
        self._reconnect_max = outage.client_setting(reconnect_max, "QUEUE_PG_RECONNECT_MAX", 1.0)
        # warns once when the server is lost, informs when it is back (see queue_pg.outage)
        self._outage = outage.Outage(logging.getLogger("queue_pg.client"), "queue_pg client")
        if isinstance(source, AsyncConnectionPool):
            self._pool = source
            self._opened = True
        # sync: elif _sqla.is_engine(source):
        # sync:     self._engine = source
        # sync:     self._opened = True
        elif source is None or isinstance(source, str):
            self._dsn = dsn
        else:
            raise TypeError(f"{type(self).__name__} source must be {_SOURCES},"
                            f" not {type(source).__name__}")
        self._sweep_interval = sweep_interval
        self._woken: dict[str, float] = {}  # queue -> when its last NOTIFY arrived
        # own pooled connection -> the channel it still LISTENs on (see _listen)
        self._listening: weakref.WeakKeyDictionary[AsyncConnection, str] = (
            weakref.WeakKeyDictionary()
        )
        self._next_sweep = monotonic()
        self._sweep_lock = threading.Lock()
        # sync: self._ensure_open()  # a wrong DSN fails here, with libpq's own message

    # --- lifecycle ------------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        source: str | AsyncConnectionPool[Any] | None = None,  # async-only
        # sync: source: str | ConnectionPool[Any] | _sqla.Engine | None = None,
        *,
        min_size: int = 1,
        max_size: int = 10,
        sweep_interval: float | None = 60.0,
        pooler: str | None = None,
        listen_dsn: str | None = None,
        pool_timeout: float | None = None,
        reconnect_max: float | None = None,
    ) -> Self:
        """Create a client and open its pool (the async client cannot in its constructor)."""
        client = cls(source, min_size=min_size, max_size=max_size, sweep_interval=sweep_interval,
                     pooler=pooler, listen_dsn=listen_dsn, pool_timeout=pool_timeout,
                     reconnect_max=reconnect_max)
        await client._ensure_open()
        return client

    async def _ensure_open(self) -> None:
        """Open the client's own pool unless it is open (or borrowed)."""
        if self._opened:
            return
        async with self._open_lock:
            if self._pool is None:
                dsn = self._dsn
                if dsn is None:
                    from queue_pg.embedded import resolve_dsn

                    # may start the embedded server: keep the event loop free meanwhile
                    resolved, origin = await asyncio.to_thread(resolve_dsn, None)  # async-only
                    # sync: resolved, origin = resolve_dsn(None)
                    logger.info("queue_pg: using %s (%s)", safe_dsn(resolved), origin)
                    dsn, self._pooler = pooler_of(self._pooler_given, resolved)
                    assert dsn is not None
                    self._dsn = dsn
                dsn = checked_dsn(dsn)
                # One direct connection first: a wrong DSN fails now with libpq's own message,
                # instead of a pool retrying in the background until a PoolTimeout says nothing.
                with translating():
                    await (await psycopg.AsyncConnection.connect(
                        dsn, connect_timeout=10, **self._connect_kwargs())).close()
                pool = _OwnPool(
                    dsn,
                    reconnect_max=self._reconnect_max,
                    timeout=self._pool_timeout,
                    min_size=self._min_size,
                    max_size=self._max_size,
                    kwargs={"autocommit": True, **self._connect_kwargs()},
                    open=False,
                    name="queue_pg",
                    check=self._check_lent,
                    configure=_configure,
                )
                await pool.open()
                self._pool = pool
                self._owns_pool = True
            self._opened = True

    async def close(self) -> None:
        """Close the pool if the client opened it; a borrowed pool or engine stays open."""
        if self._listen_pool is not None:
            await self._listen_pool.close()
        if self._owns_pool and self._pool is not None:
            await self._pool.close()

    @property
    def _transaction_pooler(self) -> bool:
        return self._pooler == "transaction"

    def _connect_kwargs(self) -> dict[str, Any]:
        """Behind a transaction pooler, no server-side prepared statements: the next
        transaction may run on another client's server session, where a statement of the same
        name is another client's (PgBouncer without max_prepared_statements)."""
        return {"prepare_threshold": None} if self._transaction_pooler else {}

    async def __aenter__(self) -> Self:
        await self._ensure_open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _check_lent(self, conn: AsyncConnection) -> None:
        """The pool's check of a connection it lends: a dead one (server restarted) is
        replaced, and the pool reconnects with backoff; costs a poll() when alive. A connection
        still listening (see _listen) first drops the notifications it has read or been sent,
        so they neither pile up nor make it look dead."""
        try:
            if conn in self._listening:
                async for _ in conn.notifies(timeout=0):
                    pass
            await outage.acheck(conn)
        except Exception as exc:
            self._outage.failed(exc)
            # the server went away: its other idle connections are dead too. Drop them now, so
            # that the pool's growing pauses between failed checks do not delay the recovery.
            if self._pool is not None:
                await self._pool.check()
            raise

    @contextmanager
    def _watching(self) -> Iterator[None]:
        """Translate errors; note a lost server (warning) and its return (info)."""
        try:
            yield
        except psycopg.Error as exc:
            if outage.is_connection_error(exc):
                self._outage.failed(exc)
            translate(exc)
        except RecursionError as exc:  # json.dumps of a value nested past Python's recursion
            raise InvalidParameter(f"a JSON value is nested too deep to encode: {exc}") from exc
        self._outage.recovered()

    async def _conninfo(self) -> str:
        """A libpq DSN (with password) for the pool's server."""
        await self._ensure_open()
        if self._dsn is not None:
            return self._dsn
        assert self._pool is not None
        pool = self._pool  # conninfo and kwargs may be given as callables
        return merge_conninfo(await _resolve(pool.conninfo), await _resolve(pool.kwargs))

    async def migrate(self) -> MigrationResult:
        """Upgrade the queue_pg schema to head (Alembic, version table in schema queue_pg).

        Safe on every start and from many processes: migrations serialise on an advisory lock.
        The async client runs the migrator in a thread.
        """
        from queue_pg.install import migrate

        # sync: if self._engine is not None:
        # sync:     return migrate(self._engine)
        conninfo = await self._conninfo()
        return await asyncio.to_thread(migrate, conninfo)  # async-only
        # sync: return migrate(conninfo)

    # --- plumbing -------------------------------------------------------------------------------

    @asynccontextmanager
    async def _borrow(self) -> AsyncIterator[AsyncConnection]:
        """A connection of the client's own; committed on success, rolled back on error."""
        # sync: if self._engine is not None:
        # sync:     with _sqla.engine_connection(self._engine) as conn:
        # sync:         yield conn
        # sync:     return
        await self._ensure_open()
        assert self._pool is not None
        async with self._pool.connection() as conn:
            if self._transaction_pooler:  # a borrowed pool's connections too
                conn.prepare_threshold = None
            yield conn

    @asynccontextmanager
    async def _dedicated(self) -> AsyncIterator[AsyncConnection]:
        """A connection of its own, in no pool, autocommit, closed at the end: for what lives
        as long as a session does (a consumer's registration lock must never go back to a pool
        with the connection)."""
        # sync: if self._engine is not None:
        # sync:     with _sqla.detached_connection(self._engine) as conn:
        # sync:         yield conn
        # sync:     return
        conninfo = await self._conninfo()
        with translating():
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True,
                                                         **self._connect_kwargs())
        conn.add_notice_handler(_log_warning)  # e.g. register_consumer's
        try:
            yield conn
        finally:
            await conn.close()

    async def _run(self, call: Call[T], conn: AsyncConnection | None) -> T:
        """One statement: on the caller's connection as is, else on a borrowed one."""
        with self._watching():
            if conn is not None:
                return await execute(conn, call)
            async with self._borrow() as own:
                return await execute(own, call)

    # --- receiving ----------------------------------------------------------------------------

    async def _receive(
        self,
        conn: AsyncConnection,
        own: AsyncConnection | None,
        queue: str,
        wait: Seconds | None,
        call: Call[list[Message]],
        again: Callable[[], Call[list[Message]]],
    ) -> list[Message]:
        """Receive on ``conn``; ``own`` is conn when it is the client's (else the caller's)."""
        start = monotonic()
        is_own = own is not None

        async def attempt() -> list[Message]:
            if not is_own:
                return await execute(conn, call)  # the caller's transaction: never commit it
            async with _contained(conn, own=True):
                return await execute(conn, call)

        first = await attempt()
        if first or (wait is not None and seconds(wait) <= 0):
            return first
        if call.params["delete"] is not None:
            call = again()
        if wait is not None:
            timeout = seconds(wait)
        else:
            async with _contained(conn, own=is_own):
                timeout = (await execute(conn, _ops.get_queue(queue))).receive_wait
        if timeout <= 0:
            return first

        if self._transaction_pooler and self._listen_dsn is None:
            # no NOTIFY reaches a transaction pooler's client: look again every second
            if not self._warned_no_listen:
                self._warned_no_listen = True
                logger.warning("queue_pg: behind a transaction pooler without a listen DSN"
                               " (QUEUE_PG_LISTEN_DSN): long polls look again every %.3gs"
                               " instead of waking on NOTIFY", RECHECK_INTERVAL)
            poll = LongPoll(start, timeout)
            while True:
                wake = poll.fruitless(monotonic())
                if wake is None:
                    return []
                await asyncio.sleep(wake)  # async-only
                # sync: threading.Event().wait(wake)  # a sleep
                result = await attempt()
                if result:
                    return result

        async with self._listener(own) as listener:
            channel = await self._run(_ops.channel(queue), listener)
            # a caller's pool or engine gets its connections back clean
            keep = self._owns_pool or self._listen_dsn is not None
            try:
                await self._listen(listener, channel, keep)
                poll = LongPoll(start, timeout, self._woken.get(queue))
                while True:
                    result = await attempt()
                    if result:
                        return result
                    wake = poll.fruitless(monotonic())
                    if wake is None:
                        return []
                    notified = None
                    async for _ in listener.notifies(timeout=wake, stop_after=1):
                        notified = self._woken[queue] = monotonic()
                    if notified is not None:
                        hold = poll.notified(notified)
                        if hold > 0:  # after a NOTIFY for nothing: one look for all that follow
                            async for _ in listener.notifies(timeout=hold):
                                pass
            finally:
                if not keep:
                    await self._unlisten(listener, channel)

    async def _wait_result(
        self, queues: Sequence[str], id: int, timeout: float
    ) -> StoredResult:
        """The result of message ``id`` in the first of ``queues`` that has one, waiting on
        the queues' result channels up to ``timeout`` seconds (re-checking every second, and
        behind a transaction pooler without a listen DSN only that); at the deadline, the
        status then (PENDING or RETRY)."""
        deadline = monotonic() + timeout
        async with self._listener(None) as listener:
            listened: list[str] = []
            try:
                if not (self._transaction_pooler and self._listen_dsn is None):
                    for q in queues:
                        channel = await self._run(_ops.task_result_channel(q), listener)
                        await execute(listener, _ops.listen(channel))
                        listened.append(channel)
                    if not listener.autocommit:
                        await listener.commit()  # LISTEN takes effect at commit
                while True:
                    for q in queues:  # after the LISTEN: a result kept before it is seen here
                        found = await self._run(_ops.task_result(q, id), listener)
                        if found.status in ("SUCCESS", "FAILURE"):
                            return found
                    wake = min(deadline - monotonic(), RECHECK_INTERVAL)
                    if wake <= 0:
                        return found
                    async for _ in listener.notifies(timeout=wake, stop_after=1):
                        pass
            finally:
                for channel in listened:
                    await self._unlisten(listener, channel)

    @asynccontextmanager
    async def _listener(self, own: AsyncConnection | None) -> AsyncIterator[AsyncConnection]:
        """The connection to LISTEN on: one of the listen DSN's (it reaches the server
        directly), else the one already borrowed, or (for a caller's connection, whose
        transaction would hold notifications back) a borrowed one."""
        if self._listen_dsn is not None:
            if self._listen_pool is None:
                pool = AsyncConnectionPool(
                    self._listen_dsn, min_size=0, max_size=self._max_size,
                    kwargs={"autocommit": True}, open=False, name="queue_pg_listen",
                    check=self._check_lent)
                await pool.open()
                self._listen_pool = pool
            async with self._listen_pool.connection() as conn:
                yield conn
        elif own is not None:
            yield own
        else:
            async with self._borrow() as conn:
                yield conn

    async def _listen(self, listener: AsyncConnection, channel: str, keep: bool) -> None:
        """LISTEN on ``channel``. ``keep``: the connection is the client's own and stays
        listening after the poll, so the next poll on it skips the LISTEN and the woken poll
        returns without an UNLISTEN round trip on its way (the lend check drops what arrives
        meanwhile). A kept connection listens on one channel at a time."""
        if keep and self._listening.get(listener) == channel:
            # Announced before the attempt that follows, which will see those messages.
            async for _ in listener.notifies(timeout=0):
                pass
            return
        old = self._listening.pop(listener, None)
        if old is not None:
            await execute(listener, _ops.unlisten(old))
        await execute(listener, _ops.listen(channel))
        if not listener.autocommit:
            await listener.commit()  # LISTEN takes effect at commit
        if keep:
            self._listening[listener] = channel

    @staticmethod
    async def _unlisten(listener: AsyncConnection, channel: str) -> None:
        """UNLISTEN and drop queued notifications, so the pooled connection goes back clean."""
        if listener.closed or listener.info.transaction_status not in (
            TransactionStatus.IDLE,
            TransactionStatus.INTRANS,
        ):
            return  # broken or mid-error: the pool discards or resets it
        try:
            async with _contained(listener, own=True):
                await execute(listener, _ops.unlisten(channel))
            async for _ in listener.notifies(timeout=0):
                pass
        except psycopg.Error:
            logger.debug("queue_pg: UNLISTEN %s failed", channel, exc_info=True)

    async def _maybe_sweep(self, own: AsyncConnection | None) -> None:
        """Sweep expired messages if sweep_interval has passed; log, never raise, on failure.

        Runs on the client's connection (``own``, or a borrowed one): never inside a caller's
        transaction, which a failed sweep would abort.
        """
        if self._sweep_interval is None:
            return
        now = monotonic()
        with self._sweep_lock:
            if now < self._next_sweep:
                return
            self._next_sweep = now + self._sweep_interval
        try:
            if own is not None:
                async with _contained(own, own=True):
                    n, said = await _sweep(own)
            else:
                async with self._borrow() as conn:
                    n, said = await _sweep(conn)
            if n:
                logger.debug("queue_pg: sweep removed %d expired messages", n)
            for line in said:  # the chords it removed (sql/api/54_task_steps.sql)
                logger.info("%s", line)
        except Exception as exc:
            why = _ours(exc)  # ours: one line says it all; anything else with its traceback
            logger.warning("queue_pg: periodic sweep failed: %s", why,
                           exc_info=None if isinstance(why, QueueError) else why)


async def _sweep(conn: AsyncConnection) -> tuple[int, list[str]]:
    """One sweep on ``conn``: how many expired messages it removed, and the NOTICEs it gave
    (what else it removed that a user may miss: chords whose callback can never run)."""
    said: list[str] = []

    def hear(diag: psycopg.errors.Diagnostic) -> None:
        if diag.severity_nonlocalized == "NOTICE" and diag.message_primary:
            said.append(diag.message_primary)

    conn.add_notice_handler(hear)
    try:
        return await execute(conn, _ops.sweep()), said
    finally:
        conn.remove_notice_handler(hear)


def _ours(exc: BaseException) -> BaseException:
    """A psycopg error as its queue_pg class (with its hint) when it has one, else itself."""
    if isinstance(exc, psycopg.Error):
        try:
            translate(exc)
        except Exception as mapped:
            return mapped
    return exc
