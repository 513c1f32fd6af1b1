"""Tasks: functions run by a worker, enqueued as messages that name them.

``@queue_pg.task(queue="emails")`` turns a function into a :class:`Task`;
``send_welcome.enqueue(42, conn=conn)`` sends ``{"task": name, "args": [42], "kwargs": {}}``
with attribute ``type`` = name (so the history records it), inside the caller's transaction when
``conn`` is given. A worker given a :class:`Registry` dispatches each message to its task; a
message naming no known task, or arguments that do not fit, is rejected: not retried but
dead-lettered at once, the reason in its ``dead_letter_reason`` attribute.

The envelope's ``state`` key belongs to the worker: the last checkpoint. The last failure (type,
message, traceback, attempt, at, worker) goes to the message's attributes under ``error``, not
into the envelope, so a dead-lettered message shows why it failed.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    AsyncExitStack,
    ExitStack,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, overload

from queue_pg._sqla import join
from queue_pg.errors import QueueNotFound
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.job import ERROR_KEY, STATE_KEY, BaseJob, Reject
from queue_pg.jobs.plans import ClientCall
from queue_pg.types import Seconds, seconds

if TYPE_CHECKING:
    import psycopg

    from queue_pg._sqla import SessionLike
    from queue_pg.aio import AsyncClient
    from queue_pg.client import Client
    from queue_pg.types import StoredResult

__all__ = [
    "ERROR_KEY",
    "STATE_KEY",
    "Periodic",
    "Registry",
    "Signature",
    "Task",
    "TaskFailed",
    "TaskResult",
    "periodic",
    "registry",
    "set_client",
    "task",
]

#: Failed attempts a task retries unless told otherwise (with the worker's exponential backoff:
#: about 1, 2 and 4 s), then its message goes to the dead-letter queue.
DEFAULT_RETRIES = 3
#: The queue of a task that names none (created by the first enqueue or worker that needs it).
DEFAULT_QUEUE = "default"
#: Seconds a task with ``store_result`` keeps its result unless told otherwise: a day.
DEFAULT_RESULT_TTL = 86400.0

TASK_KEY = "task"
ARGS_KEY = "args"
KWARGS_KEY = "kwargs"


def _quick_fit(
    signature: inspect.Signature, skip: int
) -> Callable[[Sequence[Any], Mapping[str, Any]], bool] | None:
    """For a signature of plain parameters (no ``*args``, ``**kwargs`` or positional-only), a
    test that says True exactly when ``signature.bind`` of (``skip`` leading arguments and)
    ``args`` and ``kwargs`` would succeed; None for other signatures."""
    every = list(signature.parameters.values())
    params = every[skip:]
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if len(every) < skip or any(p.kind not in plain for p in every) or any(
        p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in every[:skip]
    ):
        return None
    positional = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    names = frozenset(p.name for p in params)
    required = frozenset(p.name for p in params if p.default is inspect.Parameter.empty)

    def fits(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        if len(args) > len(positional):
            return False
        by_position = positional[: len(args)]
        if any(k not in names or k in by_position for k in kwargs):
            return False
        return all(r in kwargs or r in by_position for r in required)

    return fits


class Task:
    """A function registered under ``name`` (default ``module.qualname``: name it yourself if
    producers and workers may import it under different module names), run by workers of
    ``queue``.

    ``retries``: failed attempts retried before the message is rejected, i.e. dead-lettered
    (default 3, after the backoff's 1, 2 and 4 s; None: until the queue's max_receive_count
    dead-letters it); one log line a retry, the traceback once, with the last failure.
    ``timeout``: seconds an attempt may run; one that runs longer has failed (a
    :class:`queue_pg.jobs.job.TaskTimeout`, retried as its policy says) whatever it does after, its
    late result ignored. asyncio cancels it; in a :class:`queue_pg.Worker` thread TaskTimeout
    is raised inside it at its next Python instruction (not while it waits in a C call).
    ``time_limit``: the hard limit, in seconds, of the process pool (``pool="processes"``):
    a run still going then has its process killed (SIGKILL), and the attempt failed with
    TaskTimeout; default ``timeout`` + 2 s (:data:`queue_pg.jobs.pool.HARD_GRACE`). There,
    ``timeout`` is raised inside the task by SIGALRM, even in a C call. The thread pool and
    asyncio cannot kill: they enforce ``timeout`` only.
    ``backoff``: overrides the worker's. ``bind``: the function takes the job (checkpoint,
    state, cancellation) as its first argument. Calling the task runs the function here.

    ``schedule``: a cron expression (``tz``: its time zone) at whose ticks a worker of the queue
    enqueues the task with no arguments (:func:`queue_pg.jobs.periodic.periodic` for arguments, or
    several schedules). ``create`` or queue ``settings`` (``visibility_timeout=60``, ...): the
    queue is created with them when a worker starts or the first enqueue finds it missing, with a
    dead-letter queue ``<queue>-dlq`` unless the settings name one (``dead_letter_queue=None``:
    none), so failed jobs are kept: ``queue-pg tasks failed`` lists them.

    Limits the database enforces across all workers, set up by the task's first enqueue (before
    its message is sent) and when a worker starts: ``max_running``: at most that many runs of
    this task at once (its messages are routed to a queue of their own,
    :func:`queue_pg.jobs.declare.limited_queue`, whose ``in_flight_limit`` it is; a retry waiting
    out its backoff holds no slot);
    ``rate_limit``: at most that many starts per second of the task's queue (every task in it).

    ``store_result``: keep what each run returned (JSON, at most the queue's max_message_size),
    or its last error once it failed for good, for ``result_ttl`` seconds (default a day), in
    the transaction that settles its message: read it with the :class:`TaskResult` an enqueue
    returns. Off by default: a task without it costs no extra statement.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        queue: str,
        name: str | None = None,
        retries: int | None = DEFAULT_RETRIES,
        timeout: Seconds | None = None,
        backoff: Backoff | None = None,
        bind: bool = False,
        registry: Registry | None = None,
        time_limit: Seconds | None = None,
        schedule: str | None = None,
        tz: str = "UTC",
        create: bool = False,
        settings: Mapping[str, Any] | None = None,
        max_running: int | None = None,
        rate_limit: float | None = None,
        store_result: bool = False,
        result_ttl: Seconds | None = None,
    ) -> None:
        if retries is not None and retries < 0:
            raise ValueError(f"retries = {retries}: need >= 0")
        self.func = func
        self.queue = queue
        self.name = name or f"{func.__module__}.{func.__qualname__}"
        self.retries = retries
        self.timeout = None if timeout is None else seconds(timeout)
        self.time_limit = None if time_limit is None else seconds(time_limit)
        if self.time_limit is not None and not self.time_limit > 0:
            raise ValueError(f"time_limit = {self.time_limit}: need > 0 seconds")
        if self.time_limit is not None and self.timeout is not None and (
                self.time_limit <= self.timeout):
            raise ValueError(f"time_limit = {self.time_limit:g} must be above timeout ="
                             f" {self.timeout:g}: the soft limit comes first")
        self.backoff = backoff
        self.bind = bind
        self.registry = registry if registry is not None else _default_registry()
        self.signature = inspect.signature(func)
        self._fits = _quick_fit(self.signature, skip=1 if bind else 0)
        self.queue_settings: dict[str, Any] | None = with_dead_letter_queue(
            queue, declared_settings(create, settings), retries)
        if max_running is not None and max_running < 1:
            raise ValueError(f"max_running = {max_running}: need >= 1")
        if rate_limit is not None and not rate_limit > 0:
            raise ValueError(f"rate_limit = {rate_limit}: need > 0 starts per second")
        self.max_running = max_running
        self.rate_limit = rate_limit
        self.store_result = store_result
        self.result_ttl = DEFAULT_RESULT_TTL if result_ttl is None else seconds(result_ttl)
        if not 1 <= self.result_ttl <= 31536000:
            raise ValueError(f"result_ttl = {result_ttl}: need 1 to 31536000 seconds (a year)")
        #: The queues its messages may come from: its own and its max_running route's. A
        #: message naming it in any other queue is rejected (a producer of that queue may not
        #: start it).
        self.runs_from = frozenset(self._queues())
        self._queue_made = False  # an enqueue found (or made) the declared queue
        self._limit_made = False  # an enqueue with a client set up max_running's route
        functools.update_wrapper(self, func)
        self.registry.register(self)
        self.schedule = schedule
        if schedule is not None:
            periodic(self, schedule, tz=tz)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    def _queues(self) -> list[str]:
        if self.max_running is None:
            return [self.queue]
        from queue_pg.jobs.declare import limited_queue

        return [self.queue, limited_queue(self)]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    # --- enqueueing -------------------------------------------------------------------------------

    def check_args(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """TypeError unless the arguments fit the function (the job comes first with bind).

        Every job a worker starts is checked: a plain signature is checked by name sets (a few
        hundred nanoseconds), and ``Signature.bind`` (several microseconds) runs only for the
        others and to word the error."""
        if self._fits is not None and self._fits(args, kwargs):
            return
        if self.bind:
            self.signature.bind(None, *args, **kwargs)
        else:
            self.signature.bind(*args, **kwargs)

    def envelope(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The message body; TypeError now (not in the worker, nor as the server's bare
        "invalid input syntax for type json") for arguments that do not fit or are not JSON."""
        self.check_args(args, kwargs)
        body = {TASK_KEY: self.name, ARGS_KEY: list(args), KWARGS_KEY: dict(kwargs)}
        try:
            json.dumps(body, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(_not_json(self.name, args, kwargs) or f"task {self.name}: {exc}"
                            ) from None
        return body

    def send(
        self,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        delay: Seconds | None = None,
        conn: psycopg.Connection[Any] | None = None,
        session: SessionLike | None = None,
        client: Client | None = None,
        ttl: Seconds | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> TaskResult:
        """Enqueue one run; returns the message id, a :class:`TaskResult` (an int) that reads
        its result when the task has ``store_result``. With ``conn`` (a psycopg connection) or
        ``session`` (a SQLAlchemy Session or Connection) the message is part of the caller's
        transaction; with neither, of the registry's ``connection()`` if it has one (Django's).
        Arguments must be JSON and fit the function (else TypeError now, not in the worker).
        ``extra``: more envelope keys (a chain's ``then``, see :mod:`queue_pg.jobs.canvas`)."""
        body = self.envelope(args, kwargs or {})
        if extra:
            body.update(extra)
        attributes = {"type": self.name}
        conn = self.joined(conn, session, client)
        if client is None and conn is not None and self.registry.client is None:
            on = conn

            def send_on() -> int:
                self._limited(on, None)
                return _send_on(on, self.queue, body, delay, attributes, ttl)

            return TaskResult(self._declaring(conn, send_on), self)
        c = client or self.registry.default_client()

        def send() -> int:
            self._limited(conn, c)
            return c.send(self.queue, body, delay=delay, ttl=ttl, attributes=attributes,
                          conn=conn)

        return TaskResult(self._declaring(conn, send, c), self, client)

    def joined(
        self, conn: psycopg.Connection[Any] | None, session: SessionLike | None,
        client: Client | None,
    ) -> psycopg.Connection[Any] | None:
        """The connection whose transaction an enqueue joins: ``conn``, ``session``'s, else
        (no ``client`` either) the registry's ``connection()`` (Django's), else None."""
        conn = join(conn, session)
        if conn is None and client is None and self.registry.connection is not None:
            conn = self.registry.connection()
        return conn

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature: this task with these arguments, for :func:`queue_pg.chain`,
        :func:`queue_pg.group` and :func:`queue_pg.chord` (a chain's later steps get the
        previous result appended to them)."""
        return Signature(self, args, kwargs)

    def _limited(self, conn: psycopg.Connection[Any] | None, client: Client | None) -> None:
        """A ``max_running`` task's limit in place before its message is sent (see
        :func:`queue_pg.jobs.declare.ensure_limit`): in the caller's transaction on each enqueue
        there (a rolled-back first enqueue takes the route with it), once per process with a
        client (committed)."""
        if self.max_running is None or (conn is None and self._limit_made):
            return
        from queue_pg.jobs.declare import ensure_limit

        ensure_limit(self, conn, client)
        if conn is None:
            self._limit_made = True

    def _declaring(
        self, conn: psycopg.Connection[Any] | None, send: Callable[[], int],
        client: Client | None = None,
    ) -> int:
        """``send()``; when the queue is missing: create it with the declared settings and send
        again, else QueueNotFound saying which command creates it. Until the first enqueue found
        the queue, one on a caller's connection runs in a savepoint, so a miss leaves the
        caller's transaction usable."""
        from queue_pg.jobs.declare import create_declared, missing_queue

        if self._queue_made or self.queue_settings is None:
            try:
                return send()
            except QueueNotFound as exc:
                raise missing_queue(self, exc) from None
        try:
            if conn is None:
                n = send()
            else:
                with conn.transaction():
                    n = send()
        except QueueNotFound:
            create_declared(self, conn, client)
            n = send()
        self._queue_made = True
        return n

    def enqueue(
        self,
        *args: Any,
        conn: psycopg.Connection[Any] | None = None,
        session: SessionLike | None = None,
        **kwargs: Any,
    ) -> TaskResult:
        """Enqueue ``func(*args, **kwargs)`` (``conn`` / ``session``: in the caller's
        transaction)."""
        return self.send(args, kwargs, conn=conn, session=session)

    def enqueue_in(
        self,
        delay: Seconds,
        *args: Any,
        conn: psycopg.Connection[Any] | None = None,
        session: SessionLike | None = None,
        **kwargs: Any,
    ) -> TaskResult:
        """Enqueue to run no sooner than ``delay`` seconds from now."""
        return self.send(args, kwargs, delay=delay, conn=conn, session=session)

    def delay(self, *args: Any, **kwargs: Any) -> TaskResult:
        """Celery's spelling of :meth:`enqueue`: every keyword goes to the function, so the
        transaction is the framework's (Django's ``atomic()``, Flask's request) or, outside
        one, the message's own."""
        return self.send(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        countdown: Seconds | None = None,
        eta: datetime | None = None,
        queue: str | None = None,
        expires: Seconds | datetime | None = None,
        conn: psycopg.Connection[Any] | None = None,
        session: SessionLike | None = None,
    ) -> TaskResult:
        """Celery's :meth:`send` with its options: run no sooner than ``countdown`` seconds
        from now or at ``eta`` (an aware datetime); never after ``expires`` (seconds or a
        datetime: the message's time-to-live). ``queue``: only the task's own (a task runs
        from the queues it is declared for, never another). Transactions as :meth:`send`."""
        if queue is not None and queue not in self.runs_from:
            raise ValueError(f"queue = {queue!r}: task {self.name} runs from queue"
                             f" {self.queue!r} only")
        if countdown is not None and eta is not None:
            raise ValueError("give countdown or eta, not both")
        delay = countdown if eta is None else max(0.0, _until(eta, "eta"))
        ttl = _until(expires, "expires") if isinstance(expires, datetime) else expires
        if ttl is not None and seconds(ttl) <= 0:
            raise ValueError(f"expires = {expires!r}: already passed")
        return self.send(args, kwargs, delay=delay, ttl=ttl, conn=conn, session=session)

    def revoke(
        self, message_id: int, *, client: Client | None = None, terminate: bool = False
    ) -> bool:
        """Cancel a run that has not started (the id ``enqueue`` returned): True if it was
        deleted; False if it is gone or running (it runs on). ``terminate``: a running one
        too: its lease ends, a process-pool worker kills it, a thread is told
        (``job.cancelled``). Needs ``manage`` on the queue."""
        c = client or self.registry.default_client()
        return any(c.cancel_message(q, message_id, terminate=terminate)
                   for q in sorted(self.runs_from))

    # --- running (called by the workers) ----------------------------------------------------------

    def run_sync(self, job: BaseJob, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        head = (job,) if self.bind else ()
        if not self.registry.has_job_contexts():  # nothing to enter: no context manager per job
            return self._call(*head, *args, **kwargs)
        with self.registry.job_context():
            return self._call(*head, *args, **kwargs)

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        result = self.func(*args, **kwargs)
        if inspect.isawaitable(result):  # an async task on the threaded worker
            return asyncio.run(_await(result))
        return result

    async def run_async(self, job: BaseJob, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        head = (job,) if self.bind else ()
        if inspect.iscoroutinefunction(self.func):
            if not self.registry.has_job_contexts():
                return await self.func(*head, *args, **kwargs)
            async with self.registry.async_job_context():
                return await self.func(*head, *args, **kwargs)
        return await asyncio.to_thread(self._in_context, *head, *args, **kwargs)

    def _in_context(self, *args: Any, **kwargs: Any) -> Any:
        with self.registry.job_context():
            return self.func(*args, **kwargs)


class Signature:
    """A task and some of its arguments (``task.s(1, x=2)``): run by itself (:meth:`delay`),
    or as a step of a chain, a member of a group or chord, or a chord's callback."""

    def __init__(self, task: Task, args: Sequence[Any] = (),
                 kwargs: Mapping[str, Any] | None = None) -> None:
        self.task = task
        self.args = list(args)
        self.kwargs = dict(kwargs or {})

    def __repr__(self) -> str:
        shown = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.task.name}.s({', '.join(shown)})"

    def step(self) -> dict[str, Any]:
        """This signature as a step in an envelope (the next result is appended to its args)."""
        return {"queue": self.task.queue, "task": self.task.name, "args": self.args,
                "kwargs": self.kwargs}

    def check_takes_one_more(self, what: str) -> None:
        """TypeError now unless the task takes these arguments and one more (the previous
        step's result), and they are JSON."""
        try:
            self.task.envelope([*self.args, None], self.kwargs)
        except TypeError as exc:
            raise TypeError(f"{what} {self!r} must take one more argument (the result it is"
                            f" given): {exc}") from None

    def apply_async(
        self, *, conn: psycopg.Connection[Any] | None = None, session: SessionLike | None = None,
        client: Client | None = None,
    ) -> TaskResult:
        return self.task.send(self.args, self.kwargs, conn=conn, session=session, client=client)

    def delay(self) -> TaskResult:
        return self.apply_async()


#: The statuses of a run that finished.
DONE = ("SUCCESS", "FAILURE")


class TaskFailed(Exception):
    """A task's run failed for good (after its retries, or rejected): :meth:`TaskResult.get`
    raises it with the error kept (the dead-letter reason, at most 1 KiB)."""

    def __init__(self, task: str, id: int, error: str | None) -> None:
        super().__init__(f"task {task} (message {id}) failed: {error}")
        self.task = task
        self.id = id
        self.error = error


class TaskResult(int):
    """The message id an enqueue returns (an int, as before), and the way to its result when
    the task keeps one (``store_result``). :meth:`get` waits for it on LISTEN, woken by the
    worker's NOTIFY; reading needs ``send`` or ``receive`` on the task's queue. It prints,
    formats and compares as the plain id."""

    task: Task
    _client: Client | None

    def __new__(cls, id: int, task: Task, client: Client | None = None) -> TaskResult:
        self = super().__new__(cls, id)
        self.task = task
        self._client = client
        return self

    @property
    def id(self) -> int:
        return int(self)

    def _queues(self) -> list[str]:
        if not self.task.store_result:
            raise ValueError(f"task {self.task.name} keeps no result: declare it with"
                             " @task(store_result=True)")
        return sorted(self.task.runs_from)

    def _reader(self, client: Client | None) -> Client:
        return client or self._client or self.task.registry.default_client()

    def stored(self, *, client: Client | None = None) -> StoredResult:
        """What is kept now (status PENDING when nothing is)."""
        c = self._reader(client)
        found = None
        for q in self._queues():
            found = c.task_result(q, int(self))
            if found.status != "PENDING":  # where it is
                break
        assert found is not None
        return found

    @property
    def status(self) -> str:
        """"SUCCESS", "FAILURE", "RETRY" (failed, waiting for its next attempt) or "PENDING"
        (not finished, or its result expired)."""
        return self.stored().status

    def ready(self) -> bool:
        """True once the run finished (SUCCESS or FAILURE)."""
        return self.status in DONE

    def get(
        self, timeout: Seconds | None = None, *, propagate: bool = True,
        client: Client | None = None,
    ) -> Any:
        """The task's return value, waiting up to ``timeout`` seconds (None: as long as it
        takes): TimeoutError if it has not finished by then; :class:`TaskFailed` if it failed
        for good (``propagate=False``: the error text is returned instead)."""
        c = self._reader(client)
        queues = self._queues()
        limit = None if timeout is None else seconds(timeout)
        while True:
            found = c.wait_task_result(queues, int(self), 60.0 if limit is None else limit)
            if found.status in DONE or limit is not None:
                break
        return self._outcome(found, limit, propagate)

    async def aget(
        self, timeout: Seconds | None = None, *, propagate: bool = True,
        client: AsyncClient | None = None,
    ) -> Any:
        """:meth:`get` for asyncio: on ``client`` (an AsyncClient) when given, else the sync
        get in a thread."""
        if client is None:
            return await asyncio.to_thread(self.get, timeout, propagate=propagate)
        queues = self._queues()
        limit = None if timeout is None else seconds(timeout)
        while True:
            found = await client.wait_task_result(queues, int(self),
                                                  60.0 if limit is None else limit)
            if found.status in DONE or limit is not None:
                break
        return self._outcome(found, limit, propagate)

    def _outcome(self, found: StoredResult, limit: float | None, propagate: bool) -> Any:
        if found.status == "SUCCESS":
            return found.result
        if found.status == "FAILURE":
            if propagate:
                raise TaskFailed(self.task.name, int(self), found.error)
            return found.error
        raise TimeoutError(f"task {self.task.name}: message {int(self)} has no result after"
                           f" {limit:g}s (not finished yet, or its result expired)")


def _not_json(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """Which argument of a task's call is not JSON, and what to do, in one line."""
    named = [(f"argument {i + 1}", v) for i, v in enumerate(args)]
    named += [(f"argument {k!r}", v) for k, v in kwargs.items()]
    for which, value in named:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            shown = repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            return (f"task {name}: {which} = {shown} is not JSON ({exc}); pass what JSON"
                    " holds (str, int, finite float, bool, None, list, dict with str keys),"
                    " e.g. an id or value.isoformat()")
    return None


def _until(at: datetime, name: str) -> float:
    """Seconds from now to ``at``, an aware datetime (a naive one would mean any zone)."""
    if at.tzinfo is None:
        raise ValueError(f"{name} = {at!r}: give an aware datetime (with tzinfo)")
    return (at - datetime.now(timezone.utc)).total_seconds()


async def _await(result: Any) -> Any:
    return await result


def _send_on(
    conn: psycopg.Connection[Any],
    queue: str,
    body: Any,
    delay: Seconds | None,
    attributes: Mapping[str, Any],
    ttl: Seconds | None = None,
) -> int:
    """Send on the caller's connection without a Client (none configured): the same statement
    Client.send runs there."""
    from queue_pg import _ops
    from queue_pg.client import execute
    from queue_pg.errors import translating

    with translating():
        return execute(conn, _ops.send(queue, body, delay, ttl, attributes))


def declared_settings(create: bool, settings: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The queue settings a task declares (None: it declares none, the queue must exist)."""
    from queue_pg._ops import SETTINGS

    unknown = sorted(set(settings or ()) - SETTINGS)
    if unknown:
        raise TypeError(f"unknown queue setting(s) {', '.join(unknown)}: allowed"
                        f" {', '.join(sorted(SETTINGS))}")
    return dict(settings or {}) if create or settings else None


def with_dead_letter_queue(
    queue: str, settings: dict[str, Any] | None, retries: int | None
) -> dict[str, Any] | None:
    """Declared settings with a dead-letter queue ``<queue>-dlq`` unless they name one (None:
    none); its ``max_receive_count`` leaves the task's retries room, catching only crash loops."""
    if settings is None:
        return None
    if "dead_letter_queue" in settings:
        if settings["dead_letter_queue"] is None:
            settings = {k: v for k, v in settings.items()
                        if k not in ("dead_letter_queue", "max_receive_count")}
        return settings
    return {**settings, "dead_letter_queue": f"{queue}-dlq",
            "max_receive_count": settings.get("max_receive_count", max(10, (retries or 0) + 2))}


# --- periodic runs: declared here, their ticks sent by the workers (jobs/periodic.py) ----------

#: What a missed tick (later than ``grace`` when a worker gets to it) becomes.
MISSED = ("skip", "catch_up")


@dataclass(frozen=True)
class Periodic:
    """A schedule of a task: ``cron`` (5 fields, or 6 with seconds first, or @hourly, @daily,
    ...) in time zone ``tz``; the run's ``args`` / ``kwargs``. Ticks later than ``grace`` seconds
    when a worker gets to them (no worker ran) were missed: ``missed="skip"`` drops them,
    ``"catch_up"`` runs the latest ``catch_up`` of them."""

    task: Task
    cron: str
    name: str
    tz: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    missed: str = "skip"
    catch_up: int = 10
    grace: float = 60.0

    def __post_init__(self) -> None:
        if self.missed not in MISSED:
            raise ValueError(f"missed = {self.missed!r}: allowed {', '.join(MISSED)}")
        self.task.check_args(self.args, self.kwargs)  # TypeError now, not at the first tick

    def register(self) -> ClientCall:
        """The client call that stores this schedule (``set_schedule``)."""
        return ClientCall(
            "set_schedule",
            (self.name, self.task.queue, self.cron, self.task.envelope(self.args, self.kwargs)),
            {"tz": self.tz, "attributes": {"type": self.task.name}, "missed": self.missed,
             "catch_up": self.catch_up, "grace": self.grace})


def periodic(
    task: Task,
    schedule: str,
    *,
    name: str | None = None,
    tz: str = "UTC",
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    missed: str = "skip",
    catch_up: int = 10,
    grace: float = 60.0,
) -> Periodic:
    """Run ``task(*args, **kwargs)`` at each tick of ``schedule`` (a cron expression) in ``tz``;
    ``name`` (default: the task's name) identifies the schedule in SQL. A task may have several.
    See :class:`Periodic` for ``missed``, ``catch_up`` and ``grace``."""
    p = Periodic(task, schedule, name or task.name, tz, tuple(args), dict(kwargs or {}), missed,
                 catch_up, float(grace))
    task.registry.add_schedule(p)
    return p


class Registry:
    """Tasks by name, for a worker to dispatch on; ``client`` is what ``enqueue`` sends with.

    Three hooks for framework integrations (``queue_pg.contrib``): ``connection``, called by an
    enqueue given no ``conn``, ``session`` or ``client``, returns the connection to send on (Django:
    its own, so ``transaction.atomic()`` covers the enqueue; Flask: ``db.session``'s in a
    request), or None: no transaction to join; ``client_for``, the client then (the app's);
    the job contexts wrap every run of every task, in the thread that runs it (Flask: an app
    context; Django: closing stale connections, as its request cycle does); an ``async def``
    task's in its event loop.
    """

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.schedules: dict[str, Periodic] = {}
        self.client: Client | None = None
        self.connection: Callable[[], psycopg.Connection[Any] | None] | None = None
        #: A framework's client for an enqueue that joins no transaction (Flask: the app's),
        #: None outside the framework: then ``client``, else one on $QUEUE_PG_DSN.
        self.client_for: Callable[[], Client | None] | None = None
        self._job_contexts: dict[str, Callable[[], AbstractContextManager[Any]]] = {}
        self._async_job_contexts: dict[str, Callable[[], AbstractAsyncContextManager[Any]]] = {}
        self._lock = threading.Lock()

    def set_job_context(
        self,
        key: str,
        factory: Callable[[], AbstractContextManager[Any]] | None,
        async_factory: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
    ) -> None:
        """Run every job inside ``factory()`` (None: no longer); one per key, the last wins.
        An ``async def`` task runs inside ``async_factory()`` if given (a context whose work
        must not block the event loop: Django's connection handling), else ``factory()``
        entered in the event loop (Flask's app context)."""
        self._async_job_contexts.pop(key, None)
        if factory is None:
            self._job_contexts.pop(key, None)
            return
        self._job_contexts[key] = factory
        if async_factory is not None:
            self._async_job_contexts[key] = async_factory

    @asynccontextmanager
    async def async_job_context(self) -> AsyncIterator[None]:
        """The job contexts for an ``async def`` task, in the order :meth:`job_context` has."""
        async with AsyncExitStack() as stack:
            for key, factory in list(self._job_contexts.items()):
                async_factory = self._async_job_contexts.get(key)
                if async_factory is not None:
                    await stack.enter_async_context(async_factory())
                else:
                    stack.enter_context(factory())
            yield

    def has_job_contexts(self) -> bool:
        return bool(self._job_contexts)

    @contextmanager
    def job_context(self) -> Iterator[None]:
        """All job contexts entered, in the order their keys were first set."""
        with ExitStack() as stack:
            for factory in list(self._job_contexts.values()):
                stack.enter_context(factory())
            yield

    def register(self, task: Task) -> None:
        old = self.tasks.get(task.name)
        if old is not None and old.func is not task.func:
            # the same function imported twice (as __main__ and by name) is no conflict
            same = getattr(old.func, "__code__", None) is getattr(task.func, "__code__", 0)
            if not same:
                raise ValueError(f"task name {task.name!r} is already registered by {old.func!r}")
        self.tasks[task.name] = task

    def add_schedule(self, schedule: Periodic) -> None:
        """Register a periodic run (its name unique in the registry)."""
        old = self.schedules.get(schedule.name)
        if old is not None and old.task.name != schedule.task.name:
            raise ValueError(f"schedule name {schedule.name!r} is already used by {old.task.name}")
        self.schedules[schedule.name] = schedule

    def queues(self) -> list[str]:
        """The queues of the registered tasks (with those of limited tasks), sorted."""
        return self.with_limited({t.queue for t in self.tasks.values()})

    def with_limited(self, queues: Sequence[str] | set[str]) -> list[str]:
        """``queues`` and the queue of each ``max_running`` task of theirs (sorted when a set)."""
        from queue_pg.jobs.declare import limited_queue

        out = sorted(queues) if isinstance(queues, set) else list(queues)
        for t in self.tasks.values():
            if t.max_running is not None and t.queue in queues:
                target = limited_queue(t)
                if target not in out:
                    out.append(target)
        return out

    def set_client(self, client: Client | None) -> None:
        self.client = client

    def default_client(self) -> Client:
        """The configured client, else a Client on ``$QUEUE_PG_DSN`` or the embedded server
        (made once)."""
        if self.client_for is not None:
            framework = self.client_for()
            if framework is not None:
                return framework
        with self._lock:
            if self.client is None:
                from queue_pg.client import Client

                self.client = Client()  # QUEUE_PG_DSN, else the embedded server
            return self.client

    def resolve(
        self, body: Any, queue: str | None = None
    ) -> tuple[Task, list[Any], dict[str, Any]]:
        """The task and arguments a message of ``queue`` asks for; Reject when it cannot run,
        ever: among them a task that ``queue`` is not one of (its producers may send to that
        queue only, so they must not start a task declared for another)."""
        if not isinstance(body, dict) or not isinstance(body.get(TASK_KEY), str):
            raise Reject(f"not a task message: the body has no {TASK_KEY!r} name")
        name = body[TASK_KEY]
        task = self.tasks.get(name)
        if task is None:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise Reject(f"unknown task {name!r}: this worker knows {known}")
        if queue is not None and queue not in task.runs_from:
            raise Reject(f"task {name!r} runs from queue {task.queue!r} only, not from queue"
                         f" {queue!r}: whoever sent it there may not start it")
        args = body.get(ARGS_KEY, [])
        kwargs = body.get(KWARGS_KEY, {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise Reject(f"task {name!r}: {ARGS_KEY!r} must be a list and {KWARGS_KEY!r} an object")
        try:
            task.check_args(args, kwargs)
        except TypeError as exc:
            raise Reject(f"task {name!r}: arguments do not fit {name}{task.signature}: {exc}"
                         ) from exc
        return task, args, kwargs


#: The registry ``@task`` registers into unless given another.
registry = Registry()


def _default_registry() -> Registry:
    return registry


def import_tasks(modules: Sequence[str]) -> Registry:
    """Import the task modules (from the current folder too, as ``python -m`` would); the
    default registry they register into."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        importlib.import_module(name)
    return registry


def set_client(client: Client | None) -> None:
    """The client tasks of the default registry enqueue with."""
    registry.set_client(client)


@overload
def task(func: Callable[..., Any], /) -> Task: ...
@overload
def task(
    *,
    queue: str | None = ...,
    name: str | None = ...,
    retries: int | None = ...,
    timeout: Seconds | None = ...,
    time_limit: Seconds | None = ...,
    backoff: Backoff | None = ...,
    bind: bool = ...,
    registry: Registry | None = ...,
    schedule: str | None = ...,
    tz: str = ...,
    create: bool = ...,
    max_running: int | None = ...,
    rate_limit: float | None = ...,
    store_result: bool = ...,
    result_ttl: Seconds | None = ...,
    **settings: Any,
) -> Callable[[Callable[..., Any]], Task]: ...


def task(
    func: Callable[..., Any] | None = None,
    /,
    *,
    queue: str | None = None,
    name: str | None = None,
    retries: int | None = DEFAULT_RETRIES,
    timeout: Seconds | None = None,
    time_limit: Seconds | None = None,
    backoff: Backoff | None = None,
    bind: bool = False,
    registry: Registry | None = None,
    schedule: str | None = None,
    tz: str = "UTC",
    create: bool = False,
    max_running: int | None = None,
    rate_limit: float | None = None,
    store_result: bool = False,
    result_ttl: Seconds | None = None,
    **settings: Any,
) -> Task | Callable[[Callable[..., Any]], Task]:
    """``@task`` or ``@task(queue="emails", retries=5, timeout=60, bind=True)``: a Task.

    No ``queue``: the queue ``default``, created (with its dead-letter queue ``default-dlq``)
    when missing. ``retries``: 3 unless told. ``schedule="*/5 * * * *"``
    (``tz="Europe/Paris"``) makes it periodic; ``create=True`` or
    queue settings (``visibility_timeout=60``, ``dead_letter_queue="emails-dlq"``, ...) create
    its queue when a worker starts or the first enqueue finds it missing; ``max_running=2``,
    ``rate_limit=10``: limits the database enforces across workers; ``store_result=True``
    (``result_ttl=3600``): keep each run's result, read with ``task.delay(...).get(timeout=10)``.
    """

    def wrap(f: Callable[..., Any]) -> Task:
        return Task(f, queue=DEFAULT_QUEUE if queue is None else queue, name=name,
                    retries=retries, timeout=timeout, time_limit=time_limit,
                    backoff=backoff, bind=bind,
                    registry=registry, schedule=schedule, tz=tz,
                    create=create or queue is None, settings=settings, max_running=max_running,
                    rate_limit=rate_limit, store_result=store_result, result_ttl=result_ttl)

    return wrap(func) if func is not None else wrap
