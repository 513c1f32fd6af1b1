"""The synchronous client: a thin typed layer over the SQL functions of schema ``queue_pg``.

Every method runs one statement built by :mod:`queue_pg._ops`. The only logic of its own is what
cannot live in SQL: borrowing connections, waiting for a message on LISTEN instead of letting the
server sleep-poll, and sweeping expired messages now and then.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool

from queue_pg import _ops, _retry
from queue_pg._ops import Call
from queue_pg._sqla import join
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
    from sqlalchemy.engine import Engine
    from typing_extensions import Unpack

    from queue_pg._sqla import SessionLike
    from queue_pg.migrate import MigrationResult
    from queue_pg.types import QueueSettings

__all__ = ["Client"]

logger = logging.getLogger("queue_pg")
client_logger = logging.getLogger("queue_pg.client")

T = TypeVar("T")
Connection = psycopg.Connection[Any]


def _execute(conn: Connection, call: Call[T]) -> T:
    """Run one Call on ``conn`` and decode its rows (no commit, no error translation)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(call.query, call.params or None)
        columns = _ops.columns(cur.pgresult)
        rows = cur.fetchall() if columns is not None else []
    return call.decode(columns or (), rows)


def _configure(conn: Connection) -> None:
    """Each new connection of the client's own pool: the faster jsonb loader (see _ops)."""
    _ops.fast_jsonb(conn.adapters)


@contextmanager
def _contained(conn: Connection, *, own: bool) -> Iterator[None]:
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
                conn.rollback()
            raise
        if not conn.autocommit:
            conn.commit()
        return
    status = conn.info.transaction_status
    if status == TransactionStatus.INTRANS:
        with conn.transaction():  # a savepoint: psycopg nests inside the open transaction
            yield
    elif status == TransactionStatus.IDLE and not conn.autocommit:
        # The statement starts the caller's transaction; if it fails, nothing else is in it.
        try:
            yield
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise
    else:
        yield


def _is_engine(obj: object) -> bool:
    try:
        from sqlalchemy.engine import Engine
    except ImportError:  # pragma: no cover - sqlalchemy is optional for the client
        return False
    return isinstance(obj, Engine)


def _merge_conninfo(conninfo: str, kwargs: Mapping[str, Any] | None) -> str:
    """A libpq DSN for a pool's server: its conninfo plus the connection-string kwargs."""
    not_conninfo = {"autocommit", "prepare_threshold", "row_factory", "cursor_factory", "context"}
    extra = {k: v for k, v in (kwargs or {}).items() if k not in not_conninfo}
    return psycopg.conninfo.make_conninfo(conninfo, **extra)


def _safe_dsn(dsn: str) -> str:
    """The DSN without its password, for logs."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


class Client:
    """Queue operations over a connection pool, a caller's pool, or a SQLAlchemy engine.

    ``source`` is a DSN (the client opens and owns a pool of autocommit connections, closed by
    :meth:`close` or ``with``), a ``psycopg_pool.ConnectionPool`` (borrowed, never closed), a
    SQLAlchemy ``Engine`` on the ``postgresql+psycopg`` driver (raw connections borrowed and
    committed after each call), or None (``queue_pg.embedded.resolve_dsn``: ``QUEUE_PG_DSN`` or
    the embedded server).

    Every method takes ``conn=``, a psycopg connection: the statement then runs on it inside the
    caller's transaction and is never committed by the client, so enqueueing can be atomic with
    the caller's own writes. ``send`` and ``send_batch`` also take ``session=``, a SQLAlchemy
    Session or Connection, whose transaction they join the same way.

    ``sweep_interval`` (seconds, None = never): how often a receive also sweeps expired messages,
    so a queue nobody sweeps by hand still sheds them.
    """

    def __init__(
        self,
        source: str | ConnectionPool[Any] | Engine | None = None,
        *,
        min_size: int = 1,
        max_size: int = 10,
        sweep_interval: float | None = 60.0,
    ) -> None:
        self._pool: ConnectionPool[Any] | None = None
        self._engine: Engine | None = None
        self._owns_pool = False
        self._dsn: str | None = None
        # warns once when the server is lost, informs when it is back (see queue_pg._retry)
        self._outage = _retry.Outage(client_logger, "queue_pg client")
        if source is None:
            from queue_pg.embedded import resolve_dsn

            source, origin = resolve_dsn(None)
            logger.info("queue_pg: using %s (%s)", _safe_dsn(source), origin)
        if isinstance(source, str):
            self._dsn = source
            # One direct connection first: a wrong DSN fails now with libpq's own message,
            # instead of a pool retrying in the background until a PoolTimeout says nothing.
            psycopg.connect(source, connect_timeout=10).close()
            self._pool = ConnectionPool(
                source,
                min_size=min_size,
                max_size=max_size,
                kwargs={"autocommit": True},
                open=True,
                name="queue_pg",
                check=self._check_lent,
                configure=_configure,
            )
            self._owns_pool = True
        elif isinstance(source, ConnectionPool):
            self._pool = source
        elif _is_engine(source):
            self._engine = source
        else:
            raise TypeError(
                "Client source must be a DSN, a psycopg_pool.ConnectionPool, a SQLAlchemy"
                f" Engine or None, not {type(source).__name__}"
            )
        self._sweep_interval = sweep_interval
        self._woken: dict[str, float] = {}  # queue -> when its last NOTIFY arrived
        # own pooled connection -> the channel it still LISTENs on (see _listen)
        self._listening: weakref.WeakKeyDictionary[Connection, str] = weakref.WeakKeyDictionary()
        self._next_sweep = monotonic()
        self._sweep_lock = threading.Lock()

    # --- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the pool if the client opened it; a borrowed pool or engine stays open."""
        if self._owns_pool and self._pool is not None:
            self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_lent(self, conn: Connection) -> None:
        """The pool's check of a connection it lends: a dead one (server restarted) is
        replaced, and the pool reconnects with backoff; costs a poll() when alive. A connection
        still listening (see _listen) first drops the notifications it has read or been sent,
        so they neither pile up nor make it look dead."""
        try:
            if conn in self._listening:
                for _ in conn.notifies(timeout=0):
                    pass
            _retry.check(conn)
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

    def _conninfo(self) -> str:
        """A libpq DSN (with password) for the pool's server."""
        if self._dsn is not None:
            return self._dsn
        assert self._pool is not None
        pool = self._pool  # conninfo and kwargs may be given as callables
        conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
        kwargs = pool.kwargs() if callable(pool.kwargs) else pool.kwargs
        return _merge_conninfo(conninfo, kwargs)

    def migrate(self) -> MigrationResult:
        """Upgrade the queue_pg schema to head (Alembic, version table in schema queue_pg).

        Safe on every start and from many processes: migrations serialise on an advisory lock.
        """
        from queue_pg.migrate import migrate

        return migrate(self._engine if self._engine is not None else self._conninfo())

    # --- plumbing -------------------------------------------------------------------------------

    @contextmanager
    def _borrow(self) -> Iterator[Connection]:
        """A connection of the client's own; committed on success, rolled back on error."""
        if self._pool is not None:
            with self._pool.connection() as conn:
                yield conn
            return
        assert self._engine is not None
        raw = self._engine.raw_connection()
        try:
            conn = raw.driver_connection
            if not isinstance(conn, psycopg.Connection):
                raise TypeError(
                    "queue_pg needs a SQLAlchemy engine on the psycopg 3 driver"
                    f" (postgresql+psycopg://), got {type(conn).__name__}"
                )
            try:
                yield conn
            except BaseException:
                if not conn.closed:
                    conn.rollback()
                raise
            conn.commit()
        finally:
            raw.close()

    def _run(self, call: Call[T], conn: Connection | None) -> T:
        """One statement: on the caller's connection as is, else on a borrowed one."""
        with self._watching():
            if conn is not None:
                return _execute(conn, call)
            with self._borrow() as own:
                return _execute(own, call)

    # --- queues ---------------------------------------------------------------------------------

    def create_queue(
        self, name: str, *, conn: Connection | None = None, **settings: Unpack[QueueSettings]
    ) -> QueueConfig:
        """Create a queue; a no-op if it exists with the same settings (else QueueAlreadyExists).

        Settings not given take SQL's defaults; ``message_ttl=None`` means messages never expire.
        """
        return self._run(_ops.create_queue(name, settings), conn)

    def alter_queue(
        self,
        name: str,
        *,
        clear: Iterable[str] | None = None,
        conn: Connection | None = None,
        **settings: Unpack[QueueSettings],
    ) -> QueueConfig:
        """Change some settings; the rest stay. ``clear=["message_ttl"]`` sets settings to NULL."""
        return self._run(_ops.alter_queue(name, settings, clear), conn)

    def drop_queue(
        self, name: str, *, if_exists: bool = False, conn: Connection | None = None
    ) -> bool:
        """Drop a queue and its messages. Missing: False with ``if_exists``, else QueueNotFound."""
        return self._run(_ops.drop_queue(name, if_exists), conn)

    def list_queues(self, *, conn: Connection | None = None) -> list[QueueConfig]:
        return self._run(_ops.list_queues(), conn)

    def get_queue(self, name: str, *, conn: Connection | None = None) -> QueueConfig:
        """The queue's settings; QueueNotFound if it does not exist."""
        return self._run(_ops.get_queue(name), conn)

    def channel(self, queue: str, *, conn: Connection | None = None) -> str:
        """The queue's LISTEN channel. Not cached: it follows the queue's id, so a queue dropped
        and created again under the same name has another one."""
        return self._run(_ops.channel(queue), conn)

    # --- messages -------------------------------------------------------------------------------

    def send(
        self,
        queue: str,
        body: JSON,
        *,
        delay: Seconds | None = None,
        ttl: Seconds | None = None,
        attributes: Mapping[str, Any] | None = None,
        conn: Connection | None = None,
        session: SessionLike | None = None,
    ) -> int:
        """Enqueue one message; returns its id. delay / ttl None = the queue's settings.

        ``session``: a SQLAlchemy Session or Connection whose transaction the message joins
        (psycopg 3 driver), like ``conn`` does for a psycopg connection."""
        target = join(conn, session)
        call = _ops.send(queue, body, delay, ttl, attributes, debounce=target is None)
        return self._run(call, target)

    def send_batch(
        self,
        queue: str,
        bodies: Iterable[JSON],
        *,
        delay: Seconds | None = None,
        ttl: Seconds | None = None,
        attributes: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        conn: Connection | None = None,
        session: SessionLike | None = None,
    ) -> list[int]:
        """Enqueue many messages in one statement (all or none); ids in input order.

        ``attributes``: one mapping for every message, or a list parallel to ``bodies``.
        ``session``: as for :meth:`send`.
        """
        target = join(conn, session)
        call = _ops.send_batch(queue, bodies, delay, ttl, attributes, debounce=target is None)
        return self._run(call, target)

    def receive(
        self,
        queue: str,
        max_messages: int = 1,
        *,
        visibility_timeout: Seconds | None = None,
        wait: Seconds | None = None,
        delete: Sequence[str] | None = None,
        conn: Connection | None = None,
    ) -> list[Message]:
        """Lease up to ``max_messages`` visible messages, each with a new receipt.

        ``wait`` (None = the queue's receive_wait) > 0 long-polls: if nothing is there, wait on
        the queue's LISTEN channel up to that long, re-checking at least every second (a delayed
        message coming due or a lapsed lease sends no NOTIFY). OverLimit is raised only by a
        short poll; a long poll treats it as "nothing yet".

        ``delete``: receipts of the previous batch, deleted in the same transaction before the
        receive (one round trip and one commit per batch). A stale or lapsed receipt among them
        is skipped and counted in ``stats().stale_receipts``; use :meth:`delete_batch` when each
        outcome matters. If the receive fails, the deletes are undone too.
        """
        with self._watching():
            if conn is not None:
                self._maybe_sweep(None)
                return self._receive(
                    conn, None, queue, max_messages, visibility_timeout, wait, delete
                )
            with self._borrow() as own:
                self._maybe_sweep(own)
                return self._receive(
                    own, own, queue, max_messages, visibility_timeout, wait, delete
                )

    def _receive(
        self,
        conn: Connection,
        own: Connection | None,
        queue: str,
        max_messages: int,
        visibility_timeout: Seconds | None,
        wait: Seconds | None,
        delete: Sequence[str] | None = None,
    ) -> list[Message]:
        """Receive on ``conn``; ``own`` is conn when it is the client's (else the caller's)."""
        start = monotonic()
        call = _ops.receive(queue, max_messages, visibility_timeout, wait, delete)
        is_own = own is not None

        def attempt() -> list[Message]:
            if not is_own:
                return _execute(conn, call)  # the caller's transaction: never commit it
            with _contained(conn, own=True):
                return _execute(conn, call)

        first = attempt()
        if first or (wait is not None and seconds(wait) <= 0):
            return first
        call = _ops.receive(queue, max_messages, visibility_timeout, wait)  # deleted once
        timeout = seconds(wait) if wait is not None else self._receive_wait(conn, is_own, queue)
        if timeout <= 0:
            return first

        deadline = start + timeout
        with self._listener(own) as listener:
            channel = self.channel(queue, conn=listener)
            keep = self._owns_pool  # a caller's pool or engine gets its connections back clean
            try:
                self._listen(listener, channel, keep)
                woken = self._woken.get(queue)
                while True:
                    result = attempt()
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
                    for _ in listener.notifies(timeout=wake, stop_after=1):
                        woken = self._woken[queue] = monotonic()
            finally:
                if not keep:
                    self._unlisten(listener, channel)

    def _receive_wait(self, conn: Connection, is_own: bool, queue: str) -> float:
        with _contained(conn, own=is_own):
            return _execute(conn, _ops.get_queue(queue)).receive_wait

    @contextmanager
    def _listener(self, own: Connection | None) -> Iterator[Connection]:
        """The connection to LISTEN on: the one already borrowed, or (for a caller's
        connection, whose transaction would hold notifications back) a borrowed one."""
        if own is not None:
            yield own
        else:
            with self._borrow() as conn:
                yield conn

    def _listen(self, listener: Connection, channel: str, keep: bool) -> None:
        """LISTEN on ``channel``. ``keep``: the connection is the client's own and stays
        listening after the poll, so the next poll on it skips the LISTEN and the woken poll
        returns without an UNLISTEN round trip on its way (the lend check drops what arrives
        meanwhile). A kept connection listens on one channel at a time."""
        if keep and self._listening.get(listener) == channel:
            # Announced before the attempt that follows, which will see those messages.
            for _ in listener.notifies(timeout=0):
                pass
            return
        old = self._listening.pop(listener, None)
        if old is not None:
            _execute(listener, _ops.unlisten(old))
        _execute(listener, _ops.listen(channel))
        if not listener.autocommit:
            listener.commit()  # LISTEN takes effect at commit
        if keep:
            self._listening[listener] = channel

    @staticmethod
    def _unlisten(listener: Connection, channel: str) -> None:
        """UNLISTEN and drop queued notifications, so the pooled connection goes back clean."""
        if listener.closed or listener.info.transaction_status not in (
            TransactionStatus.IDLE,
            TransactionStatus.INTRANS,
        ):
            return  # broken or mid-error: the pool discards or resets it
        try:
            with _contained(listener, own=True):
                _execute(listener, _ops.unlisten(channel))
            for _ in listener.notifies(timeout=0):
                pass
        except psycopg.Error:
            logger.debug("queue_pg: UNLISTEN %s failed", channel, exc_info=True)

    def _maybe_sweep(self, own: Connection | None) -> None:
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
                with _contained(own, own=True):
                    n = _execute(own, _ops.sweep())
            else:
                with self._borrow() as conn:
                    n = _execute(conn, _ops.sweep())
            if n:
                logger.debug("queue_pg: sweep removed %d expired messages", n)
        except Exception:
            logger.warning("queue_pg: periodic sweep failed", exc_info=True)

    def delete(self, queue: str, receipt: str, *, conn: Connection | None = None) -> bool:
        """Delete a received message. False if it is already gone (a retry is safe);
        StaleReceipt / InvalidReceipt if the receipt is not the current holder's."""
        return self._run(_ops.delete(queue, receipt), conn)

    def delete_batch(
        self, queue: str, receipts: Iterable[str], *, conn: Connection | None = None
    ) -> list[DeleteResult]:
        """Delete many; per-entry results instead of one error for the batch."""
        return self._run(_ops.delete_batch(queue, receipts), conn)

    def change_visibility(
        self,
        queue: str,
        receipt: str,
        timeout: Seconds,
        *,
        release: bool = False,
        conn: Connection | None = None,
    ) -> datetime:
        """Set the lease to end ``timeout`` from now (0 releases it); returns the new
        visible_until. LeaseLimitExceeded past max_lease from the receive. ``release=True``
        marks a planned retry: its return is not counted as a lease expiry."""
        return self._run(_ops.change_visibility(queue, receipt, timeout, release), conn)

    def update(
        self,
        queue: str,
        receipt: str,
        *,
        body: JSON | None = None,
        visibility_timeout: Seconds | None = 0,
        attributes: Mapping[str, JSON] | None = None,
        conn: Connection | None = None,
    ) -> Message:
        """Azure's Update Message: new visibility timeout (None keeps the lease) and
        optionally a new body (None keeps it) and attributes merged into the message's;
        the receipt stays valid."""
        return self._run(
            _ops.update(queue, receipt, body, visibility_timeout, attributes), conn
        )

    def dead_letter(
        self, queue: str, receipt: str, reason: str | None = None, *, conn: Connection | None = None
    ) -> bool:
        """Move the message to the queue's dead-letter queue now (work that can never
        succeed); ``reason`` goes to its attributes as ``dead_letter_reason``."""
        return self._run(_ops.dead_letter(queue, receipt, reason), conn)

    def peek(self, queue: str, n: int = 1, *, conn: Connection | None = None) -> list[Message]:
        """Visible messages without leasing them (receipt None)."""
        return self._run(_ops.peek(queue, n), conn)

    def purge(self, queue: str, *, conn: Connection | None = None) -> int:
        """Delete every message of the queue, in any state; returns how many."""
        return self._run(_ops.purge(queue), conn)

    def sweep(self, *, conn: Connection | None = None) -> int:
        """Delete expired messages now (one bounded batch); returns how many."""
        return self._run(_ops.sweep(), conn)

    def stats(self, queue: str, *, conn: Connection | None = None) -> QueueStats:
        return self._run(_ops.stats(queue), conn)

    def redrive(
        self,
        dlq: str,
        *,
        to: str | None = None,
        limit: int | None = None,
        conn: Connection | None = None,
    ) -> int:
        """Move dead-lettered messages back to their source queue (or ``to``); returns how many."""
        return self._run(_ops.redrive(dlq, to, limit), conn)

    # --- access ---------------------------------------------------------------------------------

    def grant(
        self, queue: str, role: str, privilege: str, *, conn: Connection | None = None
    ) -> bool:
        """Let ``role`` (and the roles that have its privileges) ``privilege`` the queue: "send",
        "receive" or "manage". True when granted now, False when it already was."""
        return self._run(_ops.grant(queue, role, privilege), conn)

    def revoke(
        self, queue: str, role: str, privilege: str, *, conn: Connection | None = None
    ) -> bool:
        """Take a grant back; True when it existed."""
        return self._run(_ops.revoke(queue, role, privilege), conn)

    def list_grants(
        self, queue: str | None = None, *, conn: Connection | None = None
    ) -> list[Grant]:
        """The grants of ``queue`` (None: of every queue the caller manages)."""
        return self._run(_ops.list_grants(queue), conn)
