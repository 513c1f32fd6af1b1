"""Periodic tasks: schedules stored and fired in SQL (sql/api/52_periodic.sql), run by workers.

``@task(queue="reports", schedule="*/5 * * * *", tz="Europe/Paris")`` or
``periodic(task, "0 9 * * mon-fri", args=(...))`` declares a schedule; each worker whose queues
include the task's registers it (``set_schedule``: a restart keeps its next run) and fires due
ticks about once a second (``fire_schedules``). The database decides who sends a tick: the
schedule's row is locked with SKIP LOCKED and its next run moved in the transaction that sends the
message, so each tick is sent once however many workers run. No beat process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from queue_pg import outage
from queue_pg._ops import Call
from queue_pg.advice import _rows  # rows to a dataclass by column name
from queue_pg.errors import AccessDenied
from queue_pg.jobs.plans import ClientCall, Plan

if TYPE_CHECKING:
    from queue_pg.jobs.tasks import Registry, Task

__all__ = [
    "FIRE_INTERVAL",
    "Fired",
    "Periodic",
    "Schedule",
    "ScheduleInfo",
    "Scheduler",
    "drop_schedule",
    "fire_schedules",
    "periodic",
    "schedules",
    "set_rate_limit",
    "set_schedule",
]

logger = logging.getLogger("queue_pg.worker")

#: Seconds between a worker's looks for due ticks: a tick is sent at most this late.
FIRE_INTERVAL = 1.0
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


# --- rows and statements ---------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """A row of the view ``queue_pg.schedules``: no body."""

    schedule: str
    queue: str
    cron: str
    tz: str
    next_run: datetime
    last_run: datetime | None
    last_tick: datetime | None
    last_message_id: int | None
    missed: str
    catch_up: int
    grace: float
    skipped: int
    type: str | None


@dataclass(frozen=True)
class ScheduleInfo:
    """What ``set_schedule`` returns: the next run, and whether the schedule is new."""

    schedule: str
    next_run: datetime
    created: bool


@dataclass(frozen=True)
class Fired:
    """A tick ``fire_schedules`` sent: the schedule, the queue, the tick and the message."""

    schedule: str
    queue: str
    tick: datetime
    message_id: int


def set_schedule(
    name: str, queue: str, cron: str, body: Any, *, tz: str = "UTC",
    attributes: Mapping[str, Any] | None = None, missed: str = "skip", catch_up: int = 10,
    grace: float = 60.0,
) -> Call[ScheduleInfo]:
    from psycopg.types.json import Jsonb

    return Call(
        "select * from queue_pg.set_schedule(%(name)s::text, %(queue)s::text, %(cron)s::text,"
        " %(body)s::jsonb, tz => %(tz)s::text, attributes => %(attributes)s::jsonb,"
        " missed => %(missed)s::text, catch_up => %(catch_up)s::int, grace => %(grace)s::float8)",
        {"name": name, "queue": queue, "cron": cron, "body": Jsonb(body), "tz": tz,
         "attributes": None if attributes is None else Jsonb(dict(attributes)),
         "missed": missed, "catch_up": catch_up, "grace": grace},
        lambda columns, rows: _rows(ScheduleInfo)(columns, rows)[0],
    )


def drop_schedule(name: str, queue: str) -> Call[bool]:
    return Call("select queue_pg.drop_schedule(%(name)s::text, %(queue)s::text)",
                {"name": name, "queue": queue}, lambda columns, rows: bool(rows[0][0]))


def fire_schedules(queues: Sequence[str] | None = None) -> Call[list[Fired]]:
    return Call("select * from queue_pg.fire_schedules(%(queues)s::text[])",
                {"queues": None if queues is None else list(queues)}, _rows(Fired))


def set_rate_limit(queue: str, per_second: float | None) -> Call[float | None]:
    return Call("select queue_pg.set_rate_limit(%(queue)s::text, %(rate)s::float8)",
                {"queue": queue, "rate": per_second}, lambda columns, rows: rows[0][0])


def limit_task(queue: str, task: str, target: str, max_running: int) -> Call[bool]:
    return Call("select queue_pg.limit_task(%(queue)s::text, %(task)s::text, %(target)s::text,"
                " %(n)s::integer)",
                {"queue": queue, "task": task, "target": target, "n": max_running},
                lambda columns, rows: bool(rows[0][0]))


def schedules(queue: str | None = None) -> Call[list[Schedule]]:
    where = "" if queue is None else " where queue = %(queue)s"
    return Call("select * from queue_pg.schedules" + where,
                {"queue": queue}, _rows(Schedule))


# --- the worker's part ---------------------------------------------------------------------------


class Scheduler:
    """A worker's scheduler: registers the schedules of its queues' tasks once, then fires due
    ticks each round. Both workers run its plans (:meth:`round`) beside their receive loop."""

    def __init__(self, registry: Registry | None, queues: Sequence[str]) -> None:
        self.schedules = [] if registry is None else [
            p for p in registry.schedules.values() if p.task.queue in queues]
        self.queues = sorted({p.task.queue for p in self.schedules})
        self.registered = False
        self.outage = outage.Outage(logger, "scheduler", base=FIRE_INTERVAL, cap=30.0)

    def __bool__(self) -> bool:
        return bool(self.schedules)

    def register(self) -> Plan[None]:
        for p in self.schedules:
            try:
                info = yield p.register()
            except AccessDenied as exc:  # someone who manages the queue registered it, or will
                logger.warning("schedule %s not registered (%s); firing it as stored", p.name, exc)
                continue
            logger.info("schedule %s: %s %s (%s), next run %s", p.name, p.cron, p.tz,
                        "new" if info.created else "kept", info.next_run.isoformat())
        self.registered = True

    def round(self) -> Plan[float]:
        """Register (the first time), fire what is due; the pause before the next round."""
        try:
            if not self.registered:
                yield from self.register()
            fired: list[Fired] = yield ClientCall("fire_schedules", (self.queues,))
            for f in fired:
                logger.debug("schedule %s: tick %s sent as message %s", f.schedule,
                             f.tick.isoformat(), f.message_id)
            self.outage.recovered()
        except Exception as exc:
            pause = self.outage.failed(exc)
            if not outage.is_connection_error(exc):
                logger.exception("firing schedules failed; retrying in %.1fs", pause)
            return pause
        return FIRE_INTERVAL
