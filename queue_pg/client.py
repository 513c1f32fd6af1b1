"""The synchronous client: a thin typed layer over the SQL functions of schema ``queue_pg``.

GENERATED from queue_pg/aio.py by tools/unasync.py: edit that, then run the tool.

Every method runs one statement built by :mod:`queue_pg._ops`. The only logic of its own is what
cannot live in SQL: borrowing connections, waiting for a message on LISTEN instead of letting the
server sleep-poll (the decisions in :mod:`queue_pg.longpoll`), and sweeping expired messages now
and then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from queue_pg import _ops, _sqla, advice
from queue_pg import schedules as sched
from queue_pg.client_base import ClientBase, Connection, execute
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

    from queue_pg._sqla import SessionLike
    from queue_pg.types import QueueSettings

__all__ = ["Client", "execute"]


class Client(ClientBase):
    """Queue operations over a connection pool, a caller's pool, or (sync only) an Engine.

    ``source`` is a DSN (the client opens and owns a pool of autocommit connections, closed by
    :meth:`close` or ``with``), a ``psycopg_pool.ConnectionPool`` (borrowed: opened by its
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
        """The settings of the queues the caller has a grant on (admins: every queue), by name."""
        return self._run(_ops.list_queues(), conn)

    def get_queue(self, name: str, *, conn: Connection | None = None) -> QueueConfig:
        """The queue's settings; QueueNotFound if it does not exist, AccessDenied without a
        grant on it."""
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
        group: str | None = None,
        dedup_id: str | None = None,
        conn: Connection | None = None,
        session: SessionLike | None = None,
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
        target = _sqla.join(conn, session)
        call = _ops.send(queue, body, delay, ttl, attributes, debounce=target is None, group=group,
                         dedup_id=dedup_id)
        return self._run(call, target)

    def send_batch(
        self,
        queue: str,
        bodies: Iterable[JSON],
        *,
        delay: Seconds | None = None,
        ttl: Seconds | None = None,
        attributes: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        group: str | Sequence[str | None] | None = None,
        dedup_ids: Sequence[str | None] | None = None,
        conn: Connection | None = None,
        session: SessionLike | None = None,
    ) -> list[int]:
        """Enqueue many messages in one statement (all or none); ids in input order.

        ``attributes``: one mapping for every message, or a list parallel to ``bodies``;
        ``group`` likewise, one name or a list (see :meth:`send`).
        ``dedup_ids``: a list parallel to ``bodies`` (None: no id) as :meth:`send`'s
        ``dedup_id``; a duplicate, also of an earlier message of the batch, gets the first's id.
        ``session``: as for :meth:`send`.
        """
        target = _sqla.join(conn, session)
        call = _ops.send_batch(queue, bodies, delay, ttl, attributes, debounce=target is None,
                               group=group, dedup_ids=dedup_ids)
        return self._run(call, target)

    def receive(
        self,
        queue: str,
        max_messages: int = 1,
        *,
        visibility_timeout: Seconds | None = None,
        wait: Seconds | None = None,
        delete: Sequence[str] | None = None,
        consumer: int | None = None,
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
                self._maybe_sweep(None)
                return self._receive(conn, None, queue, wait, call, again)
            with self._borrow() as own:
                self._maybe_sweep(own)
                return self._receive(own, own, queue, wait, call, again)

    def delete(
        self, queue: str, receipt: str, *, conn: Connection | None = None
    ) -> bool:
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
        marks a planned retry: its return is not counted as a lease expiry, it holds no slot of
        in_flight_limit, and (timeout > 0) the receipt is spent: stale from then on."""
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
        self,
        queue: str,
        receipt: str,
        reason: str | None = None,
        *,
        conn: Connection | None = None,
    ) -> bool:
        """Move the message to the queue's dead-letter queue now (work that can never
        succeed); ``reason`` goes to its attributes as ``dead_letter_reason``."""
        return self._run(_ops.dead_letter(queue, receipt, reason), conn)

    def complete_task(
        self, queue: str, receipt: str, result: JSON, ttl: Seconds = 86400, *,
        conn: Connection | None = None,
    ) -> bool:
        """Delete a finished task's message and keep its ``result`` for ``ttl`` seconds, in one
        transaction (what a worker does for a task with ``store_result``); False, and nothing
        kept, if the message was gone already. MessageTooLarge past the queue's
        max_message_size."""
        return self._run(_ops.complete_task(queue, receipt, result, ttl), conn)

    def complete_step(
        self, queue: str, receipt: str, result: JSON, ttl: Seconds | None = None, *,
        conn: Connection | None = None,
    ) -> bool:
        """Delete a finished job of a chain or chord (its result kept for ``ttl`` seconds when
        given) and, in the same transaction, send the chain's next step with ``result``, or
        the chord's callback when it was the last member; False, and nothing done, if the
        message was gone already."""
        return self._run(_ops.complete_step(queue, receipt, result, ttl), conn)

    def send_chord(
        self, members: Sequence[Mapping[str, Any]], callback_queue: str,
        callback: Mapping[str, Any], *, conn: Connection | None = None,
    ) -> tuple[int, list[int]]:
        """Send ``members`` (``{"queue", "body", "attributes"}`` each) and record them with
        ``callback`` (``{"task", "args", "kwargs"}``), sent to ``callback_queue`` with the list
        of their results once all succeeded; (chord id, member message ids). In ``conn``'s
        transaction when given."""
        return self._run(_ops.send_chord(members, callback_queue, callback), conn)

    def fail_task(
        self, queue: str, receipt: str, reason: str, ttl: Seconds = 86400, *,
        conn: Connection | None = None,
    ) -> bool:
        """Dead-letter a failed task's message and keep ``reason`` (cut to 1 KiB) as its
        result's error, in one transaction."""
        return self._run(_ops.fail_task(queue, receipt, reason, ttl), conn)

    def task_result(
        self, queue: str, id: int, *, conn: Connection | None = None
    ) -> StoredResult:
        """The kept result of message ``id`` of ``queue`` (status PENDING when there is none,
        RETRY while it waits for its next attempt); needs ``send`` or ``receive`` on the
        queue."""
        return self._run(_ops.task_result(queue, id), conn)

    def wait_task_result(
        self, queues: str | Sequence[str], id: int, timeout: Seconds
    ) -> StoredResult:
        """The result of message ``id`` once one is kept in one of ``queues``, waiting up to
        ``timeout`` seconds on LISTEN (woken by the worker's NOTIFY); status PENDING or RETRY
        if none came in time."""
        names = [queues] if isinstance(queues, str) else list(queues)
        return self._wait_result(names, id, seconds(timeout))

    def peek(
        self, queue: str, n: int = 1, *, conn: Connection | None = None
    ) -> list[Message]:
        """Visible messages without leasing them (receipt None)."""
        return self._run(_ops.peek(queue, n), conn)

    def message_groups(
        self, queue: str, receipts: Sequence[str], *, conn: Connection | None = None
    ) -> dict[str, str | None]:
        """The group (FIFO group, or fair queue tenant) of each message named by a receipt of
        ``queue``, by receipt; receipts that match no message of the queue are left out."""
        return self._run(_ops.message_groups(queue, receipts), conn)

    def message_details(
        self, queue: str, receipts: Sequence[str], *, conn: Connection | None = None
    ) -> dict[str, MessageDetails]:
        """Group, dedup id and (FIFO) sequence number of each message named by a receipt of
        ``queue``, by receipt; receipts that match no message of the queue are left out."""
        return self._run(_ops.message_details(queue, receipts), conn)

    def purge(self, queue: str, *, conn: Connection | None = None) -> int:
        """Delete every message of the queue, in any state; returns how many."""
        return self._run(_ops.purge(queue), conn)

    def register_consumer(
        self, conn: Connection, *, name: str | None = None, adopt: int | None = None,
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
        return self._run(_ops.register_consumer(name, adopt, session), conn)

    def consumer_heartbeat(self, consumer: int, *,
                                 conn: Connection | None = None) -> bool:
        """The consumer's sign of life (see :meth:`register_consumer`); False when it is no
        longer registered (a reap ended it): register again."""
        return self._run(_ops.consumer_heartbeat(consumer), conn)

    def reap_consumers(self, *, conn: Connection | None = None) -> int:
        """End the leases of consumers gone for longer than the grace period; returns how
        many leases ended. Workers run it every second."""
        return self._run(_ops.reap_consumers(), conn)

    def sweep(self, *, conn: Connection | None = None) -> int:
        """Delete expired messages now (one bounded batch); returns how many."""
        return self._run(_ops.sweep(), conn)

    def stats(
        self, queue: str, *, exact: bool = False, conn: Connection | None = None
    ) -> QueueStats:
        """The queue's counts: visible, in flight, delayed, dead-lettered, refusals, expiries.

        Counts up to 1,000 per state are exact; past it they are estimates that cost no scan
        (``approximate`` is True). ``exact=True`` counts every message: O(messages)."""
        return self._run(_ops.stats(queue, exact), conn)

    def redrive(
        self,
        dlq: str,
        *,
        to: str | None = None,
        limit: int | None = None,
        conn: Connection | None = None,
    ) -> int:
        """Move dead-lettered messages back to their source queue (or ``to``, which needs
        ``send``); returns how many. Messages whose source the caller may not send to stay."""
        return self._run(_ops.redrive(dlq, to, limit), conn)

    def cancel_message(
        self, queue: str, id: int, *, terminate: bool = False,
        conn: Connection | None = None,
    ) -> bool:
        """Revoke a job that has not started: delete message ``id`` of ``queue`` unless a
        consumer holds it now (True: deleted; False: not there, or running, and it runs on).
        ``terminate``: a running one too; its worker's next heartbeat is refused, and a
        process pool kills the run."""
        return self._run(_ops.cancel_message(queue, id, terminate), conn)

    def redrive_message(
        self, dlq: str, id: int, *, to: str | None = None, conn: Connection | None = None
    ) -> bool:
        """Move one dead-lettered message of ``dlq`` back (a failed job retried by hand); False
        if ``dlq`` holds no such message now."""
        return self._run(_ops.redrive_message(dlq, id, to), conn)

    def start_redrive(
        self,
        dlq: str,
        *,
        to: str | None = None,
        rate: float | None = None,
        conn: Connection | None = None,
    ) -> int:
        """Start a redrive task: move ``dlq``'s dead-lettered messages back to their source
        queue (or ``to``), at most ``rate`` a second; returns the task id.

        The task lives in the database: :meth:`redrive_step` and every sweep advance it, so it
        goes on after a restart. One running task per queue (``RedriveInProgress``)."""
        return self._run(_ops.start_redrive(dlq, to, rate), conn)

    def set_redrive_allow(
        self,
        queue: str,
        permission: str,
        sources: Sequence[str] | None = None,
        *,
        conn: Connection | None = None,
    ) -> RedriveAllow:
        """Which queues may name ``queue`` as their dead-letter queue: ``allow_all`` (the
        default), ``deny_all``, or ``by_queue`` with up to 10 ``sources``; checked when a queue
        is created with it or altered to it (queues already linked stay linked)."""
        return self._run(_ops.set_redrive_allow(queue, permission, sources), conn)

    def redrive_allow(
        self, queue: str, *, conn: Connection | None = None
    ) -> RedriveAllow:
        """The queue's redrive allow policy (``set_redrive_allow``)."""
        return self._run(_ops.redrive_allow(queue), conn)

    def list_redrives(
        self, dlq: str | None = None, *, conn: Connection | None = None
    ) -> list[RedriveTask]:
        """The redrive tasks of ``dlq`` (None: of every queue the caller manages), newest first."""
        return self._run(_ops.list_redrives(dlq), conn)

    def cancel_redrive(
        self, task: int, *, conn: Connection | None = None
    ) -> RedriveTask:
        """Stop a running redrive task (messages moved so far stay moved); the task as it is."""
        return self._run(_ops.cancel_redrive(task), conn)

    def redrive_step(
        self, max_rows: int = 1000, *, conn: Connection | None = None
    ) -> int:
        """Advance the running redrive tasks of the queues the caller manages now, within their
        rates (sweeps do it too); returns how many messages moved."""
        return self._run(_ops.redrive_step(max_rows), conn)

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

    # --- figures, advice, tuning, routes (queue_pg.advice) --------------------------------------

    def queue_health(
        self, queue: str | None = None, *, exact: bool = False,
        conn: Connection | None = None,
    ) -> list[advice.QueueHealth]:
        """queue_stats with the flows: of ``queue``, or of every queue the caller may see
        (``exact``: as :meth:`stats`)."""
        return self._run(advice.queue_health(queue, exact), conn)

    def queue_overview(
        self, window: float = 600, *, conn: Connection | None = None
    ) -> list[advice.QueueOverview]:
        """Every queue the caller may see in one query: queue_health, the visibility timeout and the
        advice, processing and waiting times of the messages finished in the last ``window``
        seconds (what ``queue-pg top`` and the Prometheus collector read).
        """
        return self._run(advice.queue_overview(window), conn)

    def queue_overview_replica(
        self, window: float = 600, *, conn: Connection | None = None
    ) -> tuple[list[advice.QueueOverview], advice.ReplicaStatus]:
        """:meth:`queue_overview` and :meth:`replica_status` in one statement: what ``queue-pg
        top`` and the Prometheus collector read at each refresh or scrape."""
        return self._run(advice.overview_and_replica(window), conn)

    def replica_status(
        self, *, conn: Connection | None = None
    ) -> advice.ReplicaStatus:
        """Whether the server is a hot standby (read-only) and how stale what it shows is: the
        surfaces that only read (top, metrics, stats, the dashboard) may run on one."""
        return self._run(advice.replica_status(), conn)

    def queue_history(
        self, queue: str | None = None, *, seconds: float = 3600,
        conn: Connection | None = None,
    ) -> list[advice.QueueSample]:
        """The samples sweep took over the last ``seconds`` (of ``queue``, or of every queue the
        caller may see): counts, and flows as rates per second. What the dashboard charts."""
        return self._run(advice.queue_history(queue, seconds), conn)

    def in_flight(
        self, queue: str | None = None, *, limit: int | None = None,
        conn: Connection | None = None,
    ) -> list[advice.InFlight]:
        """The messages now leased (of ``queue``, or of every queue the caller may see): since when,
        until when, receive count, type. At most ``limit`` of them (None: all).
        """
        return self._run(advice.in_flight(queue, limit), conn)

    def stuck_jobs(
        self, queue: str | None = None, *, conn: Connection | None = None
    ) -> list[advice.StuckJob]:
        """The leased messages of 'per_type' queues whose run has lasted past twice its type's
        lease (hung work: past four times, its heartbeats are refused)."""
        return self._run(advice.stuck_jobs(queue), conn)

    def stuck_counts(
        self, *, conn: Connection | None = None
    ) -> list[advice.StuckCount]:
        """:meth:`stuck_jobs` counted by queue and type, with the longest run of each."""
        return self._run(advice.stuck_counts(), conn)

    def hung_limits(
        self, queue: str, *, conn: Connection | None = None
    ) -> list[advice.HungLimit]:
        """Per type of a 'per_type' queue: seconds after a receive from which a run is stuck,
        and from which its heartbeats are refused (none for a 'fixed' queue)."""
        return self._run(advice.hung_limits(queue), conn)

    def dead_letters(
        self, dlq: str | None = None, *, limit: int | None = None,
        conn: Connection | None = None,
    ) -> list[advice.DeadLetter]:
        """The messages sitting in dead-letter queues (``dlq``, or all the caller may see), with
        source queue, receive count, reason and last error. At most ``limit`` (None: all).
        """
        return self._run(advice.dead_letters(dlq, limit), conn)

    def processing_times(
        self, queue: str | None = None, *, since: datetime | None = None,
        until: datetime | None = None, conn: Connection | None = None,
    ) -> list[advice.ProcessingTimes]:
        """Processing and waiting times per queue and type over [since, until) (default: the last 24
        hours): count and p50 / p95 / p99 / max.
        """
        return self._run(advice.processing_times(queue, since, until), conn)

    def timeout_advice(
        self, queue: str | None = None, *, since: datetime | None = None,
        until: datetime | None = None, conn: Connection | None = None,
    ) -> list[advice.TimeoutAdvice]:
        """The advice over [since, until) (default: the last 24 hours)."""
        return self._run(advice.timeout_advice(queue, since, until), conn)

    def lease_advice(
        self, queue: str | None = None, *, since: datetime | None = None,
        until: datetime | None = None, conn: Connection | None = None,
    ) -> list[advice.LeaseAdvice]:
        """The leases the duplicate budget calls for over [since, until) (default: the last 24
        hours), with their predicted duplicates and recovery time beside the 6 x p99 rule's."""
        return self._run(advice.lease_advice(queue, since, until), conn)

    def alter_tuning(
        self, queue: str, *, lease_policy: str | None = None, auto_tune: bool | None = None,
        tune_min: float | None = None, tune_max: float | None = None, clear: Sequence[str] = (),
        duplicate_budget: float | None = None, conn: Connection | None = None,
    ) -> advice.TuningSettings:
        """Changes how a queue's leases are chosen and tuned: ``lease_policy`` ('fixed' or
        'per_type'), ``auto_tune`` and its bounds; ``clear`` resets the named bounds;
        ``duplicate_budget`` (1e-9 to 0.01 of deliveries) sets the risk per-type leases meet.
        """
        return self._run(advice.alter_tuning(
            queue, lease_policy=lease_policy, auto_tune=auto_tune, tune_min=tune_min,
            tune_max=tune_max, clear=clear, duplicate_budget=duplicate_budget), conn)

    def tune(
        self, queue: str | None = None, *, apply: bool = True, conn: Connection | None = None
    ) -> list[advice.TuningStep]:
        """One tuning step of ``queue`` (None: of each auto_tune queue the caller manages)."""
        return self._run(advice.tune(queue, apply=apply), conn)

    def tuning_log(
        self, queue: str | None = None, *, conn: Connection | None = None
    ) -> list[advice.TuningChange]:
        """Every change the tuner made (when, old, new, why), newest first."""
        return self._run(advice.tuning_log(queue), conn)

    def add_route(
        self, queue: str, type: str, target: str, *, conn: Connection | None = None
    ) -> bool:
        """Routes sends to ``queue`` whose attribute ``type`` is ``type`` to ``target``, in the same
        statement; true when added now.
        """
        return self._run(advice.add_route(queue, type, target), conn)

    def drop_route(
        self, queue: str, type: str, *, conn: Connection | None = None
    ) -> bool:
        """Removes the route of ``type`` from ``queue``; true when it existed."""
        return self._run(advice.drop_route(queue, type), conn)

    def list_routes(
        self, queue: str | None = None, *, conn: Connection | None = None
    ) -> list[advice.Route]:
        """The routes of ``queue`` (None: of every queue the caller may see)."""
        return self._run(advice.list_routes(queue), conn)

    def split(
        self, queue: str, *, apply: bool = False, conn: Connection | None = None
    ) -> list[advice.SplitPart]:
        """The queues a split of ``queue`` by type would make (a queue per type with its advised
        timeout, and routes); ``apply`` makes them.
        """
        return self._run(advice.split(queue, apply=apply), conn)

    # --- periodic tasks (queue_pg.schedules, sql/api/52_periodic.sql) ----------------------------

    def set_schedule(
        self, name: str, queue: str, cron: str, body: JSON, *, tz: str = "UTC",
        attributes: Mapping[str, JSON] | None = None, missed: str = "skip", catch_up: int = 10,
        grace: float = 60.0, conn: Connection | None = None,
    ) -> sched.ScheduleInfo:
        """Creates or updates schedule ``name`` of ``queue`` (a name is its queue's own): ``body``
        sent to ``queue`` at each tick of the cron expression ``cron`` in time zone ``tz``; a
        schedule whose cron and tz stay keeps its next run. Late ticks (past ``grace`` seconds):
        ``missed`` 'skip' or 'catch_up' (the latest ``catch_up`` of them).
        """
        return self._run(sched.set_schedule(
            name, queue, cron, body, tz=tz, attributes=attributes, missed=missed,
            catch_up=catch_up, grace=grace), conn)

    def drop_schedule(
        self, name: str, queue: str, *, conn: Connection | None = None
    ) -> bool:
        """Removes schedule ``name`` of ``queue``; true when it existed."""
        return self._run(sched.drop_schedule(name, queue), conn)

    def fire_schedules(
        self, queues: Sequence[str] | None = None, *, conn: Connection | None = None
    ) -> list[sched.Fired]:
        """Sends the due ticks of the schedules of ``queues`` (None: all the caller may send to),
        each once however many callers race; what it sent. Workers call it about once a second.
        """
        return self._run(sched.fire_schedules(queues), conn)

    def schedules(
        self, queue: str | None = None, *, conn: Connection | None = None
    ) -> list[sched.Schedule]:
        """The schedules (of ``queue``, or of every queue the caller may see): next and last run."""
        return self._run(sched.schedules(queue), conn)

    # --- start rates (sql/api/53_task_limits.sql) -------------------------------------------------

    def set_rate_limit(
        self, queue: str, per_second: float | None, *, conn: Connection | None = None
    ) -> float | None:
        """At most ``per_second`` receives start a message of ``queue`` each second, whoever
        receives (None: no limit); over any t seconds at most per_second * (t + 1)."""
        return self._run(sched.set_rate_limit(queue, per_second), conn)

    def limit_task(
        self, queue: str, task: str, target: str, max_running: int, *,
        conn: Connection | None = None,
    ) -> bool:
        """At most ``max_running`` messages of type ``task`` sent to ``queue`` in flight at
        once: they are routed to ``target``, a queue of their own (made with ``queue``'s
        settings) whose in_flight_limit is the limit. True when something changed; a role with
        only send on ``queue`` may call it once the limit is in place."""
        return self._run(sched.limit_task(queue, task, target, max_running), conn)
