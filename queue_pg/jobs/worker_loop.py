"""The receive loop both workers run: their options, the poll rounds, pauses after a failed
receive, the leases per queue, and the counters.

A round (:meth:`Rounds.round`) is a plan (see :mod:`queue_pg.jobs.plans`): the workers differ only
in how they run its client calls and how they start the jobs it hands them.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from time import monotonic
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from queue_pg import outage
from queue_pg.errors import ConsumerNotFound, InvalidParameter, OverLimit, QueueNotFound
from queue_pg.jobs import joblog
from queue_pg.jobs.acks import Acks
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.job import BaseJob, Reject
from queue_pg.jobs.plans import ClientCall, Plan
from queue_pg.jobs.pool import ProcessSlot, check_pool
from queue_pg.jobs.pulse import Pulse
from queue_pg.jobs.settle import release
from queue_pg.jobs.tasks import Registry
from queue_pg.types import Message, Seconds, UndecodableBody, seconds

if TYPE_CHECKING:
    from queue_pg.jobs.tasks import Task

C = TypeVar("C")  # the client
H = TypeVar("H")  # the handler

__all__ = [
    "FATAL",
    "GATHER",
    "IDLE_SLEEP",
    "LEASE_REFRESH",
    "POLL_SLICE",
    "STATUS_INTERVAL",
    "STOP_SIGNALS",
    "Rounds",
    "WorkerBase",
    "WorkerOptions",
    "WorkerStats",
    "gathered",
    "per_queue",
    "resolve_task",
]

logger = logging.getLogger("queue_pg.worker")

#: Longest a single receive long-polls. The client cannot be interrupted while it waits on
#: LISTEN, so a worker polls in slices this long to notice a stop request (and its other queues).
POLL_SLICE = 1.0
#: Pause after an empty short poll (``wait=0``) and after a failed receive (doubling to 30 s,
#: with jitter).
IDLE_SLEEP = 0.25
#: Longest a busy worker waits for the rest of its slots to free before it receives for those
#: that are free (see :func:`gathered`): one receive for several jobs, not one each.
GATHER = 0.002
#: Seconds between status lines of a busy worker (logged only when something changed).
STATUS_INTERVAL = 60.0
#: How often a worker that uses its queues' own visibility_timeout reads it again, so an
#: ``alter_queue`` reaches a running worker.
LEASE_REFRESH = 5.0
#: Signals that stop a worker gracefully (a second one: at once).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: Receive errors that retrying cannot fix (a dropped queue, a lease past max_lease, a value
#: SQL refuses): the worker stops, after letting its running jobs finish, and run() raises them.
FATAL = (QueueNotFound, InvalidParameter)


@dataclass
class WorkerStats:
    """Counters of one worker, for its status line (``add`` is safe from any thread)."""

    received: int = 0
    succeeded: int = 0
    retried: int = 0
    rejected: int = 0
    released: int = 0
    lost: int = 0
    kept: int = 0  # rejected, not dead-lettered (its queue has none): retried later
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, n: int = 1) -> None:
        if name:
            with self._lock:
                setattr(self, name, getattr(self, name) + n)

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in vars(self).items() if not k.startswith("_"))


@dataclass
class WorkerOptions:
    """The options both workers share, checked once (ranges SQL checks are left to SQL)."""

    queues: list[str]
    concurrency: int
    batch_size: int
    visibility_timeout: float | None
    heartbeat_interval: float | None
    grace_period: float
    wait: float
    backoff: Mapping[str, Backoff] | Backoff
    leases: dict[str, float] = field(default_factory=dict)
    #: The FIFO queues among ``queues`` (read with the leases): see :meth:`Rounds.round`.
    fifo: set[str] = field(default_factory=set)

    @classmethod
    def check(
        cls,
        queues: str | Sequence[str],
        concurrency: int,
        batch_size: int | None,
        visibility_timeout: Seconds | None,
        heartbeat_interval: Seconds | None,
        grace_period: Seconds,
        wait: Seconds,
        backoff: Backoff | Mapping[str, Backoff] | None,
    ) -> WorkerOptions:
        qs = [queues] if isinstance(queues, str) else list(dict.fromkeys(queues))
        if not qs:
            raise ValueError("a worker needs at least one queue")
        if concurrency < 1:
            raise ValueError(f"concurrency = {concurrency}: need at least 1")
        # receive's ranges (max_messages, wait) are SQL's to check: a bad one stops run() at once;
        # a batch above the free slots is never asked for
        batch = concurrency if batch_size is None else batch_size
        vt = None if visibility_timeout is None else seconds(visibility_timeout)
        if vt is not None and vt <= 0:
            raise ValueError(f"visibility_timeout = {vt}: a worker needs a lease > 0")
        hb = None if heartbeat_interval is None else seconds(heartbeat_interval)
        if hb is not None and hb <= 0:
            raise ValueError(f"heartbeat_interval = {hb}: need > 0")
        return cls(qs, concurrency, batch, vt, hb, max(0.0, seconds(grace_period)),
                   seconds(wait), backoff if backoff is not None else Backoff())

    def interval(self, queue: str, lease: float | None = None) -> float:
        """Seconds between heartbeats of a job of ``queue``."""
        lease = self.leases[queue] if lease is None else lease
        return self.heartbeat_interval if self.heartbeat_interval is not None else lease / 3

    def backoff_for(self, job: BaseJob) -> Backoff:
        """The task's own backoff, else the queue's, else the worker's."""
        if job.task is not None and job.task.backoff is not None:
            return job.task.backoff
        if isinstance(self.backoff, Backoff):
            return self.backoff
        return self.backoff.get(job.queue, Backoff())

    def set_lease(self, queue: str, lease: float) -> None:
        if lease <= 0:
            raise ValueError(f"queue {queue!r}: visibility_timeout 0, a worker needs a lease > 0")
        if self.leases.get(queue) not in (None, lease):
            logger.info("queue %s: lease now %.3gs (the queue's visibility_timeout)", queue, lease)
        interval = self.interval(queue, lease)
        if interval >= lease:
            logger.warning("queue %s: heartbeat_interval %.3gs >= lease %.3gs: leases lapse",
                           queue, interval, lease)
        self.leases[queue] = lease


def gathered(free: int, concurrency: int, since: float) -> bool:
    """Whether a receive for ``free`` slots should go now: all slots are free (an idle worker
    receives at once), or the running jobs have had :data:`GATHER` seconds since the first slot
    freed (``since``) to finish too."""
    return free >= concurrency or monotonic() - since >= GATHER


def per_queue(values: Mapping[str, float]) -> str:
    """``30s``, or ``a 30s, b 60s`` when the queues differ."""
    distinct = set(values.values())
    if len(distinct) == 1:
        return f"{distinct.pop():.3g}s"
    return ", ".join(f"{q} {v:.3g}s" for q, v in values.items())


class Rounds:
    """The worker's receive rounds: each queue short-polled, the last one (turning, so none
    starves) long-polled for a slice; the leases read again every :data:`LEASE_REFRESH`."""

    def __init__(
        self, options: WorkerOptions, stats: WorkerStats, what: str, pulse: Pulse | None = None,
    ) -> None:
        self.options = options
        self.stats = stats
        self.pulse = pulse  #: the worker's registration: its receives name the consumer
        self.turn = 0
        self.refresh_at = 0.0
        # a lost server: warn once, retry with capped exponential backoff and jitter, say when
        # it works again
        self.outage = outage.Outage(logger, what, base=IDLE_SLEEP, cap=30.0)

    def leases(self) -> Plan[None]:
        """Each queue's lease: the worker's, else the queue's visibility_timeout (read now); and
        which queues are FIFO."""
        o = self.options
        for q in o.queues:
            if o.visibility_timeout is not None:
                o.set_lease(q, o.visibility_timeout)
                try:
                    config = yield ClientCall("get_queue", (q,))
                except QueueNotFound:  # not there yet: its receives will say so
                    continue
            else:
                config = yield ClientCall("get_queue", (q,))
                o.set_lease(q, config.visibility_timeout)
            if config.fifo:
                o.fifo.add(q)
            else:
                o.fifo.discard(q)
        self.refresh_at = monotonic() + LEASE_REFRESH

    def _take(self, queue: str, n: int, wait: float) -> Plan[list[Message]]:
        """Up to ``n`` messages of ``queue``. A FIFO queue's receive may hand several messages of
        one group, which the worker would run at once, out of order: there, one message a
        receive (the head of the group ready longest; its group is then held), until ``n`` or
        none is left."""
        if queue not in self.options.fifo:
            return (yield from self._receive(queue, n, wait))
        messages: list[Message] = []
        while len(messages) < n:
            got = yield from self._receive(queue, 1, wait if not messages else 0.0)
            if not got:
                break
            messages += got
        return messages

    def _receive(self, queue: str, n: int, wait: float) -> Plan[list[Message]]:
        """One receive. It carries no deletes: finished jobs are deleted beside the receives
        (see :mod:`queue_pg.jobs.acks`), so a claim never waits for them."""
        kwargs: dict[str, Any] = {"visibility_timeout": self.options.leases[queue], "wait": wait}
        if self.pulse is not None and self.pulse.consumer is not None:
            kwargs["consumer"] = self.pulse.consumer
        try:
            messages: list[Message] = yield ClientCall("receive", (queue, n), kwargs)
        except OverLimit:  # a short poll on a queue at its in_flight_limit
            return []
        except ConsumerNotFound:  # reaped while its connection was lost: the next rounds
            if self.pulse is not None:  # receive without it until it registers again
                self.pulse.refused()
            return []
        return messages

    def round(
        self, free: int, stopped: Callable[[], bool], start: Callable[[Message], Any]
    ) -> Plan[float]:
        """Receive for up to ``free`` jobs, ``start`` each message; returns the pause before
        the next round (0: none). Messages received after a stop are released, not started."""
        o = self.options
        n = len(o.queues)
        order = [o.queues[(self.turn + i) % n] for i in range(n)]
        got = 0
        try:
            if o.visibility_timeout is None and monotonic() >= self.refresh_at:
                yield from self.leases()
            for i, queue in enumerate(order):
                if stopped() or free == 0:
                    break
                wait = min(o.wait, POLL_SLICE) if i == n - 1 else 0.0
                messages = yield from self._take(queue, min(free, o.batch_size), wait)
                self.stats.add("received", len(messages))
                if stopped():  # received after the stop: never started
                    self.stats.add("released", (yield from release(messages)))
                    break
                for m in messages:
                    start(m)
                got += len(messages)
                free -= len(messages)
            self.outage.recovered()
        except FATAL:
            raise
        except Exception as exc:
            pause = self.outage.failed(exc)
            if not outage.is_connection_error(exc):
                logger.exception("receive failed; retrying in %.1fs", pause)
            return pause
        self.turn += 1
        return IDLE_SLEEP if got == 0 and o.wait == 0 else 0.0


def resolve_task(
    registry: Registry | None, job: BaseJob
) -> tuple[Task | None, list[Any], dict[str, Any]]:
    """The task a job runs and its arguments (no task: a plain handler); Reject for a message
    that can never run: a body the client could not decode, or one no task fits."""
    if isinstance(job.body, UndecodableBody):
        raise Reject(f"undecodable body: {job.body.error}")
    if registry is None:
        return None, [], {}
    task, args, kwargs = registry.resolve(job.body, job.queue)
    job.task = task
    return task, args, kwargs


class WorkerBase(Generic[C, H]):
    """What both workers are made of: a client, queues, a handler or a registry of tasks, the
    options, counters and receive rounds. Their options are the same; see :class:`queue_pg.Worker`.
    """

    #: Handlers that run at once when ``concurrency`` is not given.
    default_concurrency = 4

    def __init__(
        self,
        client: C,
        queues: str | Sequence[str],
        handler: H | Registry,
        *,
        concurrency: int | None = None,
        batch_size: int | None = None,
        visibility_timeout: Seconds | None = None,
        heartbeat_interval: Seconds | None = None,
        grace_period: Seconds = 30.0,
        wait: Seconds = 20,
        backoff: Backoff | Mapping[str, Backoff] | None = None,
        job_log_level: int | str | None = None,
        detect_crashes: bool = True,
        pool: str = "threads",
        modules: Sequence[str] = (),
    ) -> None:
        check_pool(pool, handler)
        #: "threads", or "processes": each handler runs its tasks in a child process of its own
        #: (queue_pg.jobs.pool), which imports ``modules`` (and each task's own module)
        self.pool = pool
        self._modules = tuple(modules)
        self.client = client
        # each job's start and finish logged at this level (queue_pg.jobs.joblog);
        # the queues of max_running tasks are polled with their tasks' queues
        self.job_log_level = joblog.level_of(job_log_level)
        if isinstance(handler, Registry):
            queues = handler.with_limited([queues] if isinstance(queues, str) else queues)
        self.settings = WorkerOptions.check(
            queues, self.default_concurrency if concurrency is None else concurrency,
            batch_size, visibility_timeout, heartbeat_interval, grace_period, wait, backoff)
        self._registry = handler if isinstance(handler, Registry) else None
        self._handler: H | None = None if isinstance(handler, Registry) else handler
        self.stats = WorkerStats()
        self._acks = Acks(lambda: self._acks_wake(), self.stats.add)
        # registered as a consumer on a connection of its own: a crash ends its leases in
        # seconds (queue_pg.jobs.pulse)
        self._pulse = Pulse(detect_crashes)
        self._rounds = Rounds(self.settings, self.stats, "worker", self._pulse)
        self._stop_requested = False
        #: One child process per handler under pool="processes" (queue_pg.jobs.pool).
        self._slots = [ProcessSlot(self._modules, i) for i in range(self.settings.concurrency)
                       ] if pool == "processes" else []
        self._setup()

    def _setup(self) -> None:
        """The worker's own state (threads, tasks), made at the end of __init__."""

    def _acks_wake(self) -> None:
        """A finished job waits for its delete: make sure a flush is due (see Acks)."""

    def _settled_at_stop(self, done: bool) -> None:
        """After the last flush of a stop: say what could not be deleted."""
        if not done:
            logger.warning("%d finished job(s) could not be deleted before the stop; their"
                           " leases bring them back (they run again)", len(self._acks))

    @property
    def queues(self) -> list[str]:
        return self.settings.queues

    @property
    def crash_detection(self) -> bool:
        """Whether this worker is registered as a consumer now, so that its leases end within
        seconds if it dies (False: turned off, not registered yet, or registration failing,
        which the log says at ERROR)."""
        return self._pulse.enabled and self._pulse.active
