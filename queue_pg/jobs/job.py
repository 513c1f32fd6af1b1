"""What a handler gets: the job (message, saved state, cancellation) and the two exceptions it
may raise to steer what happens to its message.

A job's ``checkpoint(state)`` saves progress in the message (a body-only ``update`` that leaves
the lease alone), so a redelivery after a crash resumes instead of starting over.
"""

from __future__ import annotations

import contextvars
import threading
from time import monotonic
from typing import TYPE_CHECKING, Any, Protocol

from queue_pg.errors import MessageNotFound, StaleReceipt
from queue_pg.types import JSON, Message

if TYPE_CHECKING:
    from queue_pg.aio import AsyncClient
    from queue_pg.client import Client
    from queue_pg.jobs.backoff import Backoff

__all__ = [
    "ERROR_KEY",
    "HUNG",
    "LOST",
    "MAX_LEASE",
    "SHUTDOWN",
    "STATE_KEY",
    "TIMEOUT",
    "AsyncJob",
    "BaseJob",
    "Job",
    "JobTask",
    "LeaseLost",
    "Reject",
    "TaskTimeout",
    "current_job",
    "job_var",
]

#: Key of a task envelope that belongs to the worker: the last checkpoint.
STATE_KEY = "state"
#: Attribute of a message that the worker writes: the record of its last failed attempt (type,
#: message, traceback, attempt, at, worker), so a dead-lettered message shows why it failed.
ERROR_KEY = "error"

# Why a job was cancelled. LOST: someone else may hold the message now, never touch it again.
LOST = "lease lost"
MAX_LEASE = "max_lease reached"
#: a heartbeat refused at a 'per_type' queue's hung-work limit (docs/timeouts.md, "Hung work"):
#: the attempt fails, retried or dead-lettered as the task's retries say
HUNG = "hung-work limit reached"
TIMEOUT = "task timeout"
SHUTDOWN = "worker shutdown"


class LeaseLost(Exception):
    """The job can no longer count on its lease: stop now, the message will be delivered again.

    Raised by ``job.raise_if_cancelled()``, by a checkpoint that was refused, and by a checkpoint
    of a cancelled job (after saving). A handler that lets it propagate has its message released
    (worker shutdown, max_lease), retried as a failed attempt (the hung-work limit) or left
    alone (the lease went to someone else).
    """


class Reject(Exception):
    """Raised by a handler for a message that can never succeed: it is not retried but
    dead-lettered at once, the exception's text as ``dead_letter_reason`` (on a queue without a
    dead-letter queue: deleted, and logged in full).

    The worker raises it itself for an unknown task name, arguments that do not fit the task,
    and a body the client could not decode (:class:`queue_pg.UndecodableBody`).
    """


class TaskTimeout(Exception):
    """An attempt ran past its task's ``timeout``: a failure, retried as the task's ``retries``
    say, whatever the function does after (its late result is ignored).

    Also raised inside a task running in a :class:`queue_pg.Worker` thread at its timeout (like
    Celery's soft time limit): at its next Python instruction, not while it waits in a C call
    (a socket read, ``time.sleep``). A task may catch it to clean up."""

    def __init__(self, message: str = "the task ran past its timeout") -> None:
        super().__init__(message)


#: The job the running handler works on (each handler thread or task has its own context).
job_var: contextvars.ContextVar[BaseJob] = contextvars.ContextVar("queue_pg_job")


def current_job() -> BaseJob:
    """The job the calling handler runs (LookupError outside a handler)."""
    return job_var.get()


class JobTask(Protocol):
    """What the job and the workers read of the job's task: a :class:`queue_pg.jobs.tasks.Task`
    (which sits above this module: it runs jobs)."""

    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def retries(self) -> int | None: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def backoff(self) -> Backoff | None: ...
    @property
    def store_result(self) -> bool: ...
    @property
    def result_ttl(self) -> float: ...


class BaseJob:
    """What a handler gets: the message, its saved state, and whether it must stop."""

    def __init__(self, message: Message, lease: float, task: JobTask | None = None) -> None:
        assert message.receipt is not None
        self.message = message
        self.receipt: str = message.receipt
        self.lease = lease
        self.task = task
        self.body: JSON = message.body
        self.cancel_reason: str | None = None
        self.received = monotonic()  #: when the worker got it (the stuck point counts from it)
        self.stuck_reported = False  #: its "stuck" warning was logged (once per job)

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
        """LeaseLost once the job is cancelled: call it between steps of a long handler."""
        if self.cancel_reason is not None:
            raise LeaseLost(f"message {self.id} of queue {self.queue!r}: {self.cancel_reason}")

    def cancel(self, reason: str) -> None:
        """Ask the handler to stop; the first reason stays, except that LOST wins: it means the
        worker may no longer touch the message."""
        if self.cancel_reason != LOST:
            self.cancel_reason = reason

    def describe(self) -> str:
        """The job in a log line: task (or handler), message, queue and attempt."""
        name = self.task.name if self.task is not None else "handler"
        return f"{name} (message {self.id} of {self.queue}, attempt {self.receive_count})"

    def _checkpoint_body(self, state: JSON) -> dict[str, Any]:
        if not isinstance(self.body, dict):
            raise TypeError("checkpoint needs a JSON object body (a task envelope),"
                            f" not {type(self.body).__name__}")
        return {**self.body, STATE_KEY: state}

    def _checkpointed(self, body: dict[str, Any], refused: Exception | None) -> None:
        """After the checkpoint's update: LeaseLost if it was refused (the lease is someone
        else's) or the job is cancelled; else the saved state is the job's."""
        if refused is not None:
            self.cancel(LOST)
            raise LeaseLost(f"message {self.id} of queue {self.queue!r}: {refused}") from refused
        self.body = body
        self.raise_if_cancelled()


class Job(BaseJob):
    """A message being handled by a :class:`queue_pg.Worker` thread."""

    def __init__(
        self, client: Client, message: Message, lease: float, task: JobTask | None = None
    ) -> None:
        super().__init__(message, lease, task)
        self._client = client
        self.lock = threading.Lock()  # orders heartbeats before the message is settled
        self.beating = True
        self.started = self.received  # one clock read a job: it runs as soon as it is received
        self.next_beat = 0.0
        self.deadline: float | None = None
        self.timed_out = False  # settled as failed at its deadline: the handler's end is ignored
        self.thread: int | None = None  # the handler's thread while a soft limit may hit it
        self.soft_lock = threading.Lock()  # orders the soft limit's raise and its disarming

    def checkpoint(self, state: JSON) -> None:
        """Save ``state`` in the message, so a redelivery resumes from it; :attr:`state` reads
        it back. A body-only ``update`` under our receipt: the lease stays as the heartbeat keeps
        it, so a checkpoint works up to the end of the lease, max_lease included.

        LeaseLost if the update is refused (the lease is someone else's), and, after the state is
        saved, if the job was cancelled (max_lease, timeout, shutdown): the handler stops there,
        and the message is released or retried and resumes from this state.
        """
        body = self._checkpoint_body(state)
        try:
            self._client.update(self.queue, self.receipt, body=body, visibility_timeout=None)
        except (StaleReceipt, MessageNotFound) as exc:
            self._checkpointed(body, exc)
        self._checkpointed(body, None)


class AsyncJob(BaseJob):
    """A message being handled by a :class:`queue_pg.AsyncWorker` task."""

    def __init__(
        self, client: AsyncClient, message: Message, lease: float, task: JobTask | None = None
    ) -> None:
        super().__init__(message, lease, task)
        self._client = client

    async def checkpoint(self, state: JSON) -> None:
        """Save ``state`` in the message, as :meth:`Job.checkpoint` does."""
        body = self._checkpoint_body(state)
        try:
            await self._client.update(self.queue, self.receipt, body=body, visibility_timeout=None)
        except (StaleReceipt, MessageNotFound) as exc:
            self._checkpointed(body, exc)
        self._checkpointed(body, None)
