"""Login mode: each browser session is a PostgreSQL role of its own, on a small client of its own.

A login connects with the server's DSN, user and password replaced, so the SQL functions' grant
checks decide what the session sees and does. Whether the password is right is the server's
to say (pg_hba.conf): a login answers the same for an unknown role and a wrong password, and
failures are counted per client address to slow guessing. Passwords are never logged or kept
outside the session's own client.
"""

from __future__ import annotations

import secrets
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from time import monotonic
from typing import NoReturn

import psycopg
from psycopg.conninfo import make_conninfo

from queue_pg.client import Client
from queue_pg.errors import QueueError

__all__ = ["Refused", "Session", "Sessions"]

FAILED = "login failed: wrong role name or password, or the role may not log in"
MAX_NAME = 63  # PostgreSQL's NAMEDATALEN - 1
MAX_ADDRESSES = 4096  # addresses whose failures are remembered at once
MAX_PENDING = 4  # logins connecting at once: a flood of guesses cannot flood the server


class Refused(Exception):
    """A request the dashboard answers with ``status`` and the message, before any SQL."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Session:
    """One logged-in browser: its role, its client, the CSRF token its actions carry."""

    user: str
    client: Client
    id: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    last_used: float = field(default_factory=monotonic)
    users: int = 0  # requests running on the client now: it is closed when the last one ends
    ended: bool = False


class Sessions:
    """The sessions of one dashboard, at most ``max_sessions``, each closed after
    ``idle_timeout`` seconds unused (by a daemon thread, or the next request); at most
    ``max_failures`` failed logins per client address in ``failure_window`` seconds."""

    def __init__(self, dsn: str, *, max_sessions: int = 32, idle_timeout: float = 900.0,
                 max_failures: int = 5, failure_window: float = 60.0) -> None:
        self._dsn = dsn
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.max_failures = max_failures
        self.failure_window = failure_window
        self._sessions: dict[str, Session] = {}
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._pending = threading.BoundedSemaphore(MAX_PENDING)
        self._closed = threading.Event()
        threading.Thread(target=self._reaper, name="queue_pg-dashboard-sessions",
                         daemon=True).start()

    def login(self, role: str, password: str, address: str) -> Session:
        """A new session connected as ``role``; Refused (401, 429 or 503) otherwise."""
        self._check_rate(address)
        if not role or len(role) > MAX_NAME or "\x00" in role + password or not password:
            # an empty password would let libpq fall back to a password file or PGPASSWORD
            self._failed(address)
        self._reap()
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                raise Refused(503, f"{self.max_sessions} sessions are open: try again later")
        if not self._pending.acquire(blocking=False):
            raise Refused(503, "other logins are being checked: try again in a moment")
        conninfo = make_conninfo(self._dsn, user=role, password=password)
        try:
            with psycopg.connect(conninfo, connect_timeout=10) as conn:
                row = conn.execute("SELECT current_user").fetchone()
            client = Client(conninfo, sweep_interval=None, min_size=1, max_size=2)
        except (psycopg.Error, QueueError):  # all failures answer alike; nothing is logged
            self._failed(address)
        finally:
            self._pending.release()
        assert row is not None
        session = Session(str(row[0]), client)
        with self._lock:
            if len(self._sessions) < self.max_sessions:
                self._sessions[session.id] = session
                return session
        client.close()
        raise Refused(503, f"{self.max_sessions} sessions are open: try again later")

    def get(self, session_id: str | None) -> Session | None:
        """The live session of that id, now marked used; None when unknown or idle too long."""
        self._reap()
        with self._lock:
            session = self._sessions.get(session_id or "")
            if session is not None:
                session.last_used = monotonic()
            return session

    @contextmanager
    def using(self, session_id: str | None) -> Iterator[Session | None]:
        """The live session (as ``get``), kept open until the block ends: a logout or the idle
        reaper meanwhile ends it at once but closes its client only after the request."""
        self._reap()
        with self._lock:
            session = self._sessions.get(session_id or "")
            if session is not None:
                session.last_used = monotonic()
                session.users += 1
        try:
            yield session
        finally:
            if session is not None:
                with self._lock:
                    session.users -= 1
                    close = session.ended and session.users == 0
                if close:
                    session.client.close()

    def logout(self, session: Session) -> None:
        """Ends the session; its client closes now, or when the requests running on it end."""
        with self._lock:
            self._sessions.pop(session.id, None)
        self._end([session])

    def _end(self, sessions: list[Session]) -> None:
        with self._lock:
            for session in sessions:
                session.ended = True
            idle = [s for s in sessions if s.users == 0]
        for session in idle:  # closing waits on the pool: outside the lock
            session.client.close()

    def close(self) -> None:
        """Ends every session, and the thread that ends the idle ones."""
        self._closed.set()
        with self._lock:
            ended = list(self._sessions.values())
            self._sessions.clear()
        for session in ended:
            session.client.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _reaper(self) -> None:
        while not self._closed.wait(min(60.0, max(self.idle_timeout / 2, 1.0))):
            self._reap()

    def _reap(self) -> None:
        now = monotonic()
        with self._lock:
            idle = [s for s in self._sessions.values() if now - s.last_used >= self.idle_timeout]
            for session in idle:
                del self._sessions[session.id]
        self._end(idle)

    def _recent(self, address: str, now: float) -> deque[float]:
        times = self._failures.get(address, deque())
        while times and now - times[0] >= self.failure_window:
            times.popleft()
        return times

    def _check_rate(self, address: str) -> None:
        with self._lock:
            if len(self._recent(address, monotonic())) >= self.max_failures:
                raise Refused(429, f"too many failed logins from this address: wait "
                                   f"{self.failure_window:g} seconds")

    def _failed(self, address: str) -> NoReturn:
        """Counts a failure of ``address``, then refuses the login as any failure is refused."""
        now = monotonic()
        with self._lock:
            times = self._recent(address, now)
            times.append(now)
            self._failures.pop(address, None)  # re-inserted last: the dict runs oldest first
            self._failures[address] = times
            while len(self._failures) > MAX_ADDRESSES:
                del self._failures[next(iter(self._failures))]
        raise Refused(401, FAILED)
