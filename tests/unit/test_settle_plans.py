"""Settle decisions and the plans both workers run, answered here instead of by a server.

A plan only yields the client calls it wants made; these tests answer each call (or raise the
error a server would) and check what comes next. No database, no client.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from queue_pg.errors import InvalidParameter, LeaseLimitExceeded, NoDeadLetterQueue, StaleReceipt
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.job import LOST, MAX_LEASE, SHUTDOWN, BaseJob, LeaseLost, Reject
from queue_pg.jobs.plans import ClientCall, Outcome, Plan
from queue_pg.jobs.settle import Action, Beat, beat, decide, release, settle
from queue_pg.types import Message

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def job(receive_count: int = 1, body: Any = "b") -> BaseJob:
    m = Message(7, "q", body, None, "r", receive_count, NOW, NOW, NOW, None)
    return BaseJob(m, lease=30.0)


def drive(plan: Plan[Any], answers: dict[str, Any]) -> tuple[Any, list[ClientCall]]:
    """Run ``plan``, answering each call by method name (an exception is raised into it)."""
    calls: list[ClientCall] = []
    outcome: Outcome[Any] = Outcome()
    while (call := outcome.next(plan)) is not None:
        calls.append(call)
        answer = answers.get(call.method)
        if isinstance(answer, list):
            answer = answer.pop(0)
        outcome = Outcome(error=answer) if isinstance(answer, Exception) else Outcome(answer)
    return outcome.value, calls


def test_decide() -> None:
    assert decide(job(), None) == (Action.DELETE, "")
    assert decide(job(), Reject("never"))[0] is Action.REJECT
    assert decide(job(), ValueError("x")) == (Action.RETRY, "")
    lost = job()
    lost.cancel(LOST)
    assert decide(lost, Reject("x"))[0] is Action.DROP  # LOST wins: never touch it again
    stopping = job()
    stopping.cancel(SHUTDOWN)
    assert decide(stopping, LeaseLost("stop")) == (Action.RELEASE, SHUTDOWN)
    capped = job()
    capped.cancel(MAX_LEASE)
    assert decide(capped, LeaseLost("cap")) == (Action.RELEASE, MAX_LEASE)
    assert decide(capped, ValueError("x"))[0] is Action.RETRY  # a failure is still a failure


def test_settle_success_deletes() -> None:
    counter, calls = drive(settle(job(), None, Backoff()), {"delete": True})
    assert counter == "succeeded" and [c.method for c in calls] == ["delete"]


def test_settle_failure_records_the_error_then_backs_off() -> None:
    counter, calls = drive(settle(job(receive_count=3), RuntimeError("boom"),
                                  Backoff(base=1, factor=2, jitter=0)), {})
    assert counter == "retried"
    assert [c.method for c in calls] == ["update", "change_visibility"]
    error = calls[0].kwargs["attributes"]["error"]
    assert error["type"] == "builtins.RuntimeError" and error["attempt"] == 3
    assert calls[1].args == ("q", "r", 4.0) and calls[1].kwargs == {"release": True}


def test_a_backoff_past_max_lease_retries_at_once() -> None:
    counter, calls = drive(settle(job(), RuntimeError("x"), Backoff(jitter=0)),
                           {"change_visibility": [LeaseLimitExceeded("cap"), None]})
    assert counter == "retried"
    assert [c.args[2] for c in calls if c.method == "change_visibility"] == [1.0, 0]


def test_reject_dead_letters_and_a_refused_move_never_deletes() -> None:
    counter, calls = drive(settle(job(), Reject("bad"), Backoff()), {"dead_letter": True})
    assert counter == "rejected" and [c.method for c in calls] == ["update", "dead_letter"]
    assert calls[1].args == ("q", "r", "bad")
    no_dlq = NoDeadLetterQueue("queue 'q' has no dead_letter_queue")
    counter, calls = drive(settle(job(), Reject("bad"), Backoff(jitter=0)), {"dead_letter": no_dlq})
    assert counter == "kept"  # comes back after the backoff, a planned retry
    assert [c.method for c in calls] == ["update", "dead_letter", "change_visibility"]
    assert calls[2].args == ("q", "r", 1.0) and calls[2].kwargs == {"release": True}
    other = InvalidParameter("reason is 2015 bytes: allowed up to 1024 bytes")
    counter, calls = drive(settle(job(), Reject("bad"), Backoff()), {"dead_letter": other})
    assert counter == "kept"  # left leased: its lease brings it back
    assert [c.method for c in calls] == ["update", "dead_letter"]


def test_an_error_record_too_large_is_cut_then_skipped() -> None:
    big = InvalidParameter("too large")
    counter, calls = drive(settle(job(), RuntimeError("x"), Backoff()), {"update": [big, None]})
    assert counter == "retried"
    assert [c.method for c in calls] == ["update", "update", "change_visibility"]
    assert calls[1].kwargs["attributes"]["error"]["traceback"] is None
    counter, calls = drive(settle(job(), RuntimeError("x"), Backoff()), {"update": [big, big]})
    assert counter == "retried"


def test_a_lease_lost_before_settling_is_counted_lost_and_other_errors_leave_it() -> None:
    counter, _ = drive(settle(job(), None, Backoff()), {"delete": StaleReceipt("stale")})
    assert counter == "lost"
    counter, _ = drive(settle(job(), None, Backoff()), {"delete": ConnectionError("down")})
    assert counter == ""  # nothing to count: its lease brings the message back


def test_beat_outcomes() -> None:
    assert drive(beat(job()), {})[0] is Beat.KEPT
    j = job()
    assert drive(beat(j), {"change_visibility": StaleReceipt("s")})[0] is Beat.ENDED
    assert j.cancel_reason == LOST
    j = job()
    assert drive(beat(j), {"change_visibility": LeaseLimitExceeded("m")})[0] is Beat.ENDED
    assert j.cancel_reason == MAX_LEASE
    j = job()
    assert drive(beat(j), {"change_visibility": OSError("down")})[0] is Beat.FAILED
    assert j.cancel_reason is None


def test_release_counts_what_it_released() -> None:
    msgs = [job().message, job().message]
    assert drive(release(msgs), {"change_visibility": [None, OSError("x")]})[0] == 1


def test_backoff_grows_to_its_cap_with_jitter_in_range() -> None:
    b = Backoff(base=1, factor=2, cap=10, jitter=0.5)
    for attempt, full in ((1, 1), (2, 2), (3, 4), (10, 10), (1000, 10)):
        for _ in range(20):
            assert full * 0.5 <= b.delay(attempt) <= full
    assert Backoff(jitter=0).delay(3) == 4.0
    with pytest.raises(ValueError, match="factor"):
        Backoff(factor=0.5)
