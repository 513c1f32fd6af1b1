"""The batched deletes of finished jobs (queue_pg.acks), the calls answered here: which jobs
ride on a receive, what a refused or failed delete does. No database, no client."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from time import monotonic
from typing import Any

import pytest

from queue_pg import acks
from queue_pg.acks import Acks
from queue_pg.jobs import BaseJob
from queue_pg.plans import Outcome
from queue_pg.types import DeleteResult, Message

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def job(n: int, queue: str = "q", lease: float = 30.0, ttl: float | None = None) -> BaseJob:
    expires = None if ttl is None else NOW + timedelta(seconds=ttl)
    m = Message(n, queue, {}, None, f"r{n}", 1, NOW, NOW, NOW + timedelta(seconds=lease),
                expires)
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


def test_jobs_ride_on_their_queues_receive_and_are_counted_once_it_commits() -> None:
    c = Counts()
    a = c.acks()
    for j in (job(1), job(2), job(3, queue="other")):
        a.add(j)
    assert c.wakes == 1 and a.due() is not None  # one wake per batch, not per job
    riders = a.ride("q")
    assert [j.id for j in riders] == [1, 2]
    a.rode(riders, None)
    assert c.counts == {"succeeded": 2} and len(a) == 1
    a.rode(a.ride("other"), RuntimeError("receive failed"))  # undone: pending again
    assert len(a) == 1 and c.counts == {"succeeded": 2}


def test_a_job_near_its_lease_end_or_expiry_goes_by_delete_batch_not_by_a_receive() -> None:
    c = Counts()
    a = c.acks()
    lapsing = job(1, lease=1.0)
    lapsing.lease_until = monotonic() + 0.1  # less than margin(1.0) = 0.5 left
    expiring = job(2, ttl=1.0)  # expires 1 s after the receive, long before its lease ends
    expiring.lease_until = monotonic() + 30
    a.add(lapsing)
    a.add(expiring)
    assert a.ride("q") == []
    done, calls = drive(a.flush(everything=True), deleted)
    assert done and [c.method for c in calls] == ["delete_batch"]
    assert calls[0].args == ("q", ["r1", "r2"])


def test_a_heartbeat_moves_the_lease_end_by_what_the_server_granted() -> None:
    j = job(1, lease=10.0)
    before = j.lease_until
    j.extended(NOW + timedelta(seconds=14))  # the lease now ends 4 s later
    assert j.lease_until == pytest.approx(before + 4)


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
    assert a.ride("q") == []  # no riding until a flush works again
    assert a.flush() is not None and drive(a.flush(), deleted)[0] is False  # not due yet
    done, calls = drive(a.flush(everything=True), deleted)
    assert done and len(calls) == 2 and c.counts == {"succeeded": 2} and len(a) == 0
    a.add(job(3))
    assert [j.id for j in a.ride("q")] == [3]  # riding again


def test_batches_are_cut_at_the_sql_limit() -> None:
    c = Counts()
    a = c.acks()
    for n in range(acks.MAX_BATCH + 5):
        a.add(job(n))
    assert len(a.ride("q")) == acks.MAX_BATCH and len(a) == 5
    a.add(job(99999))
    done, calls = drive(a.flush(everything=True), deleted)
    assert done and [len(c.args[1]) for c in calls] == [6]


def test_a_failed_long_poll_whose_deletes_committed_does_not_warn_of_expiry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = Counts()
    a = c.acks()
    a.add(job(1))
    a.rode(a.ride("q"), ConnectionError("lost while waiting"))  # its first attempt committed
    with caplog.at_level(logging.WARNING, "queue_pg.worker"):
        done, _ = drive(a.flush(everything=True), [DeleteResult("r1", False, None)])
    assert done and c.counts == {"succeeded": 1} and "expired" not in caplog.text
