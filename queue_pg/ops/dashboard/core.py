"""The dashboard as one function of a request: pages, the JSON the pages poll, and two actions.

Framework-free on purpose, so the same object serves ``queue-pg dashboard`` and mounts in any
WSGI or ASGI application (:mod:`queue_pg.ops.dashboard.adapters`). Every figure comes from a SQL
function or view through :class:`queue_pg.Client`; nothing here computes one. What a request
may see and do is what the role of the DSN may (the SQL functions check) or, in login mode,
what the role a browser logged in as may (:mod:`queue_pg.ops.dashboard.sessions`); the actions are
refused unless the dashboard was made with ``actions=True`` and the request carries the token
or, in login mode, its session's CSRF token.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from typing import Any

from queue_pg._ops import Call
from queue_pg.client import Client
from queue_pg.decode import Columns, Rows
from queue_pg.errors import (
    AccessDenied,
    InvalidParameter,
    QueueError,
    QueueNotFound,
    SchemaMissing,
    ServerUnavailable,
)
from queue_pg.ops.dashboard.http import MAX_BODY, Request, Response
from queue_pg.ops.dashboard.sessions import Refused, Session, Sessions
from queue_pg.ops.display import fmt_json

__all__ = ["Dashboard", "Request", "Response"]

PAGES = {"": "overview", "queue": "queue", "in-flight": "in-flight",
         "dead-letters": "dead-letters", "advice": "advice", "workers": "workers",
         "tasks": "tasks"}
STATIC = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}
STATUS = {QueueNotFound: 404, AccessDenied: 403, InvalidParameter: 400, ServerUnavailable: 503,
          SchemaMissing: 503}
COOKIE = "queue_pg_session"
#: A message body on the page: its JSON text, cut to this many characters.
BODY_CHARS = 2000
#: How many messages api/messages shows at most.
MAX_MESSAGES = 50


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _json(status: int, value: Any, *, no_store: bool = True) -> Response:
    body = json.dumps(_plain(value), separators=(",", ":")).encode()
    headers = (("Cache-Control", "no-store"),) if no_store else ()
    return Response(status, "application/json", body, headers)


def _asset(name: str) -> bytes:
    return resources.files("queue_pg.ops.dashboard").joinpath("static").joinpath(name).read_bytes()


class Dashboard:
    """The web dashboard of the queues the role of ``source`` may see.

    ``source`` is a DSN or a :class:`queue_pg.Client` (kept open by its owner). A non-empty
    ``token`` guards every read and action (``Authorization: Bearer <token>``; the HTML shells,
    static assets and ``api/config`` hold no data and stay public); with ``actions`` it enables
    purge and redrive. ``refresh`` is how often the pages poll, in seconds.

    ``login=True`` (``source`` a DSN): a browser logs in with a PostgreSQL role and password,
    and its requests run as that role on a client of its session (at most ``max_sessions``,
    closed after ``idle_timeout`` idle seconds); the DSN's own role reads nothing. Actions then
    need the session's CSRF token instead of ``token`` (and ``token`` too, if one is given).
    A login the server let in without checking a password is refused, and so are superusers
    and the queue_pg schema's owner unless ``allow_superuser``.
    Call :meth:`handle`, or mount :attr:`wsgi` / :attr:`asgi`.
    """

    def __init__(self, source: str | Client, *, actions: bool = False, token: str | None = None,
                 refresh: float = 5.0, login: bool = False, max_sessions: int = 32,
                 idle_timeout: float = 900.0, allow_superuser: bool = False) -> None:
        if actions and not token and not login:
            raise ValueError("actions need a token: pass token= (a long random string)")
        self.sessions: Sessions | None = None
        if login:
            if not isinstance(source, str):
                raise ValueError("login mode needs a DSN: each session connects as its role")
            self.sessions = Sessions(source, max_sessions=max_sessions,
                                     idle_timeout=idle_timeout, allow_superuser=allow_superuser)
        self._owns_client = isinstance(source, str) and not login
        # No sweep of its own: a dashboard only reads; the applications' clients take samples.
        self.client: Client | None = (
            None if login else Client(source, sweep_interval=None) if isinstance(source, str)
            else source)
        self.actions = actions
        self._token = (token or "").encode()
        self.refresh = refresh
        Get = Callable[[Request, Client], Any]
        self._get: dict[str, Get] = {
            "api/overview": lambda r, c: _overview(c),
            "api/history": lambda r, c: c.queue_history(
                r.query.get("queue") or None, seconds=_seconds(r.query.get("seconds"))),
            # the pages show the first rows: `limit` (default 501, at most 10,000) keeps the
            # JSON of a poll small however many messages are leased or dead
            "api/in-flight": lambda r, c: c.in_flight(
                r.query.get("queue") or None, limit=_limit(r.query.get("limit"))),
            "api/dead-letters": lambda r, c: c.dead_letters(
                r.query.get("queue") or None, limit=_limit(r.query.get("limit"))),
            "api/advice": lambda r, c: c.timeout_advice(r.query.get("queue") or None),
            # 24 hours, 7 days: finished messages per hour, from the history rollups
            "api/throughput": lambda r, c: c._run(_throughput(
                r.query.get("queue") or None, _seconds(r.query.get("seconds"))), None),
            "api/tasks": lambda r, c: _tasks(c),
            "api/workers": lambda r, c: c._run(_table("select * from queue_pg.workers()", {}),
                                               None),
            # hung work: runs past twice their type's lease on 'per_type' queues (no bodies)
            "api/stuck": lambda r, c: c.stuck_jobs(r.query.get("queue") or None),
            # bodies on request, for a role that may receive from the queue (peek checks)
            "api/messages": lambda r, c: _messages(c, r.query.get("queue"),
                                                   r.query.get("limit")),
        }
        self._post: dict[str, Callable[[dict[str, Any], Client], Any]] = {
            "api/purge": _purge, "api/redrive": _redrive,
        }

    def close(self) -> None:
        """Closes the client when the dashboard made it, and every session's."""
        if self._owns_client and self.client is not None:
            self.client.close()
        if self.sessions is not None:
            self.sessions.close()

    # --- requests ---------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        """The response to one request; never raises for what a request can cause."""
        try:
            return self._route(request)
        except Refused as exc:
            answer: dict[str, Any] = {"error": str(exc)}
            if self.sessions is not None and exc.status == 401 and not exc.token:
                answer["login"] = True  # the page shows its login form
            if exc.token:
                answer["token"] = True  # the page asks for the token
            return _json(exc.status, answer)
        except QueueError as exc:
            status = next((s for cls, s in STATUS.items() if isinstance(exc, cls)), 500)
            return _json(status, {"error": str(exc), "type": type(exc).__name__})

    def _route(self, r: Request) -> Response:
        if r.method in ("GET", "HEAD"):
            if r.path in PAGES:
                page = _asset("page.html").replace(b"{{page}}", PAGES[r.path].encode())
                return Response(200, "text/html; charset=utf-8", page,
                                (("Cache-Control", "no-store"), ("X-Frame-Options", "DENY")))
            name = r.path.removeprefix("static/")
            if r.path.startswith("static/") and name in STATIC:
                return Response(200, STATIC[name], _asset(name),
                                (("Cache-Control", "max-age=300"),))
            if r.path == "api/config":
                return _json(200, self._config(r))
            if r.path in self._get:
                self._check_token(r)
                with self._client(r) as client:
                    return _json(200, self._get[r.path](r, client))
            raise Refused(404, f"no page {r.path!r}")
        if r.method == "POST" and self.sessions is not None:
            if r.path == "api/login":
                return self._login(r, self.sessions)
            if r.path == "api/logout":
                session = self._session(r)
                self._check_csrf(r, session)
                self.sessions.logout(session)
                return _json(200, {"user": None}).with_headers(_cookie(r, "", 0))
        if r.method == "POST" and r.path in self._post:
            body = self._authorized(r)
            with self._client(r) as client:
                return _json(200, self._post[r.path](body, client))
        raise Refused(405 if r.path in self._post or r.path in self._get else 404,
                      f"{r.method} {r.path!r} is not served")

    def _config(self, r: Request) -> dict[str, Any]:
        config: dict[str, Any] = {"actions": self.actions, "refresh": self.refresh,
                                  "token": bool(self._token)}
        if self.sessions is not None:
            session = self.sessions.get(_session_id(r))
            config.update(login=True, user=session.user if session else None,
                          csrf=session.csrf if session else None)
        return config

    def _session(self, r: Request) -> Session:
        assert self.sessions is not None
        session = self.sessions.get(_session_id(r))
        if session is None:
            raise Refused(401, "log in first (or again: the session ended)")
        return session

    @contextmanager
    def _client(self, r: Request) -> Iterator[Client]:
        """The client a request runs on: its session's in login mode (kept open until the
        request ends, whatever a logout does meanwhile), else the dashboard's."""
        if self.sessions is None:
            assert self.client is not None
            yield self.client
            return
        with self.sessions.using(_session_id(r)) as session:
            if session is None:
                raise Refused(401, "log in first (or again: the session ended)")
            yield session.client

    def _login(self, r: Request, sessions: Sessions) -> Response:
        body = _json_body(r)
        role, password = body.get("role"), body.get("password")
        if not isinstance(role, str) or not isinstance(password, str):
            raise Refused(400, "login takes a JSON object with role and password (strings)")
        session = sessions.login(role, password, r.address)
        return _json(200, {"user": session.user, "csrf": session.csrf}).with_headers(
            _cookie(r, session.id, None))

    def _check_csrf(self, r: Request, session: Session) -> None:
        given = r.headers.get("x-csrf-token", "").encode()
        if not hmac.compare_digest(given, session.csrf.encode()):
            raise Refused(403, "wrong or missing CSRF token (X-CSRF-Token)")

    def _authorized(self, r: Request) -> dict[str, Any]:
        """The JSON body of an action, once the dashboard allows actions and the token (or, in
        login mode, the session's CSRF token) is right. Either travels in a header a
        cross-site form cannot set, so it also stops CSRF."""
        if not self.actions:
            raise Refused(403, "this dashboard is read-only: start it with --allow-actions "
                               "and a token to purge or redrive")
        if self.sessions is not None:
            self._check_csrf(r, self._session(r))
        self._check_token(r)  # actions without a login always have a token (see __init__)
        return _json_body(r)

    def _check_token(self, r: Request) -> None:
        """Refuses a request without the token, when one is set."""
        if not self._token:
            return
        given = r.headers.get("authorization", "").removeprefix("Bearer ").encode()
        if not hmac.compare_digest(given, self._token):
            raise Refused(401, "wrong or missing token (Authorization: Bearer <token>)",
                          token=True)

    # --- mounting ---------------------------------------------------------------------------

    @property
    def wsgi(self) -> Any:
        """A WSGI application (Flask: werkzeug's DispatcherMiddleware; Django: wsgi.py)."""
        from queue_pg.ops.dashboard.adapters import WsgiApp

        return WsgiApp(self)

    @property
    def asgi(self) -> Any:
        """An ASGI application (Starlette's Mount, Django's asgi.py, any ASGI server)."""
        from queue_pg.ops.dashboard.adapters import AsgiApp

        return AsgiApp(self)


def _json_body(r: Request) -> dict[str, Any]:
    """The JSON object a POST carries: a cross-site form can send no such body unasked."""
    if not r.headers.get("content-type", "").startswith("application/json"):
        raise Refused(415, "a POST takes a JSON body (Content-Type: application/json)")
    if len(r.body) > MAX_BODY:
        raise Refused(413, f"a body of at most {MAX_BODY} bytes")
    try:
        body = json.loads(r.body)
    except ValueError as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Refused(400, "the body is a JSON object")
    return body


def _session_id(r: Request) -> str | None:
    cookies: SimpleCookie = SimpleCookie()
    try:
        cookies.load(r.headers.get("cookie", ""))
    except CookieError:
        return None
    morsel = cookies.get(COOKIE)
    return morsel.value if morsel else None


def _cookie(r: Request, value: str, max_age: int | None) -> tuple[tuple[str, str], ...]:
    """The session cookie: scripts cannot read it, other sites' requests do not carry it."""
    parts = [f"{COOKIE}={value}", f"Path={r.root}/", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if r.https:
        parts.append("Secure")
    return (("Set-Cookie", "; ".join(parts)),)


def _overview(client: Client) -> dict[str, Any]:
    stats = client.queue_health()
    # list_queues names every queue to any member of the group roles; show the settings of
    # the queues queue_stats shows this role (those it has a grant on), no others
    seen = {s.queue for s in stats}
    return {
        "stats": stats,
        "replica": client.replica_status().line(),  # how stale a hot standby's figures are
        "queues": [{"name": q.name, "dead_letter_queue": q.dead_letter_queue,
                    "visibility_timeout": q.visibility_timeout}
                   for q in client.list_queues() if q.name in seen],
    }


def _tasks(client: Client) -> list[dict[str, Any]]:
    """Per queue and type (a task's name) over the last 24 hours: the processing times of
    ``processing_times`` beside the retries and dead-lettered share of ``timeout_advice``."""
    advice = {(a.queue, a.type): a for a in client.timeout_advice() if a.scope == "type"}
    tasks = []
    for p in client.processing_times():
        a = advice.get((p.queue, p.type))
        if p.scope != "type" or a is None:
            continue
        tasks.append({"queue": p.queue, "type": p.type, "finished": p.messages,
                      "p50": p.p50, "p95": p.p95, "p99": p.p99, "max": p.max,
                      "redeliveries": a.redeliveries, "dead_letter_rate": a.dead_letter_rate,
                      "expiry_rate": a.expiry_rate})
    return tasks


def _table(query: str, params: dict[str, Any]) -> Call[list[dict[str, Any]]]:
    """A query of a SQL function the pages show as it is: rows as objects by column name."""
    def decode(columns: Columns, rows: Rows) -> list[dict[str, Any]]:
        return [dict(zip(columns, row, strict=True)) for row in rows]

    return Call(query, params, decode)


def _throughput(queue: str | None, seconds: float) -> Call[list[dict[str, Any]]]:
    return _table("select * from queue_pg.queue_throughput(%(queue)s, %(seconds)s)",
                  {"queue": queue, "seconds": seconds})


def _messages(client: Client, queue: str | None, limit: str | None) -> list[dict[str, Any]]:
    """The first visible messages of ``queue`` with their bodies as JSON text, each cut to
    BODY_CHARS (``truncated`` says so): peek refuses a role that may not receive from it."""
    if not queue:
        raise Refused(400, "queue = the name of a queue is required")
    n = min(_limit(limit or "10"), MAX_MESSAGES)
    shown = []
    for m in client.peek(queue, n):
        body = fmt_json(m.body)
        shown.append({"id": m.id, "queue": m.queue, "receive_count": m.receive_count,
                      "enqueued_at": m.enqueued_at, "attributes": fmt_json(m.attributes or {}),
                      "body": body[:BODY_CHARS], "truncated": len(body) > BODY_CHARS})
    return shown


def _purge(body: dict[str, Any], client: Client) -> dict[str, Any]:
    queue = _text(body, "queue")
    if body.get("confirm") != queue:
        raise Refused(400, "purge needs confirm: the name of the queue, typed again")
    return {"queue": queue, "purged": client.purge(queue)}


def _redrive(body: dict[str, Any], client: Client) -> dict[str, Any]:
    dlq = _text(body, "dlq")
    if body.get("confirm") != dlq:
        raise Refused(400, "redrive needs confirm: the name of the dead-letter queue again")
    return {"dlq": dlq, "redriven": client.redrive(dlq)}


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise Refused(400, f"{key} must be the name of a queue")
    return value


def _seconds(raw: str | None) -> float:
    """The window of history asked for; its range is the SQL function's to check."""
    if raw is None or raw == "":
        return 3600.0
    try:
        return float(raw)
    except ValueError:
        raise Refused(400, f"seconds = {raw!r} is invalid: allowed a number") from None


def _limit(raw: str | None) -> int:
    """How many rows a list returns (a page shows one fewer, and says there are more)."""
    if raw is None or raw == "":
        return 501
    if not raw.isdigit() or not 1 <= int(raw) <= 10_000:
        raise Refused(400, f"limit = {raw!r} is invalid: allowed 1 to 10000")
    return int(raw)
