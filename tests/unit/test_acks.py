"""The batched deletes of finished jobs (queue_pg.jobs.acks), the calls answered here: when a batch
is due, how it is cut, what a refused or failed delete does. No database, no client."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from time import monotonic
from typing import Any

import pytest

from queue_pg.jobs import acks
from queue_pg.jobs.acks import Acks
from queue_pg.jobs.job import BaseJob
from queue_pg.jobs.plans import Outcome
from queue_pg.types import DeleteResult, Message

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def job(n: int, queue: str = "q", lease: float = 30.0) -> BaseJob:
    m = Message(n, queue, {}, None, f"r{n}", 1, NOW, NOW, NOW + timedelta(seconds=lease), None)
    return BaseJob(m, lease=lease)


class Counts:
    def __init__(self) -> None:
        self.wakes = 0
        self.counts: dict[str, int] = {}

    def acks(self) -> Acks:
        return Acks(self.wake, self.add)

    def wake(self) -> None:
        self.wakes += 1

    def add(self, name: str, n: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + n


def drive(plan: Any, answer: Any) -> tuple[Any, list[Any]]:
    calls = []
    outcome: Outcome[Any] = Outcome()
    while (call := outcome.next(plan)) is not None:
        calls.append(call)
        a = answer(call) if callable(answer) else answer
        outcome = Outcome(error=a) if isinstance(a, Exception) else Outcome(a)
    return outcome.value, calls


def deleted(call: Any) -> list[DeleteResult]:
    return [DeleteResult(r, True, None) for r in call.args[1]]


def test_a_batch_is_due_after_the_flush_delay_and_goes_by_one_delete_batch_per_queue() -> None:
    c = Counts()
    a = c.acks()
    before = monotonic()
    for j in (job(1), job(2), job(3, queue="other")):
        a.add(j)
    due = a.due()
    assert c.wakes == 1 and due is not None  # one wake per batch, not per job
    assert before + acks.FLUSH_DELAY <= due <= monotonic() + acks.FLUSH_DELAY
    done, calls = drive(a.flush(), deleted)  # not due yet: nothing sent
    assert done is False and calls == [] and len(a) == 3
    done, calls = drive(a.flush(everything=True), deleted)
    assert done and [(c.method, c.args) for c in calls] == [
        ("delete_batch", ("q", ["r1", "r2"])), ("delete_batch", ("other", ["r3"]))]
    assert c.counts == {"succeeded": 3} and len(a) == 0 and a.due() is None
    a.add(job(4))  # the next batch wakes the flusher again
    assert c.wakes == 2 and a.due() is not None


def test_each_refused_delete_is_reported_for_its_own_job(caplog: pytest.LogCaptureFixture) -> None:
    c = Counts()
    a = c.acks()
    for n in (1, 2, 3):
        a.add(job(n))
    answers = [DeleteResult("r1", True, None), DeleteResult("r2", False, "StaleReceipt"),
               DeleteResult("r3", False, None)]
    with caplog.at_level(logging.WARNING, "queue_pg.worker"):
        done, _ = drive(a.flush(everything=True), answers)
    assert done and c.counts == {"lost": 1, "succeeded": 2}
    text = caplog.text
    assert "message 2 of q" in text and "StaleReceipt" in text
    assert "message 3 expired before its delete" in text and "message 1 " not in text


def test_a_failed_flush_keeps_the_jobs_and_tries_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = Counts()
    a = c.acks()
    a.add(job(1))
    a.add(job(2, queue="other"))
    with caplog.at_level(logging.WARNING, "queue_pg.worker"):
        done, _ = drive(a.flush(everything=True), ConnectionError("server gone"))
    assert not done and len(a) == 2 and "could not settle" in caplog.text
    due = a.due()
    assert due is not None and due > monotonic()  # a pause before the next attempt
    assert a.flush() is not None and drive(a.flush(), deleted)[0] is False  # not due yet
    done, calls = drive(a.flush(everything=True), deleted)
    assert done and len(calls) == 2 and c.counts == {"succeeded": 2} and len(a) == 0
    a.add(job(3))  # after a success the next batch waits FLUSH_DELAY again, not the pause
    due = a.due()
    assert due is not None and due <= monotonic() + acks.FLUSH_DELAY


def test_batches_are_cut_at_the_sql_limit() -> None:
    c = Counts()
    a = c.acks()
    for n in range(acks.MAX_BATCH + 5):
        a.add(job(n))
    done, calls = drive(a.flush(everything=True), deleted)
    assert done and [len(c.args[1]) for c in calls] == [acks.MAX_BATCH, 5]


def test_a_failed_flush_whose_deletes_committed_does_not_warn_of_expiry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = Counts()
    a = c.acks()
    a.add(job(1))
    a.add(job(2, queue="other"))
    # the first batch's commit went through and its answer was lost: the retry finds it gone
    done, _ = drive(a.flush(everything=True), ConnectionError("lost while waiting"))
    assert not done and len(a) == 2
    with caplog.at_level(logging.WARNING, "queue_pg.worker"):
        done, _ = drive(a.flush(everything=True),
                        lambda call: [DeleteResult(r, False, None) for r in call.args[1]])
    assert done and c.counts == {"succeeded": 2}
    # "q" was the batch that failed: gone without a warning; "other" was never tried, so its
    # message's absence is an expiry
    assert "message 1 expired" not in caplog.text and "message 2 expired" in caplog.text
