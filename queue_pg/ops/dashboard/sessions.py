"""Login mode: each browser session is a PostgreSQL role of its own, on a small client of its own.

A login connects with the server's DSN, user and password replaced, so the SQL functions' grant
checks decide what the session sees and does. Whether the password is right is the server's
to say (pg_hba.conf): a login answers the same for an unknown role and a wrong password, and
failures are counted per client address to slow guessing. A connection that used no password
(``trust`` or ``peer`` in pg_hba.conf would let any password in) is refused, and so are
superusers and members of the queue_pg schema's owner unless the dashboard allows them:
a browser holds its session's rights for as long as it stays open. Passwords are never logged
or kept outside the session's own client.
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
NO_PASSWORD = ("login refused: the server let this role in without checking a password (trust "
               "or peer in pg_hba.conf); log in where PostgreSQL asks for one")
PRIVILEGED = ("login refused: a superuser or the owner of the queue_pg schema may log in only "
              "to a dashboard started with --allow-superuser")
#: current_user, and whether it is a superuser or a member of the queue_pg schema's owner
WHO = ("SELECT current_user, r.rolsuper OR coalesce(pg_has_role(current_user, n.nspowner,"
       " 'MEMBER'), false) FROM pg_roles r LEFT JOIN pg_namespace n ON n.nspname = 'queue_pg'"
       " WHERE r.rolname = current_user")
MAX_NAME = 63  # PostgreSQL's NAMEDATALEN - 1
MAX_ADDRESSES = 4096  # addresses whose failures are remembered at once
MAX_PENDING = 4  # logins connecting at once: a flood of guesses cannot flood the server
MAX_PER_USER = 4  # sessions one role keeps at once: its next login ends its oldest


class Refused(Exception):
    """A request the dashboard answers with ``status`` and the message, before any SQL."""

    def __init__(self, status: int, message: str, *, token: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.token = token  # the page then asks for the token


@dataclass
class Session:
    """One logged-in browser: its role, its client, the CSRF token its actions carry."""

    user: str
    client: Client
    id: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    last_used: float = field(default_factory=monotonic)
    started: float = field(default_factory=monotonic)
    users: int = 0  # requests running on the client now: it is closed when the last one ends
    ended: bool = False


class Sessions:
    """The sessions of one dashboard, at most ``max_sessions``, each closed after
    ``idle_timeout`` seconds unused (by a daemon thread, or the next request); at most
    ``max_failures`` failed logins per client address in ``failure_window`` seconds.

    A login never waits for a free place: past ``max_per_user`` sessions of its role it ends
    that role's oldest, and when every place is taken it ends the least recently used session
    of the role holding the most. So one role's logins cannot lock other roles out."""

    def __init__(self, dsn: str, *, max_sessions: int = 32, idle_timeout: float = 900.0,
                 max_failures: int = 5, failure_window: float = 60.0,
                 allow_superuser: bool = False, max_per_user: int = MAX_PER_USER) -> None:
        self._dsn = dsn
        self.max_per_user = max_per_user
        self.allow_superuser = allow_superuser
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
        """A new session connected as ``role``; Refused (401, 403, 429 or 503) otherwise."""
        self._check_rate(address)
        if not role or len(role) > MAX_NAME or "\x00" in role + password or not password:
            # an empty password would let libpq fall back to a password file or PGPASSWORD
            self._failed(address)
        self._reap()
        if not self._pending.acquire(blocking=False):
            raise Refused(503, "other logins are being checked: try again in a moment")
        conninfo = make_conninfo(self._dsn, user=role, password=password)
        try:
            with psycopg.connect(conninfo, connect_timeout=10) as conn:
                checked = conn.pgconn.used_password
                row = conn.execute(WHO).fetchone()
            assert row is not None
            if not checked:
                self._failed(address, NO_PASSWORD)
            if row[1] and not self.allow_superuser:
                self._failed(address, PRIVILEGED, 403)
            client = Client(conninfo, sweep_interval=None, min_size=1, max_size=2)
        except (psycopg.Error, QueueError):  # all failures answer alike; nothing is logged
            self._failed(address)
        finally:
            self._pending.release()
        session = Session(str(row[0]), client)
        with self._lock:
            ended = self._make_room(session.user)
            self._sessions[session.id] = session
        self._end(ended)
        return session

    def _make_room(self, user: str) -> list[Session]:
        """Takes out the sessions a new one of ``user`` replaces (the lock held)."""
        ended: list[Session] = []
        mine = sorted((s for s in self._sessions.values() if s.user == user),
                      key=lambda s: s.started)
        while len(mine) >= max(self.max_per_user, 1):
            ended.append(self._sessions.pop(mine.pop(0).id))
        while self._sessions and len(self._sessions) >= max(self.max_sessions, 1):
            held: dict[str, int] = {}
            for s in self._sessions.values():
                held[s.user] = held.get(s.user, 0) + 1
            most = max(held.values())
            victim = min((s for s in self._sessions.values() if held[s.user] == most),
                         key=lambda s: s.last_used)
            ended.append(self._sessions.pop(victim.id))
        return ended

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

    def _failed(self, address: str, why: str = FAILED, status: int = 401) -> NoReturn:
        """Counts a failure of ``address``, then refuses the login (by default as any failure
        is refused)."""
        now = monotonic()
        with self._lock:
            times = self._recent(address, now)
            times.append(now)
            self._failures.pop(address, None)  # re-inserted last: the dict runs oldest first
            self._failures[address] = times
            while len(self._failures) > MAX_ADDRESSES:
                del self._failures[next(iter(self._failures))]
        raise Refused(status, why)
