"""The process pool of both workers (``Worker(..., pool="processes")``, ``AsyncWorker(...,
pool="processes")``, ``queue-pg worker --pool processes``): each handler (a thread of
:class:`queue_pg.Worker`, a task of :class:`queue_pg.AsyncWorker`) runs its jobs in a child
process of its own, so a job past its hard time limit, or one revoked while it runs, is stopped
for real (SIGKILL) and its child replaced.

The parent keeps everything that touches the database: the receive, the lease (its heartbeat
beats while a child runs), the settle. A slot's round trip with its child
(:meth:`ProcessSlot.run`) blocks: the threaded worker runs it in the handler's thread, the
asyncio worker in a thread of its own per slot. A child only imports the task modules and runs
one task at a time, told what by its parent through a pipe:

- the **soft limit** (the task's ``timeout``): SIGALRM raises :class:`TaskTimeout` inside the
  task, even while it sleeps in a C call; the attempt has failed, whatever the task does next;
- the **hard limit** (the task's ``time_limit``, else ``timeout`` + :data:`HARD_GRACE`): the
  parent kills the child with SIGKILL, fails the attempt (:class:`TaskTimeout`) and starts a
  new child;
- a child that dies by itself (``os._exit``, a segfault, SIGKILL from outside, the OOM killer)
  fails the attempt with :class:`ChildDied`, and is replaced;
- a job whose lease is lost (revoked with ``terminate``, or taken by another worker) or cannot
  be kept (past ``max_lease``; its type's hung-work limit; a stop past its grace period) has its
  child killed: it must not go on running while its message runs again elsewhere.

Each failure is retried by the task's policy and dead-lettered at its end, like any other.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Callable, Generator, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from time import monotonic
from types import FrameType
from typing import TYPE_CHECKING, Any

from queue_pg.jobs.job import (
    HUNG,
    LOST,
    MAX_LEASE,
    SHUTDOWN,
    BaseJob,
    Job,
    LeaseLost,
    TaskTimeout,
)
from queue_pg.types import JSON, Message

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from queue_pg.jobs.tasks import Task

__all__ = [
    "HARD_GRACE", "KILL_REASONS", "POOLS", "ChildDied", "ChildJob", "ProcessSlot",
    "RemoteTraceback", "check_pool", "hard_limit",
]

logger = logging.getLogger("queue_pg.worker")

#: The pools a Worker offers: handler threads, or a child process per handler thread.
POOLS = ("threads", "processes")
#: Seconds after a task's ``timeout`` (its soft limit) that its child is killed, when the task
#: names no ``time_limit`` of its own.
HARD_GRACE = 2.0
#: How often a slot thread waiting for its child looks at its job (a lost lease, a stop).
LOOK = 0.05
#: Longest a new child may take to import the task modules.
START_TIMEOUT = 60.0
#: Why a job's child is killed while it runs: its message is not (or no longer) this run's.
KILL_REASONS = (LOST, SHUTDOWN, MAX_LEASE, HUNG)


def check_pool(pool: str, handler: object) -> None:
    """ValueError for a pool that is not offered; TypeError for a process pool without a
    registry (a child runs tasks it imports, not a handler object)."""
    from queue_pg.jobs.tasks import Registry

    if pool not in POOLS:
        raise ValueError(f"pool = {pool!r}: choose {' or '.join(map(repr, POOLS))}")
    if pool == "processes" and not isinstance(handler, Registry):
        raise TypeError("pool='processes' runs the tasks of a registry, not a handler")


class ChildDied(Exception):
    """The child process running a job died (``os._exit``, a signal from outside, a crash):
    the attempt failed, and the child is replaced."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a child, as its cause (shown after it)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


def hard_limit(task: Task) -> float | None:
    """Seconds after which a run of ``task`` is killed: its ``time_limit``, else its
    ``timeout`` + :data:`HARD_GRACE`; None: never."""
    if task.time_limit is not None:
        return task.time_limit
    return None if task.timeout is None else task.timeout + HARD_GRACE


class ProcessSlot:
    """One child process, for one handler thread: runs that thread's jobs one at a time."""

    def __init__(self, modules: Sequence[str], index: int) -> None:
        self.modules = tuple(modules)
        self.index = index
        self.context = multiprocessing.get_context("spawn")
        self.proc: BaseProcess | None = None
        self.conn: Connection | None = None
        self.started = 0  # children started, the first included

    # --- the child's life -------------------------------------------------------------------------

    def ensure(self) -> None:
        """A live child, ready to run (started now if there is none)."""
        if self.proc is not None and self.proc.is_alive():
            return
        self._reap()
        ours, theirs = self.context.Pipe()
        proc = self.context.Process(target=_child_main, args=(theirs, self.modules),
                                    name=f"queue_pg-child-{self.index}", daemon=True)
        proc.start()
        theirs.close()
        self.proc, self.conn = proc, ours
        self.started += 1
        ready = wait([ours, proc.sentinel], START_TIMEOUT)
        if ours not in ready:
            self.kill()
            raise ChildDied(f"a new child process did not start within {START_TIMEOUT:g}s"
                            f" (exit code {proc.exitcode})")
        hello = ours.recv()
        if hello[0] != "ready":
            self.kill()
            raise ChildDied(f"a new child process could not import the task modules: {hello[1]}")

    def renew(self) -> None:
        """A new child when the last one was killed or died (or none started yet), before the
        slot takes a job; a child that cannot start is logged (the next run tries again)."""
        if self.proc is not None:
            return
        try:
            self.ensure()
        except Exception as exc:
            logger.error("child process %d did not start: %s", self.index, exc)

    def failed(self, job: BaseJob, exc: BaseException) -> None:
        """After a run that raised ``exc``: say so when it cost the child."""
        if isinstance(exc, (TaskTimeout, ChildDied)) and self.proc is None:
            logger.warning("%s: %s; a new process replaces it", job.describe(), exc)

    def kill(self) -> None:
        """SIGKILL the child (if any) and forget it."""
        if self.proc is not None and self.proc.is_alive():
            assert self.proc.pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.join(5)
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn = None, None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    # --- one job ----------------------------------------------------------------------------------

    def run(self, job: BaseJob, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any],
            save: Callable[[JSON], object] | None = None) -> Any:
        """Run the task in the child; its return value, or its exception raised here.
        TaskTimeout at the soft limit (whatever the task did after) and at the hard one (the
        child killed); ChildDied when the child died by itself; LeaseLost when the job is
        cancelled for one of :data:`KILL_REASONS` (the child killed). ``save(state)`` saves a
        checkpoint of the child's on the job's lease, from this thread (default: the threaded
        worker's ``job.checkpoint``)."""
        if save is None:
            assert isinstance(job, Job)
            save = job.checkpoint
        self.ensure()
        assert self.conn is not None and self.proc is not None
        conn, proc = self.conn, self.proc
        hard = hard_limit(task)
        started = monotonic()
        conn.send(("run", task.name, task.func.__module__, task.func.__qualname__, task.bind,
                   list(args), dict(kwargs), task.timeout, job.message))
        while True:
            now = monotonic()
            if hard is not None and now - started >= hard:
                self.kill()
                raise TaskTimeout(f"{task.name} passed its hard time limit of {hard:g}s; its"
                                  " process was killed")
            if job.cancel_reason in KILL_REASONS:
                self.kill()
                raise LeaseLost(f"message {job.id} of queue {job.queue!r}: {job.cancel_reason};"
                                " its process was killed")
            ready = wait([conn, proc.sentinel], LOOK if hard is None
                         else min(LOOK, max(0.0, started + hard - now)))
            if conn in ready:
                try:
                    answer = conn.recv()
                except (EOFError, OSError):
                    answer = None
                if answer is None:
                    code = self._died()
                    raise ChildDied(f"{task.name}: its process died while it ran ({code})")
                kind = answer[0]
                if kind == "checkpoint":
                    conn.send(_checkpoint(save, answer[1]))
                    continue
                late = task.timeout is not None and monotonic() - started >= task.timeout
                if kind == "ok" and not late:
                    return answer[1]
                exc = _exception(answer[1], answer[2]) if kind == "err" else None
                if late and not isinstance(exc, TaskTimeout):
                    raise TaskTimeout(f"{task.name} ran past its timeout of {task.timeout:g}s"
                                      ) from exc
                assert exc is not None
                raise exc
            if proc.sentinel in ready:
                code = self._died()
                raise ChildDied(f"{task.name}: its process died while it ran ({code})")

    def _died(self) -> str:
        proc = self.proc
        self._reap()
        if proc is None or proc.exitcode is None:
            return "exit code unknown"
        if proc.exitcode < 0:
            return f"killed by {signal.Signals(-proc.exitcode).name}"
        return f"exit code {proc.exitcode}"


def _checkpoint(save: Callable[[JSON], object], state: JSON) -> tuple[str, str | None]:
    """A child's checkpoint, saved by the parent on the job's lease."""
    try:
        save(state)
    except LeaseLost as exc:
        return ("lost", str(exc))
    except Exception as exc:
        return ("error", f"{type(exc).__name__}: {exc}")
    return ("ok", None)


def _exception(data: bytes | None, tb: str) -> BaseException:
    """The child's exception (pickled), its traceback as its cause; one that does not unpickle
    becomes a ChildError naming its type."""
    exc: BaseException
    try:
        exc = pickle.loads(data) if data is not None else RuntimeError(tb.splitlines()[-1])
    except Exception:
        last = tb.strip().splitlines()[-1] if tb.strip() else "an exception"
        exc = RuntimeError(f"raised in the child process (not unpicklable here): {last}")
    exc.__cause__ = RemoteTraceback(tb)
    return exc


# --- in the child ---------------------------------------------------------------------------------


class ChildJob(BaseJob):
    """The job as a task in a child process sees it: its message, and a checkpoint saved by the
    parent (on its lease)."""

    def __init__(self, conn: Connection, message: Message, task: Task) -> None:
        super().__init__(message, 0.0, task)
        self._conn = conn

    def checkpoint(self, state: JSON) -> Saved:
        """Save ``state`` now (the parent saves it on the job's lease). An ``async def`` task
        written for the asyncio worker may ``await`` it: the answer is already there."""
        body = self._checkpoint_body(state)
        self._conn.send(("checkpoint", state))
        kind, why = self._conn.recv()
        if kind == "error":
            raise RuntimeError(f"checkpoint failed: {why}")
        self._checkpointed(body, LeaseLost(why) if kind == "lost" else None)
        return Saved()


class Saved:
    """A checkpoint done: awaiting it returns at once (see :meth:`ChildJob.checkpoint`)."""

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


_armed = False


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    if _armed:
        raise TaskTimeout("the task ran past its timeout (soft limit)")


def _find(name: str, module: str, qualname: str, bind: bool) -> Task:
    from queue_pg.jobs.tasks import Registry, Task, registry

    obj: Any = importlib.import_module(module)
    found = registry.tasks.get(name)
    if found is not None:
        return found
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if isinstance(obj, Task):
        return obj
    if callable(obj):  # a function registered under another name: run it as it is
        return Task(obj, queue="-", name=name, bind=bind, registry=Registry(), retries=None)
    raise LookupError(f"task {name}: {module}.{qualname} not found in the child process")


def _child_main(conn: Connection, modules: Sequence[str]) -> None:
    """A child: import the modules, then run what the parent sends until the pipe closes. It
    exits with its parent (a watcher thread), and ignores SIGINT (the parent stops it)."""
    global _armed
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _on_alarm)
    parent = multiprocessing.parent_process()
    if parent is not None:
        def watch() -> None:
            parent.join()
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    try:
        from queue_pg.jobs.tasks import import_tasks

        import_tasks(tuple(modules))
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        _, name, module, qualname, bind, args, kwargs, soft, message = request
        answer: tuple[Any, ...]
        try:
            try:
                task = _find(name, module, qualname, bind)
                job = ChildJob(conn, message, task)
                if soft is not None:
                    _armed = True
                    signal.setitimer(signal.ITIMER_REAL, soft)
                value = task.run_sync(job, args, kwargs)
                _armed = False
                answer = ("ok", value)
            finally:
                _armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as exc:
            answer = ("err", _pickled(exc),
                      "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        try:
            conn.send(answer)
        except Exception as exc:  # a return value that does not pickle
            conn.send(("err", _pickled(TypeError(f"task {name}: its return value cannot be"
                                                 f" sent to the worker: {exc}")), ""))


def _pickled(exc: BaseException) -> bytes | None:
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
    except Exception:
        return None
    return data

