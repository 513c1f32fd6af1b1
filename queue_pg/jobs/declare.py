"""Queues that tasks declare: created when a worker starts or the first enqueue finds them
missing (``@task(queue="emails", create=True)`` or settings on the decorator); for a task that
declares nothing, a missing queue is an error that names the command which creates it.

An existing queue is never altered here: its settings are the operator's (``queue-pg alter``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from queue_pg import _ops
from queue_pg.errors import QueueAlreadyExists, QueueNotFound, translating
from queue_pg.jobs.plans import ClientCall, Plan

if TYPE_CHECKING:
    import psycopg

    from queue_pg.client import Client

__all__ = ["create_declared", "ensure_limit", "ensure_queues", "hint", "limited_queue", "limits",
           "missing_queue"]

logger = logging.getLogger("queue_pg.worker")


class Declared(Protocol):
    """What is read here of a task: a :class:`queue_pg.jobs.tasks.Task` (which sits above this
    module: its enqueue calls it)."""

    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def queue_settings(self) -> Mapping[str, Any] | None: ...
    @property
    def max_running(self) -> int | None: ...
    @property
    def rate_limit(self) -> float | None: ...


class Declarations(Protocol):
    """What is read here of a :class:`queue_pg.jobs.tasks.Registry`: its tasks by name."""

    @property
    def tasks(self) -> Mapping[str, Declared]: ...


def hint(queue: str) -> str:
    """How to create ``queue``: the command, or a task declaration."""
    return (f"create it with `queue-pg create {queue}` (or client.create_queue), or declare it on"
            f" the task: @task(queue={queue!r}, create=True) or with its settings")


def missing_queue(task: Declared, exc: QueueNotFound) -> QueueNotFound:
    """The QueueNotFound an enqueue of ``task`` raises: the server's, with the way out."""
    return QueueNotFound(f"{exc}; task {task.name}: {hint(task.queue)}",
                         sqlstate=exc.sqlstate, diag=exc.diag)


def _order(queue: str, settings: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The queues to create for a declaration: its dead-letter queue (default settings) first."""
    dlq = settings.get("dead_letter_queue")
    if isinstance(dlq, str) and dlq != queue:
        yield dlq, {}
    yield queue, dict(settings)


def create_declared(
    task: Declared, conn: psycopg.Connection[Any] | None, client: Client | None
) -> None:
    """Create the task's queue (and its dead-letter queue) with the declared settings, on the
    caller's connection (a savepoint each) or with ``client``; one that exists is left as it is."""
    assert task.queue_settings is not None
    for name, settings in _order(task.queue, task.queue_settings):
        try:
            if conn is not None:
                with translating(), conn.transaction():
                    from queue_pg.client import execute

                    execute(conn, _ops.create_queue(name, settings))
            else:
                assert client is not None
                client.create_queue(name, **settings)
            logger.info("queue %s created, as task %s declares", name, task.name)
        except QueueAlreadyExists:  # made by someone else meanwhile, or with other settings
            pass


def limited_queue(task: Declared) -> str:
    """The queue of a ``max_running`` task's messages: ``<queue>-<task name>``, the name's other
    characters as ``_`` (cut to 80 characters, a hash keeping it unique)."""
    name = f"{task.queue}-{re.sub('[^A-Za-z0-9_-]', '_', task.name)}"
    if len(name) > 80:
        name = f"{name[:71]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return name


def limits(registry: Declarations | None, queues: Sequence[str]) -> Plan[None]:
    """At a worker's start: the limits its tasks declare, in the database. A ``max_running``
    task's messages are routed to a queue of their own whose ``in_flight_limit`` is the limit
    (``queue_pg.limit_task``, which the task's first enqueue calls too); a ``rate_limit``
    becomes its queue's start rate."""
    tasks = [] if registry is None else [t for t in registry.tasks.values() if t.queue in queues]
    for t in tasks:
        if t.rate_limit is not None:
            yield ClientCall("set_rate_limit", (t.queue, t.rate_limit))
        if t.max_running is None:
            continue
        target = limited_queue(t)
        yield ClientCall("limit_task", (t.queue, t.name, target, t.max_running))
        logger.info("task %s: at most %d running, in queue %s", t.name, t.max_running, target)


def ensure_limit(
    task: Declared, conn: psycopg.Connection[Any] | None, client: Client | None
) -> None:
    """Before an enqueue of a ``max_running`` task: its limit in place (``queue_pg.limit_task``),
    on the caller's connection (in its transaction: the route commits with the message) or with
    ``client``, so its messages never run unlimited, whether or not a worker started yet."""
    assert task.max_running is not None
    call = (task.queue, task.name, limited_queue(task), task.max_running)
    if conn is not None:
        from queue_pg.client import execute
        from queue_pg.schedules import limit_task

        with translating():
            execute(conn, limit_task(*call))
    else:
        assert client is not None
        client.limit_task(*call)


def ensure_queues(registry: Declarations | None, queues: Sequence[str]) -> Plan[None]:
    """At a worker's start: each of its queues that is missing is created if one of its tasks
    declares it, else QueueNotFound saying how to create it; then the tasks' limits."""
    declared: dict[str, Declared] = {}
    if registry is not None:
        for t in registry.tasks.values():
            if t.queue_settings is not None:
                declared.setdefault(t.queue, t)
    limited = set() if registry is None else {
        limited_queue(t) for t in registry.tasks.values() if t.max_running is not None}
    for queue in queues:
        if queue in limited:
            continue  # made by limits() below
        try:
            yield ClientCall("get_queue", (queue,))
            continue
        except QueueNotFound as exc:
            task = declared.get(queue)
            if task is None:
                raise QueueNotFound(f"{exc}; {hint(queue)}", sqlstate=exc.sqlstate,
                                    diag=exc.diag) from None
        assert task.queue_settings is not None
        for name, settings in _order(queue, task.queue_settings):
            try:
                yield ClientCall("create_queue", (name,), settings)
                logger.info("queue %s created, as task %s declares", name, task.name)
            except QueueAlreadyExists:
                pass
    yield from limits(registry, queues)
