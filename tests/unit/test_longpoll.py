"""The long poll's decisions, with made-up times (no server, no sleeping)."""

from __future__ import annotations

from queue_pg.longpoll import FOLLOW_UP, MAX_HOLD, RECHECK_INTERVAL, LongPoll


def test_waits_at_most_the_recheck_interval_and_ends_at_the_deadline() -> None:
    poll = LongPoll(start=100.0, timeout=2.5)
    assert poll.fruitless(100.0) == RECHECK_INTERVAL
    wake = poll.fruitless(101.8)
    assert wake is not None and abs(wake - 0.7) < 1e-9
    assert poll.fruitless(102.5) is None


def test_a_first_notify_is_looked_at_at_once_then_followed_up_once() -> None:
    poll = LongPoll(start=0.0, timeout=10.0)
    poll.fruitless(0.0)
    assert poll.notified(0.5) == 0.0  # a real send: picked up at once
    wake = poll.fruitless(0.502)  # one more look just after the NOTIFY, for sends right behind
    assert wake is not None and abs(wake - (FOLLOW_UP - 0.002)) < 1e-9
    assert poll.fruitless(0.51) == RECHECK_INTERVAL

def test_notifies_for_nothing_make_the_poller_hold_longer_up_to_max_hold() -> None:
    poll = LongPoll(start=0.0, timeout=100.0)
    now = 0.0
    assert poll.fruitless(now) == RECHECK_INTERVAL
    holds = []
    for _ in range(10):
        holds.append(poll.notified(now))
        now += holds[-1] + 0.001
        poll.fruitless(now)  # the attempt after the NOTIFY found nothing
    assert holds[0] == 0.0
    assert holds[1:5] == [FOLLOW_UP, 2 * FOLLOW_UP, 4 * FOLLOW_UP, 8 * FOLLOW_UP]
    assert max(holds) == MAX_HOLD and holds[-1] == MAX_HOLD


def test_the_hold_never_passes_the_deadline() -> None:
    poll = LongPoll(start=0.0, timeout=1.0)
    poll.fruitless(0.0)
    poll.notified(0.1)
    poll.fruitless(0.1)
    assert poll.notified(0.995) <= 0.005 + 1e-9


def test_an_earlier_polls_notify_gets_its_follow_up_look() -> None:
    poll = LongPoll(start=5.0, timeout=10.0, woken=4.995)
    assert abs(poll.fruitless(5.0) - (FOLLOW_UP - 0.005)) < 1e-9
    assert poll.fruitless(5.01) == RECHECK_INTERVAL  # once only
