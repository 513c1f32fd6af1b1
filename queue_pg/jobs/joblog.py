"""The worker's line per job start and finish (task, message id, duration, outcome), at the level
the user picks (``Worker(job_log_level=...)``, ``queue-pg worker --job-log-level``; default DEBUG,
so a busy worker says nothing per job unless asked). Failures have their own warnings besides."""

from __future__ import annotations

import logging
from time import monotonic

from queue_pg.jobs.job import BaseJob
from queue_pg.jobs.settle import Action, decide
from queue_pg.jobs.tasks import TASK_KEY

__all__ = ["OUTCOMES", "finished", "level_of", "started"]

logger = logging.getLogger("queue_pg.jobs")

#: The outcome word of each settle action.
OUTCOMES = {
    Action.DELETE: "succeeded",
    Action.RETRY: "failed, retried",
    Action.REJECT: "rejected",
    Action.RELEASE: "released",
    Action.DROP: "lease lost",
}


def level_of(level: int | str | None) -> int:
    """A logging level from a number or a name (None: DEBUG)."""
    if level is None:
        return logging.DEBUG
    if isinstance(level, str):
        value = logging.getLevelName(level.upper())
        if not isinstance(value, int):
            raise ValueError(f"job_log_level = {level!r}: allowed DEBUG, INFO, WARNING, ERROR")
        return value
    return level


def _name(job: BaseJob) -> str:
    """The task's name (from the envelope before the task is resolved), else "handler"."""
    if job.task is not None:
        return job.task.name
    named = job.body.get(TASK_KEY) if isinstance(job.body, dict) else None
    return named if isinstance(named, str) else "handler"


def started(job: BaseJob, level: int) -> float:
    """Log the start; the monotonic time it started."""
    if logger.isEnabledFor(level):
        logger.log(level, "start %s id=%s queue=%s attempt=%d", _name(job), job.id, job.queue,
                   job.receive_count)
    return monotonic()


def finished(job: BaseJob, exc: BaseException | None, at: float, level: int) -> None:
    """Log the finish: duration and outcome (what the worker now does with the message)."""
    if logger.isEnabledFor(level):
        outcome = OUTCOMES[decide(job, exc)[0]]
        why = "" if exc is None else f" ({type(exc).__name__}: {exc})"
        logger.log(level, "finish %s id=%s queue=%s in %.3fs: %s%s", _name(job), job.id,
                   job.queue, monotonic() - at, outcome, why)
