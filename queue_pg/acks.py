"""Deletes of finished jobs, made in batches: the worker's way to one commit per batch, not one
per job.

A job whose handler succeeded is not deleted at once: its receipt waits here until the worker's
next receive of that queue carries it (``receive(..., delete=receipts)``: the deletes and the
next claim in one statement and one commit), or, when no receive comes soon (an idle queue, a
long poll under way), until :data:`FLUSH_DELAY` has passed and a ``delete_batch`` settles what is
left. What the worker promised before still holds:

- a receive reports no outcome per receipt, so only jobs whose lease is certainly still theirs
  ride on it (:meth:`Acks.ride`: ends ``margin`` before the lease's end or the message's expiry,
  by the worker's own clock, counted from before the receive); the others go by
  ``delete_batch``, which says per entry whether the receipt was stale;
- a receive or a ``delete_batch`` that fails puts its jobs back: they are tried again (after a
  pause that doubles up to :data:`RETRY_CAP`), and a lease that lapsed meanwhile is reported
  as such;
- a crash before the delete leaves the message leased: it is delivered again when the lease
  ends (at-least-once, as documented).

Both workers share one :class:`Acks` per worker; its lock is held only for list moves, never
across a client call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from time import monotonic

from queue_pg.jobs import BaseJob
from queue_pg.plans import ClientCall, Plan

__all__ = ["FLUSH_DELAY", "MAX_BATCH", "RETRY_CAP", "Acks", "margin"]

logger = logging.getLogger("queue_pg.worker")

#: Longest a finished job waits for a receive to carry its delete before ``delete_batch`` does.
FLUSH_DELAY = 0.02
#: Most receipts one statement takes (SQL's limit for ``delete`` and ``delete_batch``).
MAX_BATCH = 1000
#: Longest pause between attempts to settle after failures (starting at FLUSH_DELAY).
RETRY_CAP = 5.0


def margin(lease: float) -> float:
    """How long before its lease ends a job stops riding on a receive (the receive's round
    trip, a busy server): half the lease, at most 2 s."""
    return min(lease / 2, 2.0)


class Acks:
    """The finished jobs not yet deleted, per queue; see the module docstring.

    ``wake`` is called (under no lock) when the first job of a batch arrives, so whoever runs
    :meth:`flush` knows a deadline is set; ``count(name, n)`` adds to the worker's counters.
    """

    def __init__(self, wake: Callable[[], object], count: Callable[[str, int], object]) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, list[BaseJob]] = {}
        self._due: float | None = None
        self._retry_after = FLUSH_DELAY
        self._failing = False
        self._wake = wake
        self._count = count
        self._maybe_done: set[int] = set()  # id() of jobs whose delete may have committed

    def __len__(self) -> int:
        with self._lock:
            return sum(map(len, self._pending.values()))

    def add(self, job: BaseJob) -> None:
        """A job whose handler succeeded: delete it soon."""
        with self._lock:
            self._pending.setdefault(job.queue, []).append(job)
            first = self._due is None
            if first:
                self._due = monotonic() + FLUSH_DELAY
        if first:
            self._wake()

    def due(self) -> float | None:
        """When (time.monotonic) :meth:`flush` should run next; None: nothing pending."""
        with self._lock:
            return self._due

    def ride(self, queue: str) -> list[BaseJob]:
        """Take the jobs of ``queue`` a receive may delete without reporting each outcome:
        those whose lease is surely still theirs. The caller hands them to :meth:`rode`."""
        now = monotonic()
        with self._lock:
            jobs = self._pending.get(queue)
            if not jobs or self._failing:
                return []
            safe = [j for j in jobs if j.settle_by() - margin(j.lease) > now][:MAX_BATCH]
            if len(safe) == len(jobs):
                del self._pending[queue]
            else:
                taken = set(map(id, safe))
                jobs[:] = [j for j in jobs if id(j) not in taken]
            self._settle_due()
            return safe

    def rode(self, jobs: list[BaseJob], error: BaseException | None) -> None:
        """The receive that carried ``jobs`` committed (``error`` None) or was undone."""
        if not jobs:
            return
        if error is None:
            self._count("succeeded", len(jobs))
        else:  # a long poll may have committed its first attempt (the deletes) before failing
            with self._lock:
                self._maybe_done.update(map(id, jobs))
            self._back(jobs)

    def flush(self, everything: bool = False) -> Plan[bool]:
        """Delete what is pending (once due, or ``everything`` now) with ``delete_batch``,
        reporting each job whose delete was refused; False if some are left (a failure)."""
        with self._lock:
            if not self._pending or (not everything and (self._due or 0) > monotonic()):
                return not self._pending
            batches = [(q, jobs[i:i + MAX_BATCH]) for q, jobs in self._pending.items()
                       for i in range(0, len(jobs), MAX_BATCH)]
            self._pending.clear()
            self._due = None
        for n, (queue, jobs) in enumerate(batches):
            try:
                results = yield ClientCall("delete_batch", (queue, [j.receipt for j in jobs]))
            except BaseException as exc:  # GeneratorExit too: the plan was dropped
                self._back([j for _, js in batches[n:] for j in js], exc)
                if not isinstance(exc, Exception):
                    raise
                return False
            self._report(jobs, [(r.deleted, r.error) for r in results])
        with self._lock:
            if self._failing:
                logger.info("finished jobs settled again")
            self._failing = False
            self._retry_after = FLUSH_DELAY
        return True

    def _report(self, jobs: list[BaseJob], outcomes: list[tuple[bool, str | None]]) -> None:
        done = 0
        with self._lock:
            maybe_done = [id(j) in self._maybe_done for j in jobs]
            self._maybe_done.difference_update(map(id, jobs))
        for job, (deleted, error), earlier in zip(jobs, outcomes, maybe_done, strict=True):
            if deleted or (error is None and earlier):  # gone: deleted by that receive
                done += 1
            elif error is None:  # gone already: its message_ttl passed
                logger.warning("message %s expired before its delete", job.id)
                done += 1
            else:
                logger.warning("%s: lease lost before it was settled (%s); it runs again"
                               " elsewhere -- is the lease too short?", job.describe(), error)
                self._count("lost", 1)
        self._count("succeeded", done)

    def _back(self, jobs: list[BaseJob], exc: BaseException | None = None) -> None:
        """Jobs whose delete failed: pending again, flushed after a pause (no more riding
        until a flush works: a receive that keeps failing would keep undoing them)."""
        with self._lock:
            for job in reversed(jobs):
                self._pending.setdefault(job.queue, []).insert(0, job)
            first_failure = exc is not None and not self._failing
            if exc is not None:
                self._failing = True
                self._due = monotonic() + self._retry_after
                self._retry_after = min(self._retry_after * 2, RETRY_CAP)
            elif self._due is None:
                self._due = monotonic()
        if first_failure:
            logger.warning("could not settle %d finished job(s): %s; retrying (a lease that"
                           " ends meanwhile brings its message back)", len(jobs), exc)
        self._wake()

    def _settle_due(self) -> None:
        """(Under the lock.) No deadline once nothing is pending."""
        if not self._pending:
            self._due = None
