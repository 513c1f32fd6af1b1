"""Schedules and start limits: their rows and statements (sql/api/52_periodic.sql,
sql/api/53_task_limits.sql), which both clients run; the worker's side of schedules (the
Scheduler) and the ``Periodic`` declarations are in the jobs layer (``queue_pg.jobs``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from queue_pg._ops import Call
from queue_pg.advice import _rows  # rows to a dataclass by column name

__all__ = [
    "Fired",
    "Schedule",
    "ScheduleInfo",
    "drop_schedule",
    "fire_schedules",
    "limit_task",
    "schedules",
    "set_rate_limit",
    "set_schedule",
]



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
