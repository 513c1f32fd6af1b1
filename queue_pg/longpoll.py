"""The long poll's decisions, free of I/O: when to look again, and how long to let NOTIFYs pile up.

Both clients wait on the queue's LISTEN channel between receive attempts; this module tells them
how long each wait may be, so the rules are written once and tested without a server
(tests/unit/test_longpoll.py). The clients only run the attempts and read the notifications.
"""

from __future__ import annotations

__all__ = ["FOLLOW_UP", "MAX_HOLD", "RECHECK_INTERVAL", "LongPoll"]

#: How often a long poll re-checks without a NOTIFY: a delayed message coming due or a lapsed
#: lease sends none, so without this a waiter would miss them until its deadline.
RECHECK_INTERVAL = 1.0

#: After a NOTIFY wakes a long poll, one more attempt this long after it even when nothing was
#: found: sends committed right after the notifying one may have skipped theirs (debounce, 2 ms
#: in SQL) and committed after the attempt that the notify caused.
FOLLOW_UP = 0.01

#: Longest a poller lets notifications pile up before it looks again. Any role may NOTIFY a
#: channel it knows: after each NOTIFY that led to nothing the poller waits twice as long
#: (FOLLOW_UP, doubling, up to this) before the next attempt, draining what arrives meanwhile,
#: so a flood costs a few receive transactions a second instead of one per notification.
MAX_HOLD = 0.25


class LongPoll:
    """One long poll: started at ``start`` (monotonic), giving up ``timeout`` seconds later.

    ``woken`` is when the last NOTIFY of this queue reached this client (an earlier poll's),
    for the follow-up look. The shell calls :meth:`fruitless` after each attempt that found
    nothing, waits for a notification at most that long, and on one calls :meth:`notified`
    and drains notifications for as long as it says before the next attempt.
    """

    __slots__ = ("_by_notify", "_deadline", "_misses", "_woken")

    def __init__(self, start: float, timeout: float, woken: float | None = None) -> None:
        self._deadline = start + timeout
        self._woken = woken
        self._by_notify = False  # was the last attempt caused by a NOTIFY?
        self._misses = 0  # NOTIFY-caused attempts in a row that found nothing

    def fruitless(self, now: float) -> float | None:
        """The last attempt found nothing: how long to wait for a NOTIFY before looking again
        anyway, or None when the poll is over."""
        remaining = self._deadline - now
        if remaining <= 0:
            return None
        if self._by_notify:
            self._misses += 1
        self._by_notify = False
        wake = min(remaining, RECHECK_INTERVAL)
        if self._woken is not None:  # once, just after the last NOTIFY
            follow = self._woken + FOLLOW_UP - now
            if follow > 0:
                wake = min(wake, follow)
            self._woken = None
        return wake

    def notified(self, now: float) -> float:
        """A NOTIFY arrived at ``now``: how long to drain further ones before the next attempt
        (0 for the first, so a real send is picked up at once)."""
        self._by_notify = True
        self._woken = now
        if self._misses == 0:
            return 0.0
        hold = min(FOLLOW_UP * 2.0 ** (self._misses - 1), MAX_HOLD)
        return max(0.0, min(hold, self._deadline - now))
