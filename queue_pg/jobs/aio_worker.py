"""The asyncio worker: ``concurrency`` handler tasks on an :class:`queue_pg.AsyncClient`.

Everything but the tasks (what to receive, how to settle, how a heartbeat ends) is shared with
the threaded :class:`queue_pg.Worker`: see :mod:`queue_pg.jobs.settle` and
:mod:`queue_pg.jobs.worker_loop`; so is the process pool (:mod:`queue_pg.jobs.pool`), whose
blocking round trip with a child runs in a thread per slot while the loop beats and settles.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

from queue_pg import _ops
from queue_pg.jobs import joblog
from queue_pg.jobs.declare import ensure_queues
from queue_pg.jobs.job import HUNG, SHUTDOWN, TIMEOUT, AsyncJob, LeaseLost, TaskTimeout, job_var
from queue_pg.jobs.periodic import Scheduler
from queue_pg.jobs.plans import Outcome, Plan
from queue_pg.jobs.pool import ProcessSlot
from queue_pg.jobs.pulse import REAP_INTERVAL
from queue_pg.jobs.settle import Beat, StuckWatch, beat, settle
from queue_pg.jobs.worker_loop import (
    GATHER,
    STOP_SIGNALS,
    WorkerBase,
    gathered,
    per_queue,
    resolve_task,
)
from queue_pg.types import Message

if TYPE_CHECKING:
    from queue_pg.aio import AsyncClient
    from queue_pg.jobs.tasks import Task
    from queue_pg.types import JSON

__all__ = ["AsyncHandler", "AsyncWorker", "run_plan"]

logger = logging.getLogger("queue_pg.worker")

R = TypeVar("R")
AsyncHandler = Callable[[AsyncJob], Awaitable[object]]


async def _stopped(stop: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``stop``; whether it is set."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout)
    return stop.is_set()


async def run_plan(client: AsyncClient, plan: Plan[R]) -> R:
    """Await a plan's client calls in turn; its result."""
    outcome: Outcome[R] = Outcome()
    while (call := outcome.next(plan)) is not None:
        outcome = await Outcome.of_async(partial(call, client))
    return outcome.value


class AsyncWorker(WorkerBase["AsyncClient", AsyncHandler]):
    """The asyncio twin of :class:`queue_pg.Worker`: ``concurrency`` handler tasks.

    Handlers are ``async def handler(job)``; a registry's async tasks are awaited and its plain
    functions run in a thread. A task's ``timeout`` cancels it for real here. Same options as
    :class:`queue_pg.Worker` (``concurrency`` None: 10 tasks); ``await worker.run()``.

    ``pool="processes"`` (and ``modules``): as :class:`queue_pg.Worker`'s, each handler task runs
    its jobs in a child process of its own, killed at the task's hard limit or on a revoke with
    ``terminate`` and replaced; the round trip with the child waits in a thread per handler.
    """

    default_concurrency = 10

    def _setup(self) -> None:
        self._running: dict[asyncio.Task[None], AsyncJob] = {}
        self._stuck = StuckWatch()  # logs each job once when it is stuck
        self._wake: asyncio.Event | None = None
        self._scheduler = Scheduler(self._registry, self.settings.queues)
        self._flush_wake: asyncio.Event | None = None
        self._pulse_stop = asyncio.Event()
        #: pool="processes": the slots free to take a job (made in run), and the threads that
        #: wait on their children
        self._free: asyncio.Queue[ProcessSlot] | None = None
        self._executor: ThreadPoolExecutor | None = None

    def _acks_wake(self) -> None:
        if self._flush_wake is not None:
            self._flush_wake.set()

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
        await run_plan(self.client, ensure_queues(self._registry, self.queues))
        await run_plan(self.client, self._rounds.leases())
        starting = self._start_children()
        self._wake = asyncio.Event()
        self._flush_wake = asyncio.Event()
        self._flushing = True
        flusher = asyncio.create_task(self._flush_loop(), name="queue_pg-settle")
        self._pulse_stop = asyncio.Event()
        tried = asyncio.Event()
        pulsing = (asyncio.create_task(self._pulse_loop(tried), name="queue_pg-pulse")
                   if self._pulse.enabled else None)
        if pulsing is not None:  # the first receives name the consumer
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(tried.wait(), 10)
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for sig in signals:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
        logger.info("ready: %s; %d task(s), lease %s", ", ".join(self.settings.queues),
                    self.settings.concurrency, per_queue(self.settings.leases))
        scheduling = asyncio.create_task(self._schedule()) if self._scheduler else None
        try:
            try:
                await self._loop()
            finally:
                if scheduling is not None:
                    scheduling.cancel()
                await self._drain()
        finally:
            self._flushing = False
            self._flush_wake.set()
            await flusher
            self._pulse_stop.set()
            if pulsing is not None:
                await pulsing
            await self._settle_left()
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self._stop_children(starting)
        logger.info("stopped: %s", self.stats.line())

    # --- the process pool ---------------------------------------------------------------------

    def _start_children(self) -> list[asyncio.Task[None]]:
        """pool="processes": a thread per slot, and each slot's child started (in it) with the
        worker, not at the first job; a slot is free once its child is up."""
        if not self._slots:
            return []
        self._free = asyncio.Queue()
        self._executor = ThreadPoolExecutor(len(self._slots), thread_name_prefix="queue_pg-slot")
        return [asyncio.create_task(self._give_back(s)) for s in self._slots]

    async def _in_thread(self, func: Callable[[], R]) -> R:
        """``func()`` in the slots' threads (one each: a slot waits on its child there)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, func)

    async def _give_back(self, slot: ProcessSlot) -> None:
        """The slot free again, with a live child (a killed or dead one replaced first)."""
        assert self._free is not None
        if not self._stop_requested:
            await self._in_thread(slot.renew)
        self._free.put_nowait(slot)

    async def _stop_children(self, starting: list[asyncio.Task[None]]) -> None:
        """Kill every child once no slot thread touches it (a start still under way ends
        first: it is bounded by START_TIMEOUT)."""
        await asyncio.gather(*starting, return_exceptions=True)
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown, True)
        await asyncio.gather(*(asyncio.to_thread(s.kill) for s in self._slots))

    async def _in_child(self, slot: ProcessSlot, job: AsyncJob, task: Task,
                        args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Run the job in the slot's child (:meth:`ProcessSlot.run`, in the slot's thread). A
        cancelled handler (the grace period's end, the hung-work limit) cancels the job: the
        thread kills the child, and the handler ends only once it is gone."""
        loop = asyncio.get_running_loop()

        def save(state: JSON) -> None:  # a checkpoint of the child's, on the job's lease
            asyncio.run_coroutine_threadsafe(job.checkpoint(state), loop).result()

        running = loop.run_in_executor(self._executor, partial(
            slot.run, job, task, args, kwargs, save))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            if job.cancel_reason is None:
                job.cancel(SHUTDOWN)
            with contextlib.suppress(BaseException):
                await running
            raise

    async def _loop(self) -> None:
        assert self._wake is not None
        since = monotonic()
        while not self._stop_requested:
            free = self.settings.concurrency - len(self._running)
            if free <= 0 or not gathered(free, self.settings.concurrency, since):
                if free <= 0:
                    since = monotonic()
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), None if free <= 0
                                           else max(0.0, since + GATHER - monotonic()))
                continue
            pause = await run_plan(self.client, self._rounds.round(
                free, lambda: self._stop_requested, self._start))
            since = monotonic()
            if pause:
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)

    async def _pulse_loop(self, tried: asyncio.Event) -> None:
        """Register on a connection of this worker's own, then beat and reap every
        REAP_INTERVAL on it until the stop; a lost connection is made again (see
        queue_pg.jobs.pulse)."""
        pulse = self._pulse
        while not self._pulse_stop.is_set():
            try:
                async with self.client._dedicated() as conn:
                    pulse.registered(await self.client.register_consumer(
                        conn, name=pulse.name, adopt=pulse.adopt()))
                    tried.set()
                    while not await _stopped(self._pulse_stop, REAP_INTERVAL):
                        if pulse.consumer is None:  # reaped, or no id: register again
                            pulse.registered(await self.client.register_consumer(
                                conn, name=pulse.name, adopt=pulse.adopt()))
                            continue
                        pulse.beat(*await self.client._run(_ops.pulse(pulse.consumer), conn))
                return  # the session ends with the connection: a reap elsewhere forgets it
            except Exception as exc:
                tried.set()
                if await _stopped(self._pulse_stop, pulse.lost(exc)):
                    return

    async def _schedule(self) -> None:
        """Fire the due ticks of the schedules of this worker's queues (queue_pg.jobs.periodic)."""
        assert self._wake is not None
        while not self._stop_requested:
            pause = await run_plan(self.client, self._scheduler.round())
            await asyncio.sleep(pause)

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
        job_var.set(job)  # this task's own context
        ended = asyncio.Event()
        me = asyncio.current_task()
        assert me is not None
        beating = asyncio.create_task(self._heartbeat(job, ended, me))
        exc: BaseException | None = None
        value: Any = None
        slot: ProcessSlot | None = None
        at = joblog.started(job, self.job_log_level)
        try:
            task, args, kwargs = resolve_task(self._registry, job)
            if task is not None and self._free is not None:
                slot = await self._free.get()
                value = await self._in_child(slot, job, task, args, kwargs)
            elif task is not None:
                started = monotonic()
                cause: Exception | None = None
                try:
                    value = await asyncio.wait_for(task.run_async(job, args, kwargs),
                                                   task.timeout)
                except Exception as e:
                    cause = e
                # past its timeout, whatever it raised or returned: the attempt failed
                if task.timeout is not None and monotonic() - started >= task.timeout:
                    job.cancel(TIMEOUT)
                    raise TaskTimeout(f"{task.name} ran past its timeout of"
                                      f" {task.timeout:g}s") from cause
                if cause is not None:
                    raise cause
            else:
                assert self._handler is not None
                await self._handler(job)
        except asyncio.CancelledError as e:  # the grace period's end, or the lease's hard limit
            if job.cancel_reason != HUNG:
                job.cancel(SHUTDOWN)  # (else: failed, as the task's retries say)
            exc = LeaseLost(f"message {job.id}: {job.cancel_reason}")
            exc.__cause__ = e
        except Exception as e:
            exc = e
            if slot is not None:
                slot.failed(job, e)
        joblog.finished(job, exc, at, self.job_log_level)
        ended.set()  # a beat in progress completes first: the settle below has the last word
        await beating
        plan = settle(job, exc, self.settings.backoff_for(job), self._acks, value)
        try:
            self.stats.add(await run_plan(self.client, plan))
        finally:
            if slot is not None:  # after the settle, as the threaded worker's slots
                await self._give_back(slot)

    async def _flush_loop(self) -> None:
        """Delete finished jobs in batches, once due (see :mod:`queue_pg.jobs.acks`)."""
        assert self._flush_wake is not None
        while self._flushing:
            due = self._acks.due()
            self._flush_wake.clear()
            if due is None or due > monotonic():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._flush_wake.wait(),
                                           None if due is None else due - monotonic())
                continue
            await run_plan(self.client, self._acks.flush())

    async def _settle_left(self) -> None:
        """The stop's last flush, tried again for up to the grace period."""
        deadline = monotonic() + self.settings.grace_period
        done = await run_plan(self.client, self._acks.flush(everything=True))
        while not done and monotonic() < deadline:
            await asyncio.sleep(0.2)
            done = await run_plan(self.client, self._acks.flush(everything=True))
        self._settled_at_stop(done)

    async def _heartbeat(self, job: AsyncJob, ended: asyncio.Event,
                         handling: asyncio.Task[Any]) -> None:
        """Renew the job's lease every interval, and report it once when it is stuck (see
        :class:`queue_pg.settle.StuckWatch`). A heartbeat refused at the lease's hard limit
        at its type's hung-work limit cancels the handling: the attempt fails as the task's
        retries say."""
        interval = self.settings.interval(job.queue)
        next_beat = monotonic() + interval
        while True:
            stuck_at = await run_plan(self.client, self._stuck.check([job]))
            wake = min(next_beat, stuck_at) if stuck_at is not None else next_beat
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ended.wait(), max(0.0, wake - monotonic()))
            if ended.is_set():
                return
            if monotonic() < next_beat:
                continue
            next_beat = monotonic() + interval
            if await run_plan(self.client, beat(job)) is Beat.ENDED:
                if job.cancel_reason == HUNG and not ended.is_set():
                    handling.cancel()
                return

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
