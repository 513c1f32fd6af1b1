"""What happens to a message once its handler ended, and to its lease while it runs.

:func:`decide` picks the action from the handler's outcome alone; :func:`settle`,
:func:`beat` and :func:`release` are the plans (see :mod:`queue_pg.jobs.plans`) both workers run for
it: the client calls, in order, with what to do when one is refused. The queue's rules stay in
SQL: a dead-letter after max_receive_count, the lease's max_lease, a stale receipt.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import traceback
from collections.abc import Sequence
from datetime import datetime, timezone
from enum import Enum
from time import monotonic
from typing import TYPE_CHECKING, Any

from queue_pg.errors import (
    InvalidParameter,
    LeaseLimitExceeded,
    MessageNotFound,
    NoDeadLetterQueue,
    StaleReceipt,
)
from queue_pg.jobs.canvas import CHORD_KEY, THEN_KEY, steps_left
from queue_pg.jobs.job import (
    ERROR_KEY,
    HUNG,
    LOST,
    MAX_LEASE,
    SHUTDOWN,
    BaseJob,
    LeaseLost,
    Reject,
)
from queue_pg.jobs.plans import ClientCall, Plan
from queue_pg.plain import plain
from queue_pg.types import JSON, Message

if TYPE_CHECKING:
    from queue_pg.jobs.acks import Acks
    from queue_pg.jobs.backoff import Backoff

__all__ = [
    "MAX_TRACEBACK",
    "Action",
    "Beat",
    "StuckWatch",
    "beat",
    "decide",
    "error_attributes",
    "release",
    "settle",
]

logger = logging.getLogger("queue_pg.worker")

#: Longest traceback kept in a message's error record (its tail): attributes stay small.
MAX_TRACEBACK = 4000


class Action(str, Enum):
    """What to do with a message whose handler ended."""

    DELETE = "delete"  # it succeeded
    DROP = "drop"  # the lease is someone else's: leave the message alone
    REJECT = "reject"  # it can never succeed: dead-letter it now
    RELEASE = "release"  # make it visible now (shutdown, max_lease)
    RETRY = "retry"  # visible again after a backoff, the error recorded


def decide(job: BaseJob, exc: BaseException | None) -> tuple[Action, str]:
    """(action, reason) for a message whose handler ended, raising ``exc`` or not."""
    if exc is None:
        return Action.DELETE, ""
    if job.cancel_reason == LOST:
        return Action.DROP, job.cancel_reason
    if isinstance(exc, Reject):
        return Action.REJECT, str(exc)
    if isinstance(exc, LeaseLost) and job.cancel_reason in (SHUTDOWN, MAX_LEASE):
        return Action.RELEASE, job.cancel_reason
    retries = job.task.retries if job.task is not None else None
    if retries is not None and job.receive_count > retries:
        return Action.REJECT, (f"failed {job.receive_count} times (retries = {retries}),"
                               f" last: {type(exc).__name__}: {exc}")
    return Action.RETRY, ""


def error_attributes(job: BaseJob, exc: BaseException) -> dict[str, JSON]:
    """The record of a failed attempt, merged into the message's attributes (raw messages and
    task envelopes alike; the body stays the sender's) so a dead-lettered message shows why."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).replace(
        "\x00", "\\x00")
    error: dict[str, JSON] = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": _text(exc)[:1000],
        "traceback": tb[-MAX_TRACEBACK:],
        "attempt": job.receive_count,
        "at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "worker": f"{socket.gethostname()}:{os.getpid()}",
    }
    return {ERROR_KEY: error}


def settle(
    job: BaseJob, exc: BaseException | None, backoff: Backoff, acks: Acks | None = None,
    value: Any = None,
) -> Plan[str]:
    """Settle the message as :func:`decide` says; returns the WorkerStats counter to add
    ("" when it could not be settled: its lease brings it back). With ``acks``, a success is
    deleted later, in a batch (:mod:`queue_pg.jobs.acks` counts it). A task with ``store_result``
    is settled with its result (``value``, its return value) instead: deleted with it kept
    (``complete_task``), or, failed for good, dead-lettered with the reason kept
    (``fail_task``); a return value that is not JSON, or that the queue refuses as too large,
    fails the job so."""
    ttl = _result_ttl(job)
    flow = _in_flow(job)
    if (ttl is not None or flow) and exc is None:
        exc = _not_json_result(job, value)
    action, reason = decide(job, exc)
    q, r = job.queue, job.receipt
    try:
        if action is Action.DELETE and (ttl is not None or flow):
            try:
                if flow:  # and the chain's next step or the chord's callback, if it is due
                    done = yield ClientCall("complete_step", (q, r, value, ttl))
                else:
                    done = yield ClientCall("complete_task", (q, r, value, ttl))
            except InvalidParameter as why:  # MessageTooLarge: the job failed, not the worker
                exc = Reject(f"task {_name(job)}: its result was refused: {why}")
                action, reason = decide(job, exc)
            else:
                if not done:
                    logger.warning("message %s expired before its delete; no result kept",
                                   job.id)
                return "succeeded"
        if action is Action.DELETE and acks is not None:
            acks.add(job)
            return ""
        if action is Action.DELETE:
            if not (yield ClientCall("delete", (q, r))):
                logger.warning("message %s expired before its delete", job.id)
            return "succeeded"
        if action is Action.DROP:
            logger.warning("%s ended after its lease was lost (%s); not settled",
                           job.describe(), reason, exc_info=exc)
            return "lost"
        if action is Action.RELEASE:
            yield ClientCall("change_visibility", (q, r, 0))
            logger.info("%s stopped (%s); message released", job.describe(), reason)
            return "released"
        assert exc is not None
        delay = backoff.delay(job.receive_count)
        if action is Action.RETRY:  # one line a retry; the traceback once, at the end
            logger.warning("%s failed: %s: %s; retry in %.3gs", job.describe(),
                           type(exc).__name__, _text(exc), delay,
                           exc_info=exc if _end_unknown(job) else None)
        yield from _record(job, exc)
        if action is Action.REJECT:
            return (yield from _reject(job, exc, reason, delay))
        yield from _later(job, delay)
        return "retried"
    except (StaleReceipt, MessageNotFound) as e:
        logger.warning("%s: lease lost before it was settled (%s); it runs again"
                       " elsewhere -- is the lease too short?", job.describe(), e)
        return "lost"
    except Exception:
        logger.exception("could not settle %s; its lease brings it back", job.describe())
        return ""


def _in_flow(job: BaseJob) -> bool:
    """A job of a chain (steps left in its envelope) or a chord (a member): settled as a
    success by complete_step, which moves them on (queue_pg.jobs.canvas)."""
    body = job.body
    return isinstance(body, dict) and (bool(body.get(THEN_KEY)) or CHORD_KEY in body)


def _stopped_flow(job: BaseJob) -> str:
    """What a job's failure for good stops, for its dead-letter reason ("" for none)."""
    left = steps_left(job.body)
    out = []
    if left:
        out.append(f"chain stopped: {', '.join(left)} not run (redrive this job to go on)")
    if isinstance(job.body, dict) and CHORD_KEY in job.body:
        out.append(f"chord {job.body[CHORD_KEY]} waits for this job: its callback runs once it"
                   " succeeds (redrive it)")
    return "; ".join(out)


def _result_ttl(job: BaseJob) -> float | None:
    """Seconds a result of this job is kept; None: its task keeps none (a plain handler's
    neither)."""
    task = job.task
    return task.result_ttl if task is not None and task.store_result else None


def _name(job: BaseJob) -> str:
    return job.task.name if job.task is not None else "handler"


def _not_json_result(job: BaseJob, value: Any) -> Reject | None:
    """The failure of a task whose return value is not JSON (it can never be kept): the
    task's name, the value and what to return instead."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return Reject(f"task {_name(job)}: its return value {shown} is"
                      f" not JSON ({exc}); return what JSON holds (str, int, finite float,"
                      " bool, None, list, dict with str keys)")
    except RecursionError as exc:
        return Reject(f"task {_name(job)}: its return value is not"
                      f" JSON ({exc})")
    return None


def _text(exc: BaseException) -> str:
    """An exception's text for a log line or a reason: no NUL (PostgreSQL text refuses it)."""
    return str(exc).replace("\x00", "\\x00")


def _end_unknown(job: BaseJob) -> bool:
    """A failure whose last attempt nobody can tell (no ``retries``: the queue's
    max_receive_count decides, in SQL): its first failure logs the traceback."""
    return (job.task is None or job.task.retries is None) and job.receive_count == 1


def _record(job: BaseJob, exc: BaseException) -> Plan[None]:
    """The failure's record into the message's attributes; one the queue's max_message_size
    refuses is tried again without the traceback, and then skipped: a record is never a reason
    to leave a failed message unsettled."""
    attributes = error_attributes(job, exc)
    for attempt in range(2):
        try:
            yield ClientCall("update", (job.queue, job.receipt),
                             {"attributes": attributes, "visibility_timeout": None})
            return
        except InvalidParameter as why:  # MessageTooLarge, mostly
            if attempt:
                logger.warning("%s: its error record was refused (%s); settled without it",
                               job.describe(), why)
                return
            error = dict(attributes[ERROR_KEY])
            error["traceback"] = None
            error["message"] = str(error["message"])[:200]
            attributes = {ERROR_KEY: error}


def _later(job: BaseJob, delay: float) -> Plan[None]:
    """Visible again after ``delay``: a planned retry (release=True), not counted as a lease
    expiry; past max_lease, at once."""
    try:
        yield ClientCall("change_visibility", (job.queue, job.receipt, delay), {"release": True})
    except LeaseLimitExceeded:  # past max_lease: no backoff, but still recorded and retried
        logger.warning("backoff of %.3gs for message %s passes max_lease;"
                       " retrying it at once", delay, job.id)
        yield ClientCall("change_visibility", (job.queue, job.receipt, 0), {"release": True})


def _reject(job: BaseJob, exc: BaseException, reason: str, delay: float) -> Plan[str]:
    """Dead-letter now (SQL cuts a long reason to fit). A message is never deleted because the
    move was refused: without a dead-letter queue it stays in its queue and comes back after
    ``delay``; any other refusal leaves it leased, its lease bringing it back; the log says why."""
    tb = None if isinstance(exc, Reject) else exc  # the traceback, once
    q = job.queue
    stopped = _stopped_flow(job)  # first: SQL cuts a long reason at its end
    reason = (f"{stopped}; {reason}" if stopped else reason).replace("\x00", "\\x00")
    ttl = _result_ttl(job)
    try:
        if ttl is None:
            moved = yield ClientCall("dead_letter", (q, job.receipt, reason))
        else:  # and its FAILURE kept, in the same transaction
            moved = yield ClientCall("fail_task", (q, job.receipt, reason, ttl))
    except NoDeadLetterQueue:
        yield from _later(job, delay)
        logger.error("%s rejected: %s -- KEPT in queue %s, not dead-lettered: it has no"
                     " dead_letter_queue; it comes back in %.3gs. Give it one: queue-pg alter %s"
                     " --dead-letter-queue %s-dlq --max-receive-count 10 (after queue-pg create"
                     " %s-dlq)", job.describe(), reason, q, delay, q, q, q, exc_info=tb)
        return "kept"
    except (StaleReceipt, MessageNotFound):
        raise
    except Exception as why:
        logger.error("%s rejected: %s -- KEPT, not dead-lettered: the move was refused (%s: %s);"
                     " its lease brings it back", job.describe(), reason, type(why).__name__,
                     why, exc_info=tb)
        return "kept"
    if moved:
        logger.warning("%s rejected, not retried: %s; dead-lettered", job.describe(), reason,
                       exc_info=tb)
    else:
        logger.warning("%s rejected, not retried: %s; not dead-lettered: the message was"
                       " gone already (expired)", job.describe(), reason)
    return "rejected"


class Beat(str, Enum):
    """How a heartbeat went."""

    KEPT = "kept"  # the lease runs another job.lease seconds
    FAILED = "failed"  # no answer (server away): try again soon
    ENDED = "ended"  # the lease cannot be kept: the job is cancelled, stop beating


def beat(job: BaseJob) -> Plan[Beat]:
    """Renew the job's lease; cancel the job when that is refused."""
    try:
        yield ClientCall("change_visibility", (job.queue, job.receipt, job.lease))
        return Beat.KEPT
    except (StaleReceipt, MessageNotFound) as exc:
        job.cancel(LOST)
        why = str(exc)
    except LeaseLimitExceeded as exc:
        if exc.diag is None or exc.diag.constraint_name != HUNG_CONSTRAINT:
            job.cancel(MAX_LEASE)
            why = str(exc)
            logger.warning("%s cannot keep its lease: %s", plain(job.describe()), plain(why))
            return Beat.ENDED
        job.cancel(HUNG)
        logger.error("%s: heartbeat refused at the hard limit, after %.3gs: %s. The attempt"
                     " fails (retried or dead-lettered as the task's retries say) and the"
                     " message is delivered again", plain(job.describe()),
                     monotonic() - job.received, plain(exc))
        return Beat.ENDED
    except Exception:
        logger.warning("heartbeat of message %s failed; trying again", job.id, exc_info=True)
        return Beat.FAILED
    logger.warning("%s cannot keep its lease: %s", plain(job.describe()), plain(why))
    return Beat.ENDED


#: The CONSTRAINT of the LeaseLimitExceeded (QP007) a heartbeat past a 'per_type' queue's
#: hung-work limit gets (sql/api/40_settle.sql): told apart from max_lease by it.
HUNG_CONSTRAINT = "hung_work_limit"

#: Seconds a worker keeps a queue's hung-work limits before reading them again (the per-type
#: leases they come from change at most once per tune_interval, a minute by default).
LIMITS_TTL = 60.0


class StuckWatch:
    """Logs a WARNING, once per job, when a running job passes its type's stuck point (twice
    its type's lease on a 'per_type' queue: the rule of ``queue_pg.stuck_jobs``, read per queue
    from ``queue_pg.hung_limits`` at most once per :data:`LIMITS_TTL`)."""

    def __init__(self) -> None:
        #: queue -> (when read, type -> (type_lease, stuck_after, stopped_after))
        self._limits: dict[str, tuple[float, dict[str, tuple[float, float, float]]]] = {}

    def check(self, jobs: Sequence[BaseJob]) -> Plan[float | None]:
        """Report the jobs past their stuck point; returns the next stuck point (monotonic) of
        those not reported yet, None when there is none."""
        now = monotonic()
        watched = [j for j in jobs if not j.stuck_reported and _type(j) is not None]
        for queue in {j.queue for j in watched}:
            known = self._limits.get(queue)
            if known is None or now - known[0] >= LIMITS_TTL:
                try:
                    rows = yield ClientCall("hung_limits", (queue,))
                except Exception:  # none known until the next read; the SQL limit holds anyway
                    logger.debug("reading the hung-work limits of %s failed", plain(queue),
                                 exc_info=True)
                    self._limits[queue] = (now, {})
                    continue
                self._limits[queue] = (now, {r.type: (r.type_lease, r.stuck_after,
                                                      r.stopped_after) for r in rows})
        next_at: float | None = None
        now = monotonic()
        for job in watched:
            limit = self._limits.get(job.queue, (0.0, {}))[1].get(_type(job) or "")
            if limit is None:
                continue
            lease, stuck_after, stopped_after = limit
            if now - job.received < stuck_after:
                at = job.received + stuck_after
                next_at = at if next_at is None else min(next_at, at)
                continue
            job.stuck_reported = True
            logger.warning("%s of type %s is stuck: it has run %.3gs, past %.3gs (%.3g x its"
                           " type's lease of %.3gs); its heartbeats are refused from %.3gs",
                           plain(job.describe()), plain(repr(_type(job))), now - job.received,
                           stuck_after, stuck_after / lease if lease else 0.0, lease,
                           stopped_after)
        return next_at


def _type(job: BaseJob) -> str | None:
    """The job's ``type`` attribute as the SQL reads it (its first 100 characters)."""
    attrs = job.message.attributes
    t = attrs.get("type") if isinstance(attrs, dict) else None
    return t[:100] if isinstance(t, str) else None


def release(messages: Sequence[Message]) -> Plan[int]:
    """Make messages received but not started visible again at once; returns how many."""
    released = 0
    for m in messages:
        assert m.receipt is not None
        try:
            yield ClientCall("change_visibility", (m.queue, m.receipt, 0))
            released += 1
        except Exception:
            logger.warning("could not release message %s; its lease brings it back",
                           m.id, exc_info=True)
    if messages:
        logger.info("released %d received, unstarted message(s)", len(messages))
    return released
