"""Deletes of finished jobs, made in batches: the worker's way to one commit per batch, not one
per job, kept off the path of its receives.

A job whose handler succeeded is not deleted at once: its receipt waits here until
:data:`FLUSH_DELAY` has passed since the first of the batch, and a ``delete_batch`` (a thread or
task of the worker's own, on another connection of the client's pool) settles the batch while
the receives go on. A receive could carry them (``receive(..., delete=receipts)``: one statement
and one commit), but its claim would then wait for the deletes and their history rows, and a
worker's threads stay idle while their receive is in the server; deleting beside it was 4 %
faster at 1 x 16 and 27 % at 2 x 8 (docs/benchmarks.md). What the worker promised before still
holds:

- ``delete_batch`` says per entry whether the receipt was stale: each job whose lease was lost
  is reported;
- a ``delete_batch`` that fails puts its jobs back: they are tried again (after a pause that
  doubles up to :data:`RETRY_CAP`), and a lease that lapsed meanwhile is reported as such;
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

from queue_pg.jobs.job import BaseJob
from queue_pg.jobs.plans import ClientCall, Plan

__all__ = ["FLUSH_DELAY", "MAX_BATCH", "RETRY_CAP", "Acks"]

logger = logging.getLogger("queue_pg.worker")

#: How long the first finished job of a batch waits for others before ``delete_batch`` runs.
FLUSH_DELAY = 0.02
#: Most receipts one statement takes (SQL's limit for ``delete_batch``).
MAX_BATCH = 1000
#: Longest pause between attempts to settle after failures (starting at FLUSH_DELAY).
RETRY_CAP = 5.0


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
                left = [j for _, js in batches[n:] for j in js]
                with self._lock:  # a commit whose answer was lost: the retry finds them gone
                    self._maybe_done.update(map(id, jobs))
                self._back(left, exc)
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
            if deleted or (error is None and earlier):  # gone: deleted by the failed attempt
                done += 1
            elif error is None:  # gone already: its message_ttl passed
                logger.warning("message %s expired before its delete", job.id)
                done += 1
            else:
                logger.warning("%s: lease lost before it was settled (%s); it runs again"
                               " elsewhere -- is the lease too short?", job.describe(), error)
                self._count("lost", 1)
        self._count("succeeded", done)

    def _back(self, jobs: list[BaseJob], exc: BaseException) -> None:
        """Jobs whose delete failed: pending again, flushed after a pause."""
        with self._lock:
            for job in reversed(jobs):
                self._pending.setdefault(job.queue, []).insert(0, job)
            first_failure = not self._failing
            self._failing = True
            self._due = monotonic() + self._retry_after
            self._retry_after = min(self._retry_after * 2, RETRY_CAP)
        if first_failure:
            logger.warning("could not settle %d finished job(s): %s; retrying (a lease that"
                           " ends meanwhile brings its message back)", len(jobs), exc)
        self._wake()
