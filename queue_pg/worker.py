"""Workers: receive messages, run a handler on each, delete it on success.

The queue rules stay in SQL: a worker only calls Client methods. Around the handler it adds what
a consumer has to do by itself with leases (seed 001, item 3):

- a heartbeat extends the lease while the handler runs (``change_visibility``), and tells the
  handler (``job.cancelled`` / ``job.raise_if_cancelled()``) when it cannot, so the handler stops
  before the lease lapses and another worker starts the same message;
- a failed message gets its error in its attributes (``update``) and is made visible again after
  an exponential backoff with jitter (``change_visibility(release=True)``: a planned retry, not a
  lease expiry); the engine dead-letters it after the queue's ``max_receive_count``;
- a message that can never succeed (:class:`Reject`: an unknown task, arguments that do not fit,
  a task's retries used up) is dead-lettered at once with the reason (``dead_letter``);
- ``job.checkpoint(state)`` saves progress in the message (a body-only ``update`` that leaves the
  lease alone), so a redelivery after a crash resumes instead of starting over;
- SIGTERM / SIGINT stop receiving, let running handlers finish within a grace period, and release
  what was received but not started; a second signal exits at once and leases bring the rest back.

:class:`Worker` runs handlers in threads on a :class:`queue_pg.Client`; :class:`AsyncWorker` is
its asyncio twin on a :class:`queue_pg.AsyncClient`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os
import random
import signal
import socket
import threading
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from queue import SimpleQueue
from time import monotonic
from types import FrameType
from typing import TYPE_CHECKING, Any

from queue_pg import _retry
from queue_pg.errors import (
    InvalidParameter,
    LeaseLimitExceeded,
    MessageNotFound,
    OverLimit,
    QueueNotFound,
    StaleReceipt,
)
from queue_pg.types import JSON, Message, Seconds, seconds

if TYPE_CHECKING:
    from queue_pg.aio import AsyncClient
    from queue_pg.client import Client
    from queue_pg.tasks import Registry, Task

__all__ = [
    "AsyncJob",
    "AsyncWorker",
    "Backoff",
    "Job",
    "LeaseLost",
    "Reject",
    "Worker",
    "WorkerStats",
    "current_job",
]

logger = logging.getLogger("queue_pg.worker")

#: Key of a task envelope that belongs to the worker: the last checkpoint.
STATE_KEY = "state"
#: Attribute of a message that the worker writes: the record of its last failed attempt (type,
#: message, traceback, attempt, at, worker), so a dead-lettered message shows why it failed.
ERROR_KEY = "error"

#: Longest a single receive long-polls. The client cannot be interrupted while it waits on
#: LISTEN, so a worker polls in slices this long to notice a stop request (and its other queues).
POLL_SLICE = 1.0
#: Pause after an empty short poll (``wait=0``) and after a failed receive (doubling to 30 s,
#: with jitter).
IDLE_SLEEP = 0.25
#: Seconds between status lines of a busy worker (logged only when something changed).
STATUS_INTERVAL = 60.0
#: Signals that stop a worker gracefully (a second one: at once).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Longest traceback kept in a message's error record (its tail): attributes stay small.
MAX_TRACEBACK = 4000

# Why a job was cancelled. LOST: someone else may hold the message now, never touch it again.
LOST = "lease lost"
MAX_LEASE = "max_lease reached"
TIMEOUT = "task timeout"
SHUTDOWN = "worker shutdown"

#: Receive errors that retrying cannot fix (a dropped queue, a lease past max_lease): the worker
#: stops, after letting its running jobs finish, and run() raises them.
_FATAL = (QueueNotFound, InvalidParameter)

_current: contextvars.ContextVar[_JobBase] = contextvars.ContextVar("queue_pg_job")


class LeaseLost(Exception):
    """The job can no longer count on its lease: stop now, the message will be delivered again.

    Raised by ``job.raise_if_cancelled()``, by a checkpoint that was refused, and by a checkpoint
    of a cancelled job (after saving). A handler that lets it propagate has its message released
    (worker shutdown, max_lease) or left alone (the lease went to someone else).
    """


class Reject(Exception):
    """Raised by a handler for a message that can never succeed: it is not retried but
    dead-lettered at once, the exception's text as ``dead_letter_reason`` (on a queue without a
    dead-letter queue: deleted, and logged in full).

    The worker raises it itself for an unknown task name or arguments that do not fit the task.
    """


def current_job() -> _JobBase:
    """The job the calling handler runs (LookupError outside a handler)."""
    return _current.get()


@dataclass(frozen=True)
class Backoff:
    """Delay before a failed message is delivered again: ``base * factor**(attempt-1)``, at most
    ``cap`` seconds, of which the fraction ``jitter`` is random (0.5: "equal jitter"), so the
    failures of one outage do not all come back at the same moment."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (self.base >= 0 and self.factor >= 1 and self.cap >= 0 and 0 <= self.jitter <= 1):
            raise ValueError(
                f"invalid {self!r}: need base >= 0, factor >= 1, cap >= 0, 0 <= jitter <= 1"
            )

    def delay(self, attempt: int) -> float:
        """The delay after failed attempt number ``attempt`` (the message's receive_count)."""
        exponent = min(max(attempt - 1, 0), 64)
        full = min(self.cap, self.base * self.factor**exponent)
        return full * (1 - self.jitter) + random.uniform(0, full * self.jitter)


@dataclass
class WorkerStats:
    """Counters of one worker, for its status line (``add`` is safe from any thread)."""

    received: int = 0
    succeeded: int = 0
    retried: int = 0
    rejected: int = 0
    released: int = 0
    lost: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in vars(self).items() if not k.startswith("_"))


# --- jobs -----------------------------------------------------------------------------------------


class _JobBase:
    """What a handler gets: the message, its saved state, and whether it must stop."""

    def __init__(self, message: Message, lease: float, task: Task | None = None) -> None:
        assert message.receipt is not None
        self.message = message
        self.receipt: str = message.receipt
        self.lease = lease
        self.task = task
        self.body: JSON = message.body
        self.cancel_reason: str | None = None

    @property
    def id(self) -> int:
        return self.message.id

    @property
    def queue(self) -> str:
        return self.message.queue

    @property
    def receive_count(self) -> int:
        """1 on the first delivery; the attempt number."""
        return self.message.receive_count

    @property
    def state(self) -> JSON:
        """The last checkpoint's state (None before the first), from this or an earlier run."""
        return self.body.get(STATE_KEY) if isinstance(self.body, dict) else None

    @property
    def cancelled(self) -> bool:
        """True once the handler should stop: its lease cannot be kept (see cancel_reason)."""
        return self.cancel_reason is not None

    def raise_if_cancelled(self) -> None:
        if self.cancel_reason is not None:
            raise LeaseLost(f"message {self.id} of queue {self.queue!r}: {self.cancel_reason}")

    def cancel(self, reason: str) -> None:
        """Ask the handler to stop; the first reason stays, except that LOST wins: it means the
        worker may no longer touch the message."""
        if self.cancel_reason != LOST:
            self.cancel_reason = reason

    def _body_with(self, key: str, value: JSON) -> dict[str, Any]:
        if not isinstance(self.body, dict):
            raise TypeError("checkpoint needs a JSON object body (a task envelope),"
                            f" not {type(self.body).__name__}")
        return {**self.body, key: value}

    def _lost(self, exc: Exception) -> LeaseLost:
        self.cancel(LOST)
        return LeaseLost(f"message {self.id} of queue {self.queue!r}: {exc}")


class Job(_JobBase):
    """A message being handled by a :class:`Worker` thread."""

    def __init__(
        self, client: Client, message: Message, lease: float, task: Task | None = None
    ) -> None:
        super().__init__(message, lease, task)
        self._client = client
        self.lock = threading.Lock()  # orders heartbeats before the message is settled
        self.beating = True
        self.started = monotonic()
        self.next_beat = 0.0
        self.deadline: float | None = None

    def checkpoint(self, state: JSON) -> None:
        """Save ``state`` in the message, so a redelivery resumes from it; :attr:`state` reads
        it back. A body-only ``update`` under our receipt: the lease stays as the heartbeat keeps
        it, so a checkpoint works up to the end of the lease, max_lease included.

        LeaseLost if the update is refused (the lease is someone else's), and, after the state is
        saved, if the job was cancelled (max_lease, timeout, shutdown): the handler stops there,
        and the message is released or retried and resumes from this state.
        """
        body = self._body_with(STATE_KEY, state)
        try:
            self._client.update(self.queue, self.receipt, body=body, visibility_timeout=None)
        except (StaleReceipt, MessageNotFound) as exc:
            raise self._lost(exc) from exc
        self.body = body
        self.raise_if_cancelled()


class AsyncJob(_JobBase):
    """A message being handled by an :class:`AsyncWorker` task."""

    def __init__(
        self, client: AsyncClient, message: Message, lease: float, task: Task | None = None
    ) -> None:
        super().__init__(message, lease, task)
        self._client = client

    async def checkpoint(self, state: JSON) -> None:
        """Async twin of :meth:`Job.checkpoint`."""
        body = self._body_with(STATE_KEY, state)
        try:
            await self._client.update(self.queue, self.receipt, body=body, visibility_timeout=None)
        except (StaleReceipt, MessageNotFound) as exc:
            raise self._lost(exc) from exc
        self.body = body
        self.raise_if_cancelled()


# --- what to do once a handler ended (shared by both workers) -------------------------------------

SyncHandler = Callable[[Job], object]
AsyncHandler = Callable[[AsyncJob], Awaitable[object]]


@dataclass
class _Settings:
    """The options both workers share, checked once."""

    queues: list[str]
    concurrency: int
    batch_size: int
    visibility_timeout: float | None
    heartbeat_interval: float | None
    grace_period: float
    wait: float
    backoff: Mapping[str, Backoff] | Backoff
    leases: dict[str, float] = field(default_factory=dict)

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
    ) -> _Settings:
        qs = [queues] if isinstance(queues, str) else list(dict.fromkeys(queues))
        if not qs:
            raise ValueError("a worker needs at least one queue")
        if concurrency < 1:
            raise ValueError(f"concurrency = {concurrency}: need at least 1")
        # receive's range (max_messages) is SQL's to check: a bad one stops run() at once;
        # a batch above the free slots is never asked for
        batch = concurrency if batch_size is None else batch_size
        vt = None if visibility_timeout is None else seconds(visibility_timeout)
        if vt is not None and vt <= 0:
            raise ValueError(f"visibility_timeout = {vt}: a worker needs a lease > 0")
        hb = None if heartbeat_interval is None else seconds(heartbeat_interval)
        if hb is not None and hb <= 0:
            raise ValueError(f"heartbeat_interval = {hb}: need > 0")
        w = seconds(wait)
        if not 0 <= w <= 20:
            raise ValueError(f"wait = {w}: allowed 0 to 20 seconds (receive's range)")
        return cls(qs, concurrency, batch, vt, hb, max(0.0, seconds(grace_period)), w,
                   backoff if backoff is not None else Backoff())

    def resolve_leases(self, queue_vt: Callable[[str], float]) -> None:
        """Lease length per queue: ours, else the queue's visibility_timeout (read once)."""
        for q in self.queues:
            lease = self.visibility_timeout if self.visibility_timeout is not None else queue_vt(q)
            if lease <= 0:
                raise ValueError(f"queue {q!r}: visibility_timeout 0, a worker needs a lease > 0")
            interval = self.interval(q, lease)
            if interval >= lease:
                logger.warning("queue %s: heartbeat_interval %.3gs >= lease %.3gs: leases lapse",
                               q, interval, lease)
            self.leases[q] = lease

    def interval(self, queue: str, lease: float | None = None) -> float:
        lease = self.leases[queue] if lease is None else lease
        return self.heartbeat_interval if self.heartbeat_interval is not None else lease / 3

    def backoff_for(self, job: _JobBase) -> Backoff:
        if job.task is not None and job.task.backoff is not None:
            return job.task.backoff
        if isinstance(self.backoff, Backoff):
            return self.backoff
        return self.backoff.get(job.queue, Backoff())

    def poll_plan(self, turn: int) -> list[tuple[str, float]]:
        """(queue, wait) of one receive round: every queue short-polled, the last one (turning,
        so none starves) long-polled for a slice."""
        n = len(self.queues)
        order = [self.queues[(turn + i) % n] for i in range(n)]
        return [(q, min(self.wait, POLL_SLICE) if i == n - 1 else 0.0) for i, q in enumerate(order)]


def _decide(job: _JobBase, exc: BaseException | None) -> tuple[str, str]:
    """(action, reason) for a message whose handler ended, raising ``exc`` or not.

    delete: it succeeded. drop: the lease is someone else's, leave the message alone.
    reject: it can never succeed, dead-letter it now (``reason`` says why). release: make it
    visible now (shutdown, max_lease). retry: visible again after a backoff, the error recorded.
    """
    if exc is None:
        return "delete", ""
    if job.cancel_reason == LOST:
        return "drop", job.cancel_reason
    if isinstance(exc, Reject):
        return "reject", str(exc)
    if isinstance(exc, LeaseLost) and job.cancel_reason in (SHUTDOWN, MAX_LEASE):
        return "release", job.cancel_reason
    retries = job.task.retries if job.task is not None else None
    if retries is not None and job.receive_count > retries:
        return "reject", (f"failed {job.receive_count} times (retries = {retries}),"
                          f" last: {type(exc).__name__}: {exc}")
    return "retry", ""


def _error_attributes(job: _JobBase, exc: BaseException) -> dict[str, JSON]:
    """The record of a failed attempt, merged into the message's attributes (raw messages and
    task envelopes alike; the body stays the sender's) so a dead-lettered message shows why."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    error: dict[str, JSON] = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc)[:1000],
        "traceback": tb[-MAX_TRACEBACK:],
        "attempt": job.receive_count,
        "at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "worker": f"{socket.gethostname()}:{os.getpid()}",
    }
    return {ERROR_KEY: error}


def _log_rejected(job: _JobBase, reason: str, moved: bool) -> None:
    if moved:
        logger.warning("%s rejected, not retried: %s; dead-lettered", _describe(job), reason)
    else:
        logger.warning("%s rejected, not retried: %s; not dead-lettered: the message was"
                       " gone already (expired)", _describe(job), reason)


def _log_deleted_without_dlq(
    job: _JobBase, reason: str, exc: BaseException, why: Exception
) -> None:
    """A rejected message of a queue without a dead-letter queue is deleted (a retry could
    never succeed): its full content goes to the log, the only place left to find it."""
    logger.error(
        "%s rejected, not retried: %s -- DELETED, not dead-lettered: %s; attributes=%s body=%s",
        _describe(job), reason, why, job.message.attributes, job.body,
        exc_info=None if isinstance(exc, Reject) else exc,  # a handler's failure: its traceback
    )


def _describe(job: _JobBase) -> str:
    name = job.task.name if job.task is not None else "handler"
    return f"{name} (message {job.id} of {job.queue}, attempt {job.receive_count})"


def _resolve_task(
    registry: Registry | None, job: _JobBase
) -> tuple[Task | None, list[Any], dict[str, Any]]:
    if registry is None:
        return None, [], {}
    task, args, kwargs = registry.resolve(job.body)
    job.task = task
    return task, args, kwargs


# --- the threaded worker --------------------------------------------------------------------------


class Worker:
    """Runs ``handler(job)`` (or the registry's tasks) on the messages of ``queues``.

    ``concurrency`` threads run handlers; a receive asks for at most as many messages as there
    are free threads (and ``batch_size``), so nothing waits in a local buffer while its lease
    runs. ``visibility_timeout`` (None: each queue's own) is the lease a receive takes and each
    heartbeat renews, every ``heartbeat_interval`` (None: a third of the lease). ``backoff``: a
    :class:`Backoff`, or one per queue name; a task's own backoff wins. ``wait``: longest a
    receive long-polls (in slices of :data:`POLL_SLICE`). ``grace_period``: how long a stop
    waits for running handlers.

    The client's pool should have ``concurrency + 2`` connections (receive, heartbeat, one per
    handler thread). Expired messages are swept by the client's own ``sweep_interval``.
    """

    def __init__(
        self,
        client: Client,
        queues: str | Sequence[str],
        handler: SyncHandler | Registry,
        *,
        concurrency: int = 4,
        batch_size: int | None = None,
        visibility_timeout: Seconds | None = None,
        heartbeat_interval: Seconds | None = None,
        grace_period: Seconds = 30.0,
        wait: Seconds = 20,
        backoff: Backoff | Mapping[str, Backoff] | None = None,
    ) -> None:
        from queue_pg.tasks import Registry

        if inspect.iscoroutinefunction(handler):
            raise TypeError("an async handler needs AsyncWorker (Worker runs plain functions)")
        self.client = client
        self.settings = _Settings.check(queues, concurrency, batch_size, visibility_timeout,
                                        heartbeat_interval, grace_period, wait, backoff)
        self._registry = handler if isinstance(handler, Registry) else None
        self._handler = None if isinstance(handler, Registry) else handler
        self.stats = WorkerStats()
        # a lost server: warn once, retry the receive loop with capped exponential backoff and
        # jitter, say when it works again (queue_pg._retry)
        self._outage = _retry.Outage(logger, "worker", base=IDLE_SLEEP, cap=30.0)
        self._cond = threading.Condition()
        self._running: set[Job] = set()
        self._inbox: SimpleQueue[Job | None] = SimpleQueue()
        self._stop_requested = False
        self._stop_signal: int | None = None
        self._stopped_at: float | None = None
        self._beat_wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._closed = False

    @property
    def queues(self) -> list[str]:
        return self.settings.queues

    # --- control ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop receiving and return from :meth:`run` once running handlers are done (or the
        grace period is over). Safe from any thread; a signal handler does the same."""
        self._stop_requested = True
        with self._cond:
            self._cond.notify_all()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only flag writes here: a signal may land while this thread holds a lock or is logging.
        if self._stop_requested:
            os.write(2, f"queue_pg worker: second {signal.Signals(signum).name}, exiting now;"
                        " leases bring unfinished messages back\n".encode())
            os._exit(128 + signum)
        self._stop_signal = signum
        self._stop_requested = True

    def run(self, *, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
        """Receive and handle messages until :meth:`stop` or one of ``signals`` (handled when
        called in the main thread). Returns after the graceful stop."""
        self.settings.resolve_leases(lambda q: self.client.get_queue(q).visibility_timeout)
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self._start_threads()
            logger.info("ready: %s; %d thread(s), lease %s, heartbeat every %s",
                        ", ".join(self.queues), self.settings.concurrency,
                        _fmt_per_queue(self.settings.leases),
                        _fmt_per_queue({q: self.settings.interval(q) for q in self.queues}))
            try:
                self._loop()
            finally:  # a configuration error still lets running jobs finish
                self._drain()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stop_threads()
        logger.info("stopped: %s", self.stats.line())

    # --- receiving --------------------------------------------------------------------------------

    def _free_slots(self) -> int:
        """Wait until a thread is free (or a stop); how many are."""
        with self._cond:
            while not self._stop_requested:
                free = self.settings.concurrency - len(self._running)
                if free > 0:
                    return free
                self._cond.wait(0.1)
        return 0

    def _loop(self) -> None:
        turn = 0
        status_at, status = monotonic() + STATUS_INTERVAL, self.stats.line()
        while not self._stop_requested:
            if monotonic() >= status_at:
                status_at = monotonic() + STATUS_INTERVAL
                if self.stats.line() != status:
                    status = self.stats.line()
                    logger.info("running=%d/%d %s", len(self._running),
                                self.settings.concurrency, status)
            free = self._free_slots()
            if free == 0:
                break
            got = 0
            try:
                for queue, wait in self.settings.poll_plan(turn):
                    if self._stop_requested or free == 0:
                        break
                    messages = self._receive(queue, min(free, self.settings.batch_size), wait)
                    if self._stop_requested:  # received after the stop: never started
                        self._release(messages)
                        break
                    for m in messages:
                        self._start(m)
                    got += len(messages)
                    free -= len(messages)
                self._outage.recovered()
            except _FATAL:
                raise
            except Exception as exc:
                pause = self._outage.failed(exc)
                if not _retry.is_connection_error(exc):
                    logger.exception("receive failed; retrying in %.1fs", pause)
                self._sleep(pause)
                continue
            turn += 1
            if got == 0 and self.settings.wait == 0:
                self._sleep(IDLE_SLEEP)

    def _receive(self, queue: str, n: int, wait: float) -> list[Message]:
        try:
            messages = self.client.receive(
                queue, n, visibility_timeout=self.settings.leases[queue], wait=wait
            )
        except OverLimit:  # a short poll on a queue at its in_flight_limit: nothing for now
            return []
        self.stats.add("received", len(messages))
        return messages

    def _sleep(self, duration: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._stop_requested, duration)

    def _release(self, messages: Sequence[Message]) -> None:
        """Make messages received but not started visible again at once."""
        for m in messages:
            assert m.receipt is not None
            try:
                self.client.change_visibility(m.queue, m.receipt, 0)
                self.stats.add("released")
            except Exception:
                logger.warning("could not release message %s; its lease brings it back",
                               m.id, exc_info=True)
        if messages:
            logger.info("released %d received, unstarted message(s)", len(messages))

    def _start(self, message: Message) -> None:
        job = Job(self.client, message, self.settings.leases[message.queue])
        job.next_beat = job.started + self.settings.interval(message.queue)
        with self._cond:
            self._running.add(job)
        self._beat_wake.set()
        self._inbox.put(job)

    # --- threads ----------------------------------------------------------------------------------

    def _start_threads(self) -> None:
        # Daemon threads: a handler still running after the grace period must not keep the
        # process alive; its lease brings the message back.
        for i in range(self.settings.concurrency):
            t = threading.Thread(target=self._serve, name=f"queue_pg-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        threading.Thread(target=self._heartbeat, name="queue_pg-heartbeat", daemon=True).start()

    def _stop_threads(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._inbox.put(None)
        self._beat_wake.set()
        for t in self._threads:
            t.join(0.05)

    def _serve(self) -> None:
        while True:
            job = self._inbox.get()
            if job is None:
                return
            token = _current.set(job)
            try:
                self._handle(job)
            except BaseException:  # never lose the slot, whatever a handler did
                logger.exception("internal error handling message %s", job.id)
            finally:
                _current.reset(token)
                with job.lock:
                    job.beating = False
                with self._cond:
                    self._running.discard(job)
                    self._cond.notify_all()

    def _handle(self, job: Job) -> None:
        exc: BaseException | None = None
        try:
            task, args, kwargs = _resolve_task(self._registry, job)
            if task is not None:
                if task.timeout is not None:
                    job.deadline = job.started + task.timeout
                    self._beat_wake.set()
                task.run_sync(job, args, kwargs)
            else:
                assert self._handler is not None
                self._handler(job)
        except Exception as e:
            exc = e
        with job.lock:  # no heartbeat after this: the settle below sets the visibility
            job.beating = False
        self._settle(job, exc)

    def _settle(self, job: Job, exc: BaseException | None) -> None:
        action, reason = _decide(job, exc)
        c, q, r = self.client, job.queue, job.receipt
        try:
            if action == "delete":
                if not c.delete(q, r):
                    logger.warning("message %s expired before its delete", job.id)
                self.stats.add("succeeded")
            elif action == "drop":
                self.stats.add("lost")
                logger.warning("%s ended after its lease was lost (%s); not settled",
                               _describe(job), reason, exc_info=exc)
            elif action == "release":
                c.change_visibility(q, r, 0)
                self.stats.add("released")
                logger.info("%s stopped (%s); message released", _describe(job), reason)
            elif action == "reject":
                assert exc is not None
                self._reject(job, exc, reason)
                self.stats.add("rejected")
            else:
                assert exc is not None
                delay = self.settings.backoff_for(job).delay(job.receive_count)
                logger.warning("%s failed: %s: %s; retry in %.3gs", _describe(job),
                               type(exc).__name__, exc, delay, exc_info=exc)
                self._retry(job, exc, delay)
                self.stats.add("retried")
        except (StaleReceipt, MessageNotFound) as e:
            self.stats.add("lost")
            logger.warning("%s: lease lost before it was settled (%s); it runs again"
                           " elsewhere -- is the lease too short?", _describe(job), e)
        except Exception:
            logger.exception("could not settle %s; its lease brings it back",
                             _describe(job))

    def _reject(self, job: Job, exc: BaseException, reason: str) -> None:
        """Dead-letter now, the error recorded; without a dead-letter queue: delete and log."""
        c, q, r = self.client, job.queue, job.receipt
        c.update(q, r, attributes=_error_attributes(job, exc), visibility_timeout=None)
        try:
            moved = c.dead_letter(q, r, reason)
        except InvalidParameter as e:  # the queue has no dead_letter_queue
            c.delete(q, r)
            _log_deleted_without_dlq(job, reason, exc, e)
            return
        _log_rejected(job, reason, moved)

    def _retry(self, job: Job, exc: BaseException, delay: float) -> None:
        """Record the error, then make the message visible after ``delay``: a planned retry
        (release=True), which the engine does not count as a lease expiry."""
        c, q, r = self.client, job.queue, job.receipt
        c.update(q, r, attributes=_error_attributes(job, exc), visibility_timeout=None)
        try:
            c.change_visibility(q, r, delay, release=True)
        except LeaseLimitExceeded:  # past max_lease: no backoff, but still recorded and retried
            logger.warning("backoff of %.3gs for message %s passes max_lease;"
                           " retrying it at once", delay, job.id)
            c.change_visibility(q, r, 0, release=True)

    # --- heartbeat --------------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        """One thread renews every running job's lease when it is due."""
        while not self._closed:
            with self._cond:
                jobs = list(self._running)
            now = monotonic()
            due = now + 0.5
            for job in jobs:
                if job.deadline is not None and now >= job.deadline and job.beating:
                    job.cancel(TIMEOUT)
                    with job.lock:
                        job.beating = False  # the lease lapses unless the handler stops
                    logger.warning("%s passed its timeout; cancelled", _describe(job))
                if not job.beating:
                    continue
                if now >= job.next_beat:
                    self._beat(job)
                due = min(due, job.next_beat)
                if job.deadline is not None:
                    due = min(due, job.deadline)
            self._beat_wake.wait(max(0.0, due - monotonic()))
            self._beat_wake.clear()

    def _beat(self, job: Job) -> None:
        interval = self.settings.interval(job.queue)
        with job.lock:
            if not job.beating:
                return
            try:
                self.client.change_visibility(job.queue, job.receipt, job.lease)
                job.next_beat = monotonic() + interval
                return
            except (StaleReceipt, MessageNotFound) as exc:
                job.cancel(LOST)
                why = str(exc)
            except LeaseLimitExceeded as exc:
                job.cancel(MAX_LEASE)
                why = str(exc)
            except Exception:
                logger.warning("heartbeat of message %s failed; trying again", job.id,
                               exc_info=True)
                job.next_beat = monotonic() + min(interval, 1.0) / 2
                return
            job.beating = False
        logger.warning("%s cannot keep its lease: %s", _describe(job), why)

    # --- stopping ---------------------------------------------------------------------------------

    def _drain(self) -> None:
        """After the stop: wait up to the grace period for running handlers."""
        self._stopped_at = monotonic()
        name = signal.Signals(self._stop_signal).name if self._stop_signal else "stop()"
        with self._cond:
            running = len(self._running)
        logger.info("%s: stopped receiving; waiting up to %.3gs for %d running job(s)",
                    name, self.settings.grace_period, running)
        deadline = self._stopped_at + self.settings.grace_period
        with self._cond:
            while self._running and monotonic() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - monotonic())))
            left = list(self._running)
        for job in left:
            job.cancel(SHUTDOWN)
            with job.lock:
                job.beating = False
        if left:
            logger.warning("%d job(s) still running after the grace period (%s);"
                           " their leases bring the messages back",
                           len(left), ", ".join(_describe(j) for j in left))


def _fmt_per_queue(values: Mapping[str, float]) -> str:
    distinct = set(values.values())
    if len(distinct) == 1:
        return f"{distinct.pop():.3g}s"
    return ", ".join(f"{q} {v:.3g}s" for q, v in values.items())


# --- the asyncio worker ---------------------------------------------------------------------------


class AsyncWorker:
    """The asyncio twin of :class:`Worker`: ``concurrency`` handler tasks on an AsyncClient.

    Handlers are ``async def handler(job)``; a registry's async tasks are awaited and its plain
    functions run in a thread. A task's ``timeout`` cancels it for real here. Same options as
    :class:`Worker`; ``await worker.run()``.
    """

    def __init__(
        self,
        client: AsyncClient,
        queues: str | Sequence[str],
        handler: AsyncHandler | Registry,
        *,
        concurrency: int = 10,
        batch_size: int | None = None,
        visibility_timeout: Seconds | None = None,
        heartbeat_interval: Seconds | None = None,
        grace_period: Seconds = 30.0,
        wait: Seconds = 20,
        backoff: Backoff | Mapping[str, Backoff] | None = None,
    ) -> None:
        from queue_pg.tasks import Registry

        self.client = client
        self.settings = _Settings.check(queues, concurrency, batch_size, visibility_timeout,
                                        heartbeat_interval, grace_period, wait, backoff)
        self._registry = handler if isinstance(handler, Registry) else None
        self._handler = None if isinstance(handler, Registry) else handler
        self.stats = WorkerStats()
        # a lost server: warn once, retry the receive loop with capped exponential backoff and
        # jitter, say when it works again (queue_pg._retry)
        self._outage = _retry.Outage(logger, "worker", base=IDLE_SLEEP, cap=30.0)
        self._running: dict[asyncio.Task[None], AsyncJob] = {}
        self._stop_requested = False
        self._wake: asyncio.Event | None = None

    def stop(self) -> None:
        """Stop receiving; :meth:`run` returns after the graceful stop. Call it in the loop."""
        self._stop_requested = True
        if self._wake is not None:
            self._wake.set()

    def _on_signal(self, signum: int) -> None:
        if self._stop_requested:
            os.write(2, b"queue_pg worker: second signal, exiting now\n")
            os._exit(128 + signum)
        logger.info("%s: stopping", signal.Signals(signum).name)
        self.stop()

    async def run(self, *, signals: Sequence[signal.Signals] = STOP_SIGNALS) -> None:
        """Receive and handle until :meth:`stop` or one of ``signals`` (main thread only)."""
        leases = {q: (await self.client.get_queue(q)).visibility_timeout
                  for q in self.settings.queues if self.settings.visibility_timeout is None}
        self.settings.resolve_leases(leases.__getitem__)
        self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
        logger.info("ready: %s; %d task(s), lease %s", ", ".join(self.settings.queues),
                    self.settings.concurrency, _fmt_per_queue(self.settings.leases))
        try:
            try:
                await self._loop()
            finally:
                await self._drain()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
        logger.info("stopped: %s", self.stats.line())

    async def _loop(self) -> None:
        assert self._wake is not None
        turn = 0
        while not self._stop_requested:
            free = self.settings.concurrency - len(self._running)
            if free <= 0:
                self._wake.clear()
                await self._wake.wait()
                continue
            got = 0
            try:
                for queue, wait in self.settings.poll_plan(turn):
                    if self._stop_requested or free == 0:
                        break
                    try:
                        messages = await self.client.receive(
                            queue, min(free, self.settings.batch_size),
                            visibility_timeout=self.settings.leases[queue], wait=wait)
                    except OverLimit:
                        messages = []
                    self.stats.received += len(messages)
                    if self._stop_requested:
                        await self._release(messages)
                        break
                    for m in messages:
                        self._start(m)
                    got += len(messages)
                    free -= len(messages)
                self._outage.recovered()
            except _FATAL:
                raise
            except Exception as exc:
                pause = self._outage.failed(exc)
                if not _retry.is_connection_error(exc):
                    logger.exception("receive failed; retrying in %.1fs", pause)
                await self._sleep(pause)
                continue
            turn += 1
            if got == 0 and self.settings.wait == 0:
                await self._sleep(IDLE_SLEEP)

    async def _sleep(self, duration: float) -> None:
        assert self._wake is not None
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), duration)

    async def _release(self, messages: Sequence[Message]) -> None:
        for m in messages:
            assert m.receipt is not None
            try:
                await self.client.change_visibility(m.queue, m.receipt, 0)
                self.stats.released += 1
            except Exception:
                logger.warning("could not release message %s", m.id, exc_info=True)

    def _start(self, message: Message) -> None:
        job = AsyncJob(self.client, message, self.settings.leases[message.queue])
        task = asyncio.create_task(self._handle(job), name=f"queue_pg-job-{message.id}")
        self._running[task] = job

        def done(t: asyncio.Task[None]) -> None:
            self._running.pop(t, None)
            if self._wake is not None:
                self._wake.set()

        task.add_done_callback(done)

    async def _handle(self, job: AsyncJob) -> None:
        _current.set(job)  # this task's own context
        ended = asyncio.Event()
        beat = asyncio.create_task(self._heartbeat(job, ended))
        exc: BaseException | None = None
        try:
            task, args, kwargs = _resolve_task(self._registry, job)
            if task is not None:
                await asyncio.wait_for(task.run_async(job, args, kwargs), task.timeout)
            else:
                assert self._handler is not None
                await self._handler(job)
        except asyncio.TimeoutError as e:
            job.cancel(TIMEOUT)
            exc = e
        except asyncio.CancelledError as e:  # cancelled by the end of the grace period
            job.cancel(SHUTDOWN)
            exc = LeaseLost(f"message {job.id}: {SHUTDOWN}")
            exc.__cause__ = e
        except Exception as e:
            exc = e
        ended.set()  # a beat in progress completes first: the settle below has the last word
        await beat
        await self._settle(job, exc)

    async def _heartbeat(self, job: AsyncJob, ended: asyncio.Event) -> None:
        interval = self.settings.interval(job.queue)
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ended.wait(), interval)
            if ended.is_set():
                return
            try:
                await self.client.change_visibility(job.queue, job.receipt, job.lease)
            except (StaleReceipt, MessageNotFound) as exc:
                job.cancel(LOST)
                logger.warning("%s lost its lease: %s", _describe(job), exc)
                return
            except LeaseLimitExceeded as exc:
                job.cancel(MAX_LEASE)
                logger.warning("%s cannot keep its lease: %s", _describe(job), exc)
                return
            except Exception:
                logger.warning("heartbeat of message %s failed", job.id, exc_info=True)

    async def _settle(self, job: AsyncJob, exc: BaseException | None) -> None:
        action, reason = _decide(job, exc)
        c, q, r = self.client, job.queue, job.receipt
        try:
            if action == "delete":
                await c.delete(q, r)
                self.stats.succeeded += 1
            elif action == "drop":
                self.stats.lost += 1
                logger.warning("%s ended after its lease was lost", _describe(job))
            elif action == "release":
                await c.change_visibility(q, r, 0)
                self.stats.released += 1
            elif action == "reject":
                assert exc is not None
                await c.update(q, r, attributes=_error_attributes(job, exc),
                               visibility_timeout=None)
                try:
                    moved = await c.dead_letter(q, r, reason)
                except InvalidParameter as e:  # the queue has no dead_letter_queue
                    await c.delete(q, r)
                    _log_deleted_without_dlq(job, reason, exc, e)
                else:
                    _log_rejected(job, reason, moved)
                self.stats.rejected += 1
            else:
                assert exc is not None
                delay = self.settings.backoff_for(job).delay(job.receive_count)
                logger.warning("%s failed: %s: %s; retry in %.3gs", _describe(job),
                               type(exc).__name__, exc, delay, exc_info=exc)
                await c.update(q, r, attributes=_error_attributes(job, exc),
                               visibility_timeout=None)
                try:  # a planned retry (release=True): not counted as a lease expiry
                    await c.change_visibility(q, r, delay, release=True)
                except LeaseLimitExceeded:  # past max_lease: no backoff, still retried
                    logger.warning("backoff of %.3gs for message %s passes max_lease;"
                                   " retrying it at once", delay, job.id)
                    await c.change_visibility(q, r, 0, release=True)
                self.stats.retried += 1
        except (StaleReceipt, MessageNotFound) as e:
            self.stats.lost += 1
            logger.warning("%s: lease lost before it was settled (%s)", _describe(job), e)
        except Exception:
            logger.exception("could not settle %s", _describe(job))

    async def _drain(self) -> None:
        tasks = list(self._running)
        if tasks:
            logger.info("waiting up to %.3gs for %d running job(s)",
                        self.settings.grace_period, len(tasks))
            _, pending = await asyncio.wait(tasks, timeout=self.settings.grace_period)
            for t in pending:  # asyncio can cancel: the job releases its message (SHUTDOWN)
                t.cancel()
            if pending:
                await asyncio.wait(pending)

