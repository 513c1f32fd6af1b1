"""Periodic tasks: schedules stored and fired in SQL (sql/api/52_periodic.sql), run by workers.

``@task(queue="reports", schedule="*/5 * * * *", tz="Europe/Paris")`` or
``periodic(task, "0 9 * * mon-fri", args=(...))`` declares a schedule; each worker whose queues
include the task's registers it (``set_schedule``: a restart keeps its next run) and fires due
ticks about once a second (``fire_schedules``). The database decides who sends a tick: the
schedule's row is locked with SKIP LOCKED and its next run moved in the transaction that sends the
message, so each tick is sent once however many workers run. No beat process.

This module is the workers' side (the :class:`Scheduler`); ``Periodic`` and ``periodic`` are
declared with the tasks (:mod:`queue_pg.jobs.tasks`), and the rows and statements both clients
run are in the core (:mod:`queue_pg.schedules`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from queue_pg import outage
from queue_pg.errors import AccessDenied
from queue_pg.jobs.plans import ClientCall, Plan
from queue_pg.jobs.tasks import Periodic, periodic  # declared with the tasks; handed on here
from queue_pg.schedules import Fired

if TYPE_CHECKING:
    from queue_pg.jobs.tasks import Registry

__all__ = ["FIRE_INTERVAL", "Periodic", "Scheduler", "periodic"]

logger = logging.getLogger("queue_pg.worker")

#: Seconds between a worker's looks for due ticks: a tick is sent at most this late.
FIRE_INTERVAL = 1.0


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
