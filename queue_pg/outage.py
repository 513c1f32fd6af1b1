"""Surviving a lost server: detect dead pooled connections, back off, and say so in the logs.

A server restart kills every connection a pool holds. The pools (psycopg_pool) already reconnect
in the background with an exponential backoff; what they lack, and what lives here:

- :func:`looks_dead` / the pools' ``check``: a dead idle connection is noticed when it is lent,
  by a non-blocking look at its socket (a closed or reset socket is readable), and only then a
  round-trip: a live connection costs one ``poll`` system call, not a query;
- :class:`Outage`: one warning when something loses the server, one info line when it works again
  (with how long it took), and the pause before the next try: exponential, capped, with jitter.

An operation that was running when the connection broke is not retried here: whether it
committed is unknown, so the error goes to the caller (the worker retries its receive loop; a
redelivered message is the at-least-once promise, not a loss).
"""

from __future__ import annotations

import logging
import os
import random
import select
import threading
from time import monotonic
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from queue_pg.errors import InvalidParameter

__all__ = ["CappedAttempt", "Outage", "acheck", "check", "client_setting", "is_connection_error",
           "looks_dead"]


def is_connection_error(exc: BaseException) -> bool:
    """True for errors that mean "no server right now", not "this request was wrong"."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate in ("26000", "42P05"):  # a prepared statement a pooler mixed up: not an outage
        return False
    if isinstance(exc, PoolTimeout | psycopg.OperationalError | psycopg.InterfaceError):
        return True
    if not isinstance(sqlstate, str):
        return False
    # 08: connection exception; 57P01-3: admin shutdown, crash shutdown, cannot connect now;
    # 25006: a read-only server (a standby, or one being promoted or demoted in a failover)
    return sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03", "25006")


def looks_dead(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """A cheap test of an idle connection: closed, or its socket has something to read.

    An idle connection's socket is readable only when the server closed it (EOF, RST) or sent
    something unasked (a FATAL before it went away, a notice, a notification); the caller then
    decides with a real round-trip.
    """
    if conn.closed or conn.broken:
        return True
    try:
        ready, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.OperationalError):
        return True
    return bool(ready)


def check(conn: psycopg.Connection[Any]) -> None:
    """``check`` callback of a sync pool: raises when a lent connection is dead."""
    if looks_dead(conn):
        conn.execute("")  # drains notices / notifications, or raises if the server is gone


async def acheck(conn: psycopg.AsyncConnection[Any]) -> None:
    """``check`` callback of an async pool."""
    if looks_dead(conn):
        await conn.execute("")


class Outage:
    """The state of one component's link to the server: up, or down since when.

    ``failed(exc)`` logs a warning at the first lost connection of an outage (later ones at
    debug; other errors are left to the caller, who logs them with a traceback) and
    returns the pause before the next try: ``base * 2**n`` capped at ``cap``, times a random
    factor in ``[1 - jitter, 1 + jitter]`` so that many clients do not all come back at once.
    ``recovered()`` logs at info once, when the first call after an outage works.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        base: float = 0.25,
        cap: float = 30.0,
        jitter: float = 0.5,
    ) -> None:
        self.logger = logger
        self.what = what
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self.failures = 0
        self.since: float | None = None
        self.outages = 0  # how many times the link was lost (for tests and stats)
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.since is not None

    def pause(self) -> float:
        delay: float = min(self.cap, self.base * 2.0 ** max(self.failures - 1, 0))
        return delay * random.uniform(1 - self.jitter, 1 + self.jitter)

    def failed(self, exc: BaseException) -> float:
        with self._lock:
            self.failures += 1
            first = self.since is None
            if first:
                self.since = monotonic()
                self.outages += 1
            pause = self.pause()
        if not is_connection_error(exc):
            pass  # not an outage: the caller logs it with its traceback
        elif first:
            self.logger.warning("%s: lost the database (%s: %s); reconnecting with backoff,"
                                " next try in %.2fs", self.what, type(exc).__name__,
                                _first_line(exc), pause)
        else:
            self.logger.debug("%s: still no database (%s); try %d in %.2fs", self.what,
                              type(exc).__name__, self.failures + 1, pause)
        return pause

    def recovered(self) -> None:
        if self.since is None:  # the common path: nothing to do, no lock
            return
        with self._lock:
            if self.since is None:
                return
            took = monotonic() - self.since
            failures, self.since, self.failures = self.failures, None, 0
        self.logger.info("%s: working again after %.2fs (%d failed tries); reconnected",
                         self.what, took, failures)


class CappedAttempt(AttemptWithBackoff):
    """psycopg_pool's reconnect backoff (1 s, 2 s, 4 s ...) with its pause capped: after an
    outage of any length the pool tries again within ``cap`` seconds of the server's return."""

    def __init__(self, *, timeout: float, cap: float) -> None:
        super().__init__(timeout=timeout)
        self.cap = cap

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, self.cap)


def client_setting(value: float | None, env: str, default: float) -> float:
    """An argument, else the environment variable ``env``, else the default; > 0 or refused."""
    if value is None:
        text = os.environ.get(env, "").strip()
        try:
            value = float(text) if text else default
        except ValueError:
            raise InvalidParameter(f"{env} must be a number of seconds, not {text!r}") from None
    if not 0 < value <= 3600:
        raise InvalidParameter(f"{env.removeprefix('QUEUE_PG_').lower()} must be > 0 and"
                               f" <= 3600 seconds, not {value!r}")
    return float(value)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
