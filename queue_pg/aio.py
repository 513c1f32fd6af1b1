"""The asyncio client: a thin typed layer over the SQL functions of schema ``queue_pg``.

This file and :mod:`queue_pg.aio_base` are also the source of the synchronous
:class:`queue_pg.Client`: ``queue_pg/client.py`` and ``queue_pg/client_base.py`` are generated
from them by ``python tools/unasync.py`` (awaits dropped, async names mapped to their sync
twins, lines marked ``# async-only`` left out, ``# sync:`` lines put in), and
tests/unit/test_twins.py fails when a checked-in file is not what the tool makes. Edit these
files, then run the tool.

Open it with ``await AsyncClient.open(dsn)`` or ``async with AsyncClient(dsn) as client``; a
client used without either opens its pool on first use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from queue_pg import _ops, _sqla, advice
from queue_pg import schedules as sched
from queue_pg.aio_base import AsyncClientBase, AsyncConnection, execute
from queue_pg.types import (
    JSON,
    DeleteResult,
    Grant,
    Message,
    MessageDetails,
    QueueConfig,
    QueueStats,
    RedriveAllow,
    RedriveTask,
    Seconds,
    StoredResult,
    seconds,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from queue_pg._sqla import AsyncSessionLike
    from queue_pg.types import QueueSettings

__all__ = ["AsyncClient", "execute"]


class AsyncClient(AsyncClientBase):
    """Queue operations over a connection pool, a caller's pool, or (sync only) an Engine.

    ``source`` is a DSN (the client opens and owns a pool of autocommit connections, closed by
    :meth:`close` or ``with``), a ``psycopg_pool.AsyncConnectionPool`` (borrowed: opened by its
    owner, never closed here), a SQLAlchemy ``Engine`` on the ``postgresql+psycopg`` driver
    (the synchronous Client only: raw connections borrowed and committed after each call), or
    None (``queue_pg.embedded.resolve_dsn``: ``QUEUE_PG_DSN`` or the embedded server).

    Every method takes ``conn=``, a psycopg connection (an asyncio one for the async client):
    the statement then runs on it inside the caller's transaction and is never committed by the
    client, so enqueueing can be atomic with the caller's own writes. ``send`` and ``send_batch``
    also take ``session=``, a SQLAlchemy Session or Connection (SQLAlchemy's asyncio ones for the
    async client), whose transaction they join the same way.

    ``sweep_interval`` (seconds, None = never): how often a receive also sweeps expired messages,
    so a queue nobody sweeps by hand still sheds them.

    ``pooler``: what sits between the client and PostgreSQL, "none", "session" or "transaction"
    (None: the DSN's ``queue_pg_pooler`` option, else ``QUEUE_PG_POOLER``, else "none"). Behind
    a transaction pooler the client prepares no statement server-side and its workers register
    as heartbeat consumers. ``listen_dsn`` (None: ``QUEUE_PG_LISTEN_DSN``): a DSN that reaches
    PostgreSQL directly, for the long poll's LISTEN; behind a transaction pooler without one,
    long polls look again every second (see docs/operations.md, "Behind a connection pooler").

    ``pool_timeout`` (``$QUEUE_PG_POOL_TIMEOUT``, 30 s) is how long a call waits for a pooled
    connection, ``reconnect_max`` (``$QUEUE_PG_RECONNECT_MAX``, 1 s) the longest pause between
    the pool's reconnect attempts.
    """

    # --- queues ---------------------------------------------------------------------------------

    async def create_queue(
        self, name: str, *, conn: AsyncConnection | None = None, **settings: Unpack[QueueSettings]
    ) -> QueueConfig:
        """Create a queue; a no-op if it exists with the same settings (else QueueAlreadyExists).

        Settings not given take SQL's defaults; ``message_ttl=None`` means messages never expire.
        """
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
        """Drop a queue and its messages. Missing: False with ``if_exists``, else QueueNotFound."""
        return await self._run(_ops.drop_queue(name, if_exists), conn)

    async def list_queues(self, *, conn: AsyncConnection | None = None) -> list[QueueConfig]:
        """The settings of the queues the caller has a grant on (admins: every queue), by name."""
        return await self._run(_ops.list_queues(), conn)

    async def get_queue(self, name: str, *, conn: AsyncConnection | None = None) -> QueueConfig:
        """The queue's settings; QueueNotFound if it does not exist, AccessDenied without a
        grant on it."""
        return await self._run(_ops.get_queue(name), conn)

    async def channel(self, queue: str, *, conn: AsyncConnection | None = None) -> str:
        """The queue's LISTEN channel. Not cached: it follows the queue's id, so a queue dropped
        and created again under the same name has another one."""
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
        group: str | None = None,
        dedup_id: str | None = None,
        conn: AsyncConnection | None = None,
        session: AsyncSessionLike | None = None,
    ) -> int:
        """Enqueue one message; returns its id. delay / ttl None = the queue's settings.

        ``group``: the message group (1 to 128 characters), required on a FIFO queue, whose
        groups are each delivered in send order, to one consumer at a time; on a fair queue the
        tenant the message belongs to. See docs/fifo.md.
        ``dedup_id`` (1 - 128 characters; on a ``content_dedup`` queue the body's SHA-256 when
        None): a second send of the same id within the queue's ``dedup_window`` sends nothing
        and returns the first message's id.
        ``session``: a SQLAlchemy Session or Connection whose transaction the message joins
        (psycopg 3 driver), like ``conn`` does for a psycopg connection."""
        target = await _sqla.ajoin(conn, session)
        call = _ops.send(queue, body, delay, ttl, attributes, debounce=target is None, group=group,
                         dedup_id=dedup_id)
        return await self._run(call, target)

    async def send_batch(
        self,
        queue: str,
        bodies: Iterable[JSON],
        *,
        delay: Seconds | None = None,
        ttl: Seconds | None = None,
        attributes: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        group: str | Sequence[str | None] | None = None,
        dedup_ids: Sequence[str | None] | None = None,
        conn: AsyncConnection | None = None,
        session: AsyncSessionLike | None = None,
    ) -> list[int]:
        """Enqueue many messages in one statement (all or none); ids in input order.

        ``attributes``: one mapping for every message, or a list parallel to ``bodies``;
        ``group`` likewise, one name or a list (see :meth:`send`).
        ``dedup_ids``: a list parallel to ``bodies`` (None: no id) as :meth:`send`'s
        ``dedup_id``; a duplicate, also of an earlier message of the batch, gets the first's id.
        ``session``: as for :meth:`send`.
        """
        target = await _sqla.ajoin(conn, session)
        call = _ops.send_batch(queue, bodies, delay, ttl, attributes, debounce=target is None,
                               group=group, dedup_ids=dedup_ids)
        return await self._run(call, target)

    async def receive(
        self,
        queue: str,
        max_messages: int = 1,
        *,
        visibility_timeout: Seconds | None = None,
        wait: Seconds | None = None,
        delete: Sequence[str] | None = None,
        consumer: int | None = None,
        conn: AsyncConnection | None = None,
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

        ``consumer``: an id from :meth:`register_consumer`, recorded with each lease, so that
        the leases end a few seconds after the registering session is gone (see
        ``queue_pg.reap_consumers``) instead of when they lapse.

        A message whose body this client cannot decode (nested deeper than Python's recursion
        limit, a number Python refuses) comes with ``body`` set to an
        :class:`queue_pg.UndecodableBody` holding its JSON text and the error, so it does not
        take the rest of its batch down.
        """
        call = _ops.receive(queue, max_messages, visibility_timeout, wait, delete, consumer)
        # the receipts are deleted once: the attempts after the first carry none
        again = partial(_ops.receive, queue, max_messages, visibility_timeout, wait,
                        consumer=consumer)
        with self._watching():
            if conn is not None:
                await self._maybe_sweep(None)
                return await self._receive(conn, None, queue, wait, call, again)
            async with self._borrow() as own:
                await self._maybe_sweep(own)
                return await self._receive(own, own, queue, wait, call, again)

    async def delete(
        self, queue: str, receipt: str, *, conn: AsyncConnection | None = None
    ) -> bool:
        """Delete a received message. False if it is already gone (a retry is safe);
        StaleReceipt / InvalidReceipt if the receipt is not the current holder's."""
        return await self._run(_ops.delete(queue, receipt), conn)

    async def delete_batch(
        self, queue: str, receipts: Iterable[str], *, conn: AsyncConnection | None = None
    ) -> list[DeleteResult]:
        """Delete many; per-entry results instead of one error for the batch."""
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
        """Set the lease to end ``timeout`` from now (0 releases it); returns the new
        visible_until. LeaseLimitExceeded past max_lease from the receive. ``release=True``
        marks a planned retry: its return is not counted as a lease expiry, it holds no slot of
        in_flight_limit, and (timeout > 0) the receipt is spent: stale from then on."""
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
        """Azure's Update Message: new visibility timeout (None keeps the lease) and
        optionally a new body (None keeps it) and attributes merged into the message's;
        the receipt stays valid."""
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
        """Move the message to the queue's dead-letter queue now (work that can never
        succeed); ``reason`` goes to its attributes as ``dead_letter_reason``."""
        return await self._run(_ops.dead_letter(queue, receipt, reason), conn)

    async def complete_task(
        self, queue: str, receipt: str, result: JSON, ttl: Seconds = 86400, *,
        conn: AsyncConnection | None = None,
    ) -> bool:
        """Delete a finished task's message and keep its ``result`` for ``ttl`` seconds, in one
        transaction (what a worker does for a task with ``store_result``); False, and nothing
        kept, if the message was gone already. MessageTooLarge past the queue's
        max_message_size."""
        return await self._run(_ops.complete_task(queue, receipt, result, ttl), conn)

    async def complete_step(
        self, queue: str, receipt: str, result: JSON, ttl: Seconds | None = None, *,
        conn: AsyncConnection | None = None,
    ) -> bool:
        """Delete a finished job of a chain or chord (its result kept for ``ttl`` seconds when
        given) and, in the same transaction, send the chain's next step with ``result``, or
        the chord's callback when it was the last member; False, and nothing done, if the
        message was gone already."""
        return await self._run(_ops.complete_step(queue, receipt, result, ttl), conn)

    async def send_chord(
        self, members: Sequence[Mapping[str, Any]], callback_queue: str,
        callback: Mapping[str, Any], *, conn: AsyncConnection | None = None,
    ) -> tuple[int, list[int]]:
        """Send ``members`` (``{"queue", "body", "attributes"}`` each) and record them with
        ``callback`` (``{"task", "args", "kwargs"}``), sent to ``callback_queue`` with the list
        of their results once all succeeded; (chord id, member message ids). In ``conn``'s
        transaction when given."""
        return await self._run(_ops.send_chord(members, callback_queue, callback), conn)

    async def fail_task(
        self, queue: str, receipt: str, reason: str, ttl: Seconds = 86400, *,
        conn: AsyncConnection | None = None,
    ) -> bool:
        """Dead-letter a failed task's message and keep ``reason`` (cut to 1 KiB) as its
        result's error, in one transaction."""
        return await self._run(_ops.fail_task(queue, receipt, reason, ttl), conn)

    async def task_result(
        self, queue: str, id: int, *, conn: AsyncConnection | None = None
    ) -> StoredResult:
        """The kept result of message ``id`` of ``queue`` (status PENDING when there is none,
        RETRY while it waits for its next attempt); needs ``send`` or ``receive`` on the
        queue."""
        return await self._run(_ops.task_result(queue, id), conn)

    async def wait_task_result(
        self, queues: str | Sequence[str], id: int, timeout: Seconds
    ) -> StoredResult:
        """The result of message ``id`` once one is kept in one of ``queues``, waiting up to
        ``timeout`` seconds on LISTEN (woken by the worker's NOTIFY); status PENDING or RETRY
        if none came in time."""
        names = [queues] if isinstance(queues, str) else list(queues)
        return await self._wait_result(names, id, seconds(timeout))

    async def peek(
        self, queue: str, n: int = 1, *, conn: AsyncConnection | None = None
    ) -> list[Message]:
        """Visible messages without leasing them (receipt None)."""
        return await self._run(_ops.peek(queue, n), conn)

    async def message_groups(
        self, queue: str, receipts: Sequence[str], *, conn: AsyncConnection | None = None
    ) -> dict[str, str | None]:
        """The group (FIFO group, or fair queue tenant) of each message named by a receipt of
        ``queue``, by receipt; receipts that match no message of the queue are left out."""
        return await self._run(_ops.message_groups(queue, receipts), conn)

    async def message_details(
        self, queue: str, receipts: Sequence[str], *, conn: AsyncConnection | None = None
    ) -> dict[str, MessageDetails]:
        """Group, dedup id and (FIFO) sequence number of each message named by a receipt of
        ``queue``, by receipt; receipts that match no message of the queue are left out."""
        return await self._run(_ops.message_details(queue, receipts), conn)

    async def purge(self, queue: str, *, conn: AsyncConnection | None = None) -> int:
        """Delete every message of the queue, in any state; returns how many."""
        return await self._run(_ops.purge(queue), conn)

    async def register_consumer(
        self, conn: AsyncConnection, *, name: str | None = None, adopt: int | None = None,
        session: bool | None = None,
    ) -> int | None:
        """Register a consumer on ``conn``; its id goes to :meth:`receive`'s ``consumer``.
        Call :meth:`consumer_heartbeat` with it every second or so while the consumer lives:
        a reap ends the leases of a consumer whose heartbeat is older than the grace period
        (the ``queue_pg.consumer_grace`` setting, default 2 s). ``session`` (default: True
        unless the client is behind a transaction pooler): ``conn`` is a session of its own,
        kept open and outside any pool for the consumer's life, whose end a reap sees at once.
        ``adopt``: the id held on a connection that was lost, kept if no reap has ended it
        yet. None only when the session let its own consumer's lock go. Workers do all of this
        themselves."""
        if session is None:
            session = not self._transaction_pooler
        return await self._run(_ops.register_consumer(name, adopt, session), conn)

    async def consumer_heartbeat(self, consumer: int, *,
                                 conn: AsyncConnection | None = None) -> bool:
        """The consumer's sign of life (see :meth:`register_consumer`); False when it is no
        longer registered (a reap ended it): register again."""
        return await self._run(_ops.consumer_heartbeat(consumer), conn)

    async def reap_consumers(self, *, conn: AsyncConnection | None = None) -> int:
        """End the leases of consumers gone for longer than the grace period; returns how
        many leases ended. Workers run it every second."""
        return await self._run(_ops.reap_consumers(), conn)

    async def sweep(self, *, conn: AsyncConnection | None = None) -> int:
        """Delete expired messages now (one bounded batch); returns how many."""
        return await self._run(_ops.sweep(), conn)

    async def stats(
        self, queue: str, *, exact: bool = False, conn: AsyncConnection | None = None
    ) -> QueueStats:
        """The queue's counts: visible, in flight, delayed, dead-lettered, refusals, expiries.

        Counts up to 1,000 per state are exact; past it they are estimates that cost no scan
        (``approximate`` is True). ``exact=True`` counts every message: O(messages)."""
        return await self._run(_ops.stats(queue, exact), conn)

    async def redrive(
        self,
        dlq: str,
        *,
        to: str | None = None,
        limit: int | None = None,
        conn: AsyncConnection | None = None,
    ) -> int:
        """Move dead-lettered messages back to their source queue (or ``to``, which needs
        ``send``); returns how many. Messages whose source the caller may not send to stay."""
        return await self._run(_ops.redrive(dlq, to, limit), conn)

    async def cancel_message(
        self, queue: str, id: int, *, terminate: bool = False,
        conn: AsyncConnection | None = None,
    ) -> bool:
        """Revoke a job that has not started: delete message ``id`` of ``queue`` unless a
        consumer holds it now (True: deleted; False: not there, or running, and it runs on).
        ``terminate``: a running one too; its worker's next heartbeat is refused, and a
        process pool kills the run."""
        return await self._run(_ops.cancel_message(queue, id, terminate), conn)

    async def redrive_message(
        self, dlq: str, id: int, *, to: str | None = None, conn: AsyncConnection | None = None
    ) -> bool:
        """Move one dead-lettered message of ``dlq`` back (a failed job retried by hand); False
        if ``dlq`` holds no such message now."""
        return await self._run(_ops.redrive_message(dlq, id, to), conn)

    async def start_redrive(
        self,
        dlq: str,
        *,
        to: str | None = None,
        rate: float | None = None,
        conn: AsyncConnection | None = None,
    ) -> int:
        """Start a redrive task: move ``dlq``'s dead-lettered messages back to their source
        queue (or ``to``), at most ``rate`` a second; returns the task id.

        The task lives in the database: :meth:`redrive_step` and every sweep advance it, so it
        goes on after a restart. One running task per queue (``RedriveInProgress``)."""
        return await self._run(_ops.start_redrive(dlq, to, rate), conn)

    async def set_redrive_allow(
        self,
        queue: str,
        permission: str,
        sources: Sequence[str] | None = None,
        *,
        conn: AsyncConnection | None = None,
    ) -> RedriveAllow:
        """Which queues may name ``queue`` as their dead-letter queue: ``allow_all`` (the
        default), ``deny_all``, or ``by_queue`` with up to 10 ``sources``; checked when a queue
        is created with it or altered to it (queues already linked stay linked)."""
        return await self._run(_ops.set_redrive_allow(queue, permission, sources), conn)

    async def redrive_allow(
        self, queue: str, *, conn: AsyncConnection | None = None
    ) -> RedriveAllow:
        """The queue's redrive allow policy (``set_redrive_allow``)."""
        return await self._run(_ops.redrive_allow(queue), conn)

    async def list_redrives(
        self, dlq: str | None = None, *, conn: AsyncConnection | None = None
    ) -> list[RedriveTask]:
        """The redrive tasks of ``dlq`` (None: of every queue the caller manages), newest first."""
        return await self._run(_ops.list_redrives(dlq), conn)

    async def cancel_redrive(
        self, task: int, *, conn: AsyncConnection | None = None
    ) -> RedriveTask:
        """Stop a running redrive task (messages moved so far stay moved); the task as it is."""
        return await self._run(_ops.cancel_redrive(task), conn)

    async def redrive_step(
        self, max_rows: int = 1000, *, conn: AsyncConnection | None = None
    ) -> int:
        """Advance the running redrive tasks of the queues the caller manages now, within their
        rates (sweeps do it too); returns how many messages moved."""
        return await self._run(_ops.redrive_step(max_rows), conn)

    # --- access ---------------------------------------------------------------------------------

    async def grant(
        self, queue: str, role: str, privilege: str, *, conn: AsyncConnection | None = None
    ) -> bool:
        """Let ``role`` (and the roles that have its privileges) ``privilege`` the queue: "send",
        "receive" or "manage". True when granted now, False when it already was."""
        return await self._run(_ops.grant(queue, role, privilege), conn)

    async def revoke(
        self, queue: str, role: str, privilege: str, *, conn: AsyncConnection | None = None
    ) -> bool:
        """Take a grant back; True when it existed."""
        return await self._run(_ops.revoke(queue, role, privilege), conn)

    async def list_grants(
        self, queue: str | None = None, *, conn: AsyncConnection | None = None
    ) -> list[Grant]:
        """The grants of ``queue`` (None: of every queue the caller manages)."""
        return await self._run(_ops.list_grants(queue), conn)

    # --- figures, advice, tuning, routes (queue_pg.advice) --------------------------------------

    async def queue_health(
        self, queue: str | None = None, *, exact: bool = False,
        conn: AsyncConnection | None = None,
    ) -> list[advice.QueueHealth]:
        """queue_stats with the flows: of ``queue``, or of every queue the caller may see
        (``exact``: as :meth:`stats`)."""
        return await self._run(advice.queue_health(queue, exact), conn)

    async def queue_overview(
        self, window: float = 600, *, conn: AsyncConnection | None = None
    ) -> list[advice.QueueOverview]:
        """Every queue the caller may see in one query: queue_health, the visibility timeout and the
        advice, processing and waiting times of the messages finished in the last ``window``
        seconds (what ``queue-pg top`` and the Prometheus collector read).
        """
        return await self._run(advice.queue_overview(window), conn)

    async def queue_overview_replica(
        self, window: float = 600, *, conn: AsyncConnection | None = None
    ) -> tuple[list[advice.QueueOverview], advice.ReplicaStatus]:
        """:meth:`queue_overview` and :meth:`replica_status` in one statement: what ``queue-pg
        top`` and the Prometheus collector read at each refresh or scrape."""
        return await self._run(advice.overview_and_replica(window), conn)

    async def replica_status(
        self, *, conn: AsyncConnection | None = None
    ) -> advice.ReplicaStatus:
        """Whether the server is a hot standby (read-only) and how stale what it shows is: the
        surfaces that only read (top, metrics, stats, the dashboard) may run on one."""
        return await self._run(advice.replica_status(), conn)

    async def queue_history(
        self, queue: str | None = None, *, seconds: float = 3600,
        conn: AsyncConnection | None = None,
    ) -> list[advice.QueueSample]:
        """The samples sweep took over the last ``seconds`` (of ``queue``, or of every queue the
        caller may see): counts, and flows as rates per second. What the dashboard charts."""
        return await self._run(advice.queue_history(queue, seconds), conn)

    async def in_flight(
        self, queue: str | None = None, *, limit: int | None = None,
        conn: AsyncConnection | None = None,
    ) -> list[advice.InFlight]:
        """The messages now leased (of ``queue``, or of every queue the caller may see): since when,
        until when, receive count, type. At most ``limit`` of them (None: all).
        """
        return await self._run(advice.in_flight(queue, limit), conn)

    async def stuck_jobs(
        self, queue: str | None = None, *, conn: AsyncConnection | None = None
    ) -> list[advice.StuckJob]:
        """The leased messages of 'per_type' queues whose run has lasted past twice its type's
        lease (hung work: past four times, its heartbeats are refused)."""
        return await self._run(advice.stuck_jobs(queue), conn)

    async def stuck_counts(
        self, *, conn: AsyncConnection | None = None
    ) -> list[advice.StuckCount]:
        """:meth:`stuck_jobs` counted by queue and type, with the longest run of each."""
        return await self._run(advice.stuck_counts(), conn)

    async def hung_limits(
        self, queue: str, *, conn: AsyncConnection | None = None
    ) -> list[advice.HungLimit]:
        """Per type of a 'per_type' queue: seconds after a receive from which a run is stuck,
        and from which its heartbeats are refused (none for a 'fixed' queue)."""
        return await self._run(advice.hung_limits(queue), conn)

    async def dead_letters(
        self, dlq: str | None = None, *, limit: int | None = None,
        conn: AsyncConnection | None = None,
    ) -> list[advice.DeadLetter]:
        """The messages sitting in dead-letter queues (``dlq``, or all the caller may see), with
        source queue, receive count, reason and last error. At most ``limit`` (None: all).
        """
        return await self._run(advice.dead_letters(dlq, limit), conn)

    async def processing_times(
        self, queue: str | None = None, *, since: datetime | None = None,
        until: datetime | None = None, conn: AsyncConnection | None = None,
    ) -> list[advice.ProcessingTimes]:
        """Processing and waiting times per queue and type over [since, until) (default: the last 24
        hours): count and p50 / p95 / p99 / max.
        """
        return await self._run(advice.processing_times(queue, since, until), conn)

    async def timeout_advice(
        self, queue: str | None = None, *, since: datetime | None = None,
        until: datetime | None = None, conn: AsyncConnection | None = None,
    ) -> list[advice.TimeoutAdvice]:
        """The advice over [since, until) (default: the last 24 hours)."""
        return await self._run(advice.timeout_advice(queue, since, until), conn)

    async def lease_advice(
        self, queue: str | None = None, *, since: datetime | None = None,
        until: datetime | None = None, conn: AsyncConnection | None = None,
    ) -> list[advice.LeaseAdvice]:
        """The leases the duplicate budget calls for over [since, until) (default: the last 24
        hours), with their predicted duplicates and recovery time beside the 6 x p99 rule's."""
        return await self._run(advice.lease_advice(queue, since, until), conn)

    async def alter_tuning(
        self, queue: str, *, lease_policy: str | None = None, auto_tune: bool | None = None,
        tune_min: float | None = None, tune_max: float | None = None, clear: Sequence[str] = (),
        duplicate_budget: float | None = None, conn: AsyncConnection | None = None,
    ) -> advice.TuningSettings:
        """Changes how a queue's leases are chosen and tuned: ``lease_policy`` ('fixed' or
        'per_type'), ``auto_tune`` and its bounds; ``clear`` resets the named bounds;
        ``duplicate_budget`` (1e-9 to 0.01 of deliveries) sets the risk per-type leases meet.
        """
        return await self._run(advice.alter_tuning(
            queue, lease_policy=lease_policy, auto_tune=auto_tune, tune_min=tune_min,
            tune_max=tune_max, clear=clear, duplicate_budget=duplicate_budget), conn)

    async def tune(
        self, queue: str | None = None, *, apply: bool = True, conn: AsyncConnection | None = None
    ) -> list[advice.TuningStep]:
        """One tuning step of ``queue`` (None: of each auto_tune queue the caller manages)."""
        return await self._run(advice.tune(queue, apply=apply), conn)

    async def tuning_log(
        self, queue: str | None = None, *, conn: AsyncConnection | None = None
    ) -> list[advice.TuningChange]:
        """Every change the tuner made (when, old, new, why), newest first."""
        return await self._run(advice.tuning_log(queue), conn)

    async def add_route(
        self, queue: str, type: str, target: str, *, conn: AsyncConnection | None = None
    ) -> bool:
        """Routes sends to ``queue`` whose attribute ``type`` is ``type`` to ``target``, in the same
        statement; true when added now.
        """
        return await self._run(advice.add_route(queue, type, target), conn)

    async def drop_route(
        self, queue: str, type: str, *, conn: AsyncConnection | None = None
    ) -> bool:
        """Removes the route of ``type`` from ``queue``; true when it existed."""
        return await self._run(advice.drop_route(queue, type), conn)

    async def list_routes(
        self, queue: str | None = None, *, conn: AsyncConnection | None = None
    ) -> list[advice.Route]:
        """The routes of ``queue`` (None: of every queue the caller may see)."""
        return await self._run(advice.list_routes(queue), conn)

    async def split(
        self, queue: str, *, apply: bool = False, conn: AsyncConnection | None = None
    ) -> list[advice.SplitPart]:
        """The queues a split of ``queue`` by type would make (a queue per type with its advised
        timeout, and routes); ``apply`` makes them.
        """
        return await self._run(advice.split(queue, apply=apply), conn)

    # --- periodic tasks (queue_pg.schedules, sql/api/52_periodic.sql) ----------------------------

    async def set_schedule(
        self, name: str, queue: str, cron: str, body: JSON, *, tz: str = "UTC",
        attributes: Mapping[str, JSON] | None = None, missed: str = "skip", catch_up: int = 10,
        grace: float = 60.0, conn: AsyncConnection | None = None,
    ) -> sched.ScheduleInfo:
        """Creates or updates schedule ``name`` of ``queue`` (a name is its queue's own): ``body``
        sent to ``queue`` at each tick of the cron expression ``cron`` in time zone ``tz``; a
        schedule whose cron and tz stay keeps its next run. Late ticks (past ``grace`` seconds):
        ``missed`` 'skip' or 'catch_up' (the latest ``catch_up`` of them).
        """
        return await self._run(sched.set_schedule(
            name, queue, cron, body, tz=tz, attributes=attributes, missed=missed,
            catch_up=catch_up, grace=grace), conn)

    async def drop_schedule(
        self, name: str, queue: str, *, conn: AsyncConnection | None = None
    ) -> bool:
        """Removes schedule ``name`` of ``queue``; true when it existed."""
        return await self._run(sched.drop_schedule(name, queue), conn)

    async def fire_schedules(
        self, queues: Sequence[str] | None = None, *, conn: AsyncConnection | None = None
    ) -> list[sched.Fired]:
        """Sends the due ticks of the schedules of ``queues`` (None: all the caller may send to),
        each once however many callers race; what it sent. Workers call it about once a second.
        """
        return await self._run(sched.fire_schedules(queues), conn)

    async def schedules(
        self, queue: str | None = None, *, conn: AsyncConnection | None = None
    ) -> list[sched.Schedule]:
        """The schedules (of ``queue``, or of every queue the caller may see): next and last run."""
        return await self._run(sched.schedules(queue), conn)

    # --- start rates (sql/api/53_task_limits.sql) -------------------------------------------------

    async def set_rate_limit(
        self, queue: str, per_second: float | None, *, conn: AsyncConnection | None = None
    ) -> float | None:
        """At most ``per_second`` receives start a message of ``queue`` each second, whoever
        receives (None: no limit); over any t seconds at most per_second * (t + 1)."""
        return await self._run(sched.set_rate_limit(queue, per_second), conn)

    async def limit_task(
        self, queue: str, task: str, target: str, max_running: int, *,
        conn: AsyncConnection | None = None,
    ) -> bool:
        """At most ``max_running`` messages of type ``task`` sent to ``queue`` in flight at
        once: they are routed to ``target``, a queue of their own (made with ``queue``'s
        settings) whose in_flight_limit is the limit. True when something changed; a role with
        only send on ``queue`` may call it once the limit is in place."""
        return await self._run(sched.limit_task(queue, task, target, max_running), conn)
