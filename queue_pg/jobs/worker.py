"""The threaded worker: receive messages, run a handler on each in a thread, settle it.

The queue rules stay in SQL: a worker only calls Client methods. Around the handler it adds what
a consumer has to do by itself with leases:

- a heartbeat extends the lease while the handler runs (``change_visibility``), and tells the
  handler (``job.cancelled`` / ``job.raise_if_cancelled()``) when it cannot, so the handler stops
  before the lease lapses and another worker starts the same message;
- a failed message gets its error in its attributes (``update``) and is made visible again after
  an exponential backoff with jitter (``change_visibility(release=True)``: a planned retry, not a
  lease expiry); the engine dead-letters it after the queue's ``max_receive_count``;
- a message that can never succeed (:class:`Reject`: an unknown task, arguments that do not fit,
  a body the client could not decode, a task's retries used up) is dead-lettered at once with
  the reason (``dead_letter``);
- a job that succeeded is deleted in a batch: a ``delete_batch`` 20 ms after the first of the
  batch finished, on the heartbeat thread, beside the receives (:mod:`queue_pg.jobs.acks`); a stale
  receipt is reported per job;
- SIGTERM / SIGINT stop receiving, let running handlers finish within a grace period, and release
  what was received but not started; a second signal exits at once and leases bring the rest back.

What to do and when is shared with :class:`queue_pg.AsyncWorker` (:mod:`queue_pg.jobs.settle`,
:mod:`queue_pg.jobs.worker_loop`); this module holds only the threads.
"""

from __future__ import annotations

import ctypes
import inspect
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from functools import partial
from queue import SimpleQueue
from time import monotonic
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from queue_pg import _ops
from queue_pg.jobs import joblog
from queue_pg.jobs.acks import FLUSH_DELAY
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.declare import ensure_queues
from queue_pg.jobs.job import (
    HUNG,
    SHUTDOWN,
    TIMEOUT,
    Job,
    LeaseLost,
    Reject,
    TaskTimeout,
    current_job,
    job_var,
)
from queue_pg.jobs.periodic import Scheduler
from queue_pg.jobs.plans import Outcome, Plan
from queue_pg.jobs.pool import ProcessSlot
from queue_pg.jobs.pulse import REAP_INTERVAL
from queue_pg.jobs.settle import Beat, StuckWatch, beat, settle
from queue_pg.jobs.worker_loop import (
    GATHER,
    STATUS_INTERVAL,
    STOP_SIGNALS,
    WorkerBase,
    gathered,
    per_queue,
    resolve_task,
)
from queue_pg.plain import plain
from queue_pg.types import Message

if TYPE_CHECKING:
    from queue_pg.client import Client

__all__ = [
    "Backoff", "Job", "LeaseLost", "Reject", "SyncHandler", "Worker", "current_job", "run_plan",
]

logger = logging.getLogger("queue_pg.worker")

R = TypeVar("R")
#: Longest the heartbeat thread sleeps: a job whose first beat is further away than this does
#: not need to wake it.
BEAT_POLL = 0.5
SyncHandler = Callable[[Job], object]


def run_plan(client: Client, plan: Plan[R]) -> R:
    """Make a plan's client calls in turn; its result."""
    outcome: Outcome[R] = Outcome()
    while (call := outcome.next(plan)) is not None:
        outcome = Outcome.of(partial(call, client))
    return outcome.value


class Worker(WorkerBase["Client", SyncHandler]):
    """Runs ``handler(job)`` (or the registry's tasks) on the messages of ``queues``.

    ``concurrency`` (None: 4) threads run handlers; a receive asks for at most as many messages
    as there are free threads (and ``batch_size``), so nothing waits in a local buffer while its
    lease runs. ``visibility_timeout`` (None: each queue's own, read again every few seconds) is
    the lease a receive takes and each heartbeat renews, every ``heartbeat_interval`` (None: a
    third of the lease). ``backoff``: a :class:`Backoff`, or one per queue name; a task's own
    backoff wins. ``wait``: longest a receive long-polls (in slices of
    :data:`queue_pg.jobs.worker_loop.POLL_SLICE`; SQL checks the value). ``grace_period``: how
    long a stop waits for running handlers. ``detect_crashes`` (default on): the worker registers
    as a consumer on a connection of its own, outside the pool (:mod:`queue_pg.jobs.pulse`), so
    that when its process dies its leases end within seconds instead of lapsing (behind a
    transaction pooler by its heartbeat alone); :attr:`crash_detection` says whether it is on now.

    ``pool="processes"``: each handler thread runs its tasks in a child process of its own
    (:mod:`queue_pg.jobs.pool`), which imports ``modules`` (and each task's own module): a run past
    its task's hard limit (``time_limit``, else ``timeout`` + 2 s) or whose lease is lost (a
    revoke with ``terminate``) is killed with SIGKILL and its child replaced; the attempt has
    failed, as when a child dies by itself. It needs a registry of tasks, not a handler.

    The client's pool should have ``concurrency + 2`` connections (receive, heartbeat, one per
    handler thread), one more with periodic tasks (the scheduler). Expired messages are swept
    by the client's own ``sweep_interval``.
    """

    default_concurrency = 4

    def _setup(self) -> None:
        if inspect.iscoroutinefunction(self._handler):
            raise TypeError("an async handler needs AsyncWorker (Worker runs plain functions)")
        self._cond = threading.Condition()
        self._running: set[Job] = set()
        self._inbox: SimpleQueue[Job | None] = SimpleQueue()
        self._stop_signal: int | None = None
        self._want_first = False  # the receive loop waits for the first slot to free
        self._beat_wake = threading.Event()
        #: When (time.monotonic) the heartbeat thread wakes by itself; 0.0 while it is awake.
        self._beat_until = 0.0
        self._stuck = StuckWatch()  # the heartbeat thread's: logs each job once when stuck
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._scheduler = Scheduler(self._registry, self.settings.queues)
        self._pulse_stop = threading.Event()
        self._pulse_tried = threading.Event()  # the first registration was tried

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
        run_plan(self.client, ensure_queues(self._registry, self.queues))
        run_plan(self.client, self._rounds.leases())
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            if self._pulse.enabled:
                threading.Thread(target=self._pulse_loop, name="queue_pg-pulse",
                                 daemon=True).start()
                self._pulse_tried.wait(10)  # the first receives name the consumer
            self._start_threads()
            if self._scheduler:
                threading.Thread(target=self._schedule, name="queue_pg-scheduler",
                                 daemon=True).start()
            logger.info("ready: %s; %d thread(s), lease %s, heartbeat every %s",
                        ", ".join(self.queues), self.settings.concurrency,
                        per_queue(self.settings.leases),
                        per_queue({q: self.settings.interval(q) for q in self.queues}))
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
        """Wait until a thread is free (or a stop), and a moment for more (see
        :func:`gathered`); how many are."""
        since = monotonic()
        with self._cond:
            try:
                while not self._stop_requested:
                    free = self.settings.concurrency - len(self._running)
                    if free > 0 and gathered(free, self.settings.concurrency, since):
                        return free
                    if free > 0 or monotonic() < since + GATHER:
                        # just started them all: short jobs free every slot within GATHER,
                        # and only the last one wakes us (one thread switch a round, not two)
                        self._cond.wait(max(0.0, since + GATHER - monotonic()))
                    else:  # long jobs: wake at the first free slot
                        self._want_first = True
                        since = monotonic()
                        self._cond.wait(0.1)
            finally:
                self._want_first = False
        return 0

    def _loop(self) -> None:
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
            pause = run_plan(self.client, self._rounds.round(
                free, lambda: self._stop_requested, self._start))
            if pause:
                with self._cond:
                    self._cond.wait_for(lambda: self._stop_requested, pause)

    def _start(self, message: Message) -> None:
        job = Job(self.client, message, self.settings.leases[message.queue])
        job.next_beat = job.started + self.settings.interval(message.queue)
        with self._cond:
            self._running.add(job)
        if job.next_beat < monotonic() + BEAT_POLL:  # else the heartbeat thread is up in time
            self._beat_wake.set()
        self._inbox.put(job)

    def _schedule(self) -> None:
        """Fire the due ticks of the schedules of this worker's queues (queue_pg.jobs.periodic)."""
        while not self._stop_requested:
            pause = run_plan(self.client, self._scheduler.round())
            with self._cond:
                self._cond.wait_for(lambda: self._stop_requested, pause)

    # --- threads ----------------------------------------------------------------------------------

    def _start_threads(self) -> None:
        # Daemon threads: a handler still running after the grace period must not keep the
        # process alive; its lease brings the message back.
        for i in range(self.settings.concurrency):
            slot = self._slots[i] if self._slots else None
            t = threading.Thread(target=self._serve, args=(slot,), name=f"queue_pg-worker-{i}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        threading.Thread(target=self._heartbeat, name="queue_pg-heartbeat", daemon=True).start()

    def _pulse_loop(self) -> None:
        """Register on a connection of this worker's own, then beat and reap every
        REAP_INTERVAL on it until the stop; a lost connection is made again (see
        queue_pg.jobs.pulse)."""
        pulse = self._pulse
        while not self._pulse_stop.is_set():
            try:
                with self.client._dedicated() as conn:
                    pulse.registered(self.client.register_consumer(
                        conn, name=pulse.name, adopt=pulse.adopt()))
                    self._pulse_tried.set()
                    while not self._pulse_stop.wait(REAP_INTERVAL):
                        if pulse.consumer is None:  # reaped, or no id: register again
                            pulse.registered(self.client.register_consumer(
                                conn, name=pulse.name, adopt=pulse.adopt()))
                            continue
                        pulse.beat(*self.client._run(_ops.pulse(pulse.consumer), conn))
                return  # the session ends with the connection: a reap elsewhere forgets it
            except Exception as exc:
                self._pulse_tried.set()
                if self._pulse_stop.wait(pulse.lost(exc)):
                    return

    def _stop_threads(self) -> None:
        self._closed = True
        self._pulse_stop.set()
        for _ in self._threads:
            self._inbox.put(None)
        self._beat_wake.set()
        for t in self._threads:
            t.join(0.05)

    def _serve(self, slot: ProcessSlot | None) -> None:
        if slot is not None:
            slot.renew()  # the children start with the worker, not at the first job
        try:
            self._serve_jobs(slot)
        finally:
            if slot is not None:
                slot.kill()

    def _serve_jobs(self, slot: ProcessSlot | None) -> None:
        while True:
            job = self._inbox.get()
            if job is None:
                return
            token = job_var.set(job)
            try:
                self._handle(job, slot)
            except BaseException:  # never lose the slot, whatever a handler did
                logger.exception("internal error handling message %s", job.id)
            finally:
                job_var.reset(token)
                with job.lock:
                    job.beating = False
                with self._cond:
                    self._running.discard(job)
                    # the receive loop waits (timed) for the rest once a slot is free: wake
                    # it for the last, and for the first when it asked (see _free_slots)
                    free = self.settings.concurrency - len(self._running)
                    if free == self.settings.concurrency or (free == 1 and self._want_first):
                        self._cond.notify_all()

    def _handle(self, job: Job, slot: ProcessSlot | None = None) -> None:
        exc: BaseException | None = None
        value: Any = None
        at = joblog.started(job, self.job_log_level)
        try:
            task, args, kwargs = resolve_task(self._registry, job)
            if task is not None and slot is not None:
                value = slot.run(job, task, args, kwargs)
            elif task is not None:
                if task.timeout is None:
                    value = task.run_sync(job, args, kwargs)
                else:
                    job.deadline = job.started + task.timeout
                    job.thread = threading.get_ident()
                    self._beat_wake.set()
                    try:
                        value = task.run_sync(job, args, kwargs)
                    finally:  # a soft limit raised up to here lands in `except` below
                        _disarm(job)
            else:
                assert self._handler is not None
                self._handler(job)
        except Exception as e:
            exc = e
            if slot is not None:
                slot.failed(job, e)
        joblog.finished(job, exc, at, self.job_log_level)
        with job.lock:  # no heartbeat after this: the settle below sets the visibility
            job.beating = False
            late = job.timed_out
        if late:  # settled as failed at its deadline, or at the lease's hard limit, already
            logger.warning("%s ended %.3gs after it was failed (%s); its result is ignored",
                           plain(job.describe()), monotonic() - (job.deadline or job.started),
                           job.cancel_reason)
            return
        plan = settle(job, exc, self.settings.backoff_for(job), self._acks, value)
        self.stats.add(run_plan(self.client, plan))
        if slot is not None and not self._stop_requested:
            slot.renew()  # the killed (or dead) child's replacement, before the slot takes a job

    def _time_out(self, job: Job) -> None:
        """A job past its task's timeout: failed now (retried as the task says), whatever its
        thread does after; the thread cannot be stopped, only told (``job.cancelled``)."""
        with job.lock:
            if not job.beating:  # its handler ended (and settles) first
                return
            job.beating = False
            job.timed_out = True
        job.cancel(TIMEOUT)
        assert job.task is not None and job.task.timeout is not None
        exc = TaskTimeout(f"{job.task.name} ran past its timeout of {job.task.timeout:g}s")
        with job.soft_lock:  # the soft limit: TaskTimeout raised inside the task
            if job.thread is not None:
                _async_raise(job.thread, TaskTimeout)
        logger.warning("%s passed its timeout; failed, and TaskTimeout raised inside it (at"
                       " its next Python instruction)", job.describe())
        self.stats.add(run_plan(self.client, settle(job, exc, self.settings.backoff_for(job))))

    # --- heartbeat --------------------------------------------------------------------------------

    def _acks_wake(self) -> None:
        # Only when the heartbeat thread would sleep well past the flush: a busy worker sets a
        # new flush time each round, and waking a thread for it each time costs a context
        # switch per round (the thread wakes at the old time anyway and sleeps on to the new).
        due = self._acks.due()
        if due is None or due + FLUSH_DELAY < self._beat_until:
            self._beat_wake.set()

    def _heartbeat(self) -> None:
        """One thread renews every running job's lease when it is due, and deletes finished
        jobs no receive carried (see :mod:`queue_pg.jobs.acks`)."""
        while not self._closed:
            with self._cond:
                jobs = list(self._running)
            now = monotonic()
            due = now + BEAT_POLL
            flush_at = self._acks.due()
            if flush_at is not None and now >= flush_at:
                run_plan(self.client, self._acks.flush())
                flush_at = self._acks.due()
            if flush_at is not None:
                due = min(due, flush_at)
            stuck_at = run_plan(self.client, self._stuck.check([j for j in jobs if j.beating]))
            if stuck_at is not None:
                due = min(due, stuck_at)
            for job in jobs:
                if job.deadline is not None and now >= job.deadline and job.beating:
                    self._time_out(job)
                if not job.beating:
                    continue
                if now >= job.next_beat:
                    self._beat(job)
                due = min(due, job.next_beat)
                if job.deadline is not None:
                    due = min(due, job.deadline)
            self._beat_until = due
            flush_at = self._acks.due()  # one added before _beat_until was set did not wake us
            if flush_at is None or flush_at >= due:
                self._beat_wake.wait(max(0.0, due - monotonic()))
            self._beat_until = 0.0
            self._beat_wake.clear()

    def _beat(self, job: Job) -> None:
        interval = self.settings.interval(job.queue)
        with job.lock:
            if not job.beating:
                return
            outcome = run_plan(self.client, beat(job))
            failed = False
            if outcome is Beat.ENDED:
                job.beating = False
                # at the hard limit: settled here, not by the handler (which sees timed_out)
                failed = job.timed_out = job.cancel_reason == HUNG
            job.next_beat = monotonic() + (min(interval, 1.0) / 2 if outcome is Beat.FAILED
                                           else interval)
        if failed:
            self._fail_at_limit(job)

    def _fail_at_limit(self, job: Job) -> None:
        """A job whose heartbeat was refused at its type's hung-work limit: failed now, as the
        task's retries say, whatever its thread does after (a hung handler may never return);
        LeaseLost is raised inside a task that has a timeout."""
        exc = LeaseLost(f"message {job.id} of queue {job.queue!r}: {HUNG} (its heartbeat was"
                        " refused)")
        with job.soft_lock:
            if job.thread is not None:
                _async_raise(job.thread, LeaseLost)
        self.stats.add(run_plan(self.client, settle(job, exc, self.settings.backoff_for(job))))

    # --- stopping ---------------------------------------------------------------------------------

    def _drain(self) -> None:
        """After the stop: wait up to the grace period for running handlers."""
        stopped_at = monotonic()
        name = signal.Signals(self._stop_signal).name if self._stop_signal else "stop()"
        with self._cond:
            running = len(self._running)
        logger.info("%s: stopped receiving; waiting up to %.3gs for %d running job(s)",
                    name, self.settings.grace_period, running)
        deadline = stopped_at + self.settings.grace_period
        with self._cond:
            while self._running and monotonic() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - monotonic())))
            left = list(self._running)
        for job in left:
            job.cancel(SHUTDOWN)
            with job.lock:
                job.beating = False
        done = run_plan(self.client, self._acks.flush(everything=True))
        while not done and monotonic() < deadline:
            with self._cond:
                self._cond.wait(0.2)
            done = run_plan(self.client, self._acks.flush(everything=True))
        self._settled_at_stop(done)
        if left:
            logger.warning("%d job(s) still running after the grace period (%s);"
                           " their leases bring the messages back",
                           len(left), ", ".join(j.describe() for j in left))


def _async_raise(thread: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in ``thread`` at its next Python instruction (None: clear one pending)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread), ctypes.py_object(exc) if exc is not None else None)


def _disarm(job: Job) -> None:
    """In the handler's thread once the task returned or raised: no soft limit from now on, and
    one raised but not yet delivered is dropped (the attempt was failed all the same)."""
    with job.soft_lock:
        job.thread = None
        _async_raise(threading.get_ident(), None)
