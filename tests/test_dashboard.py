"""The dashboard without a browser: the history SQL gives, what a role sees, the guard on the
actions, and the same app mounted as WSGI (its own server, Flask), ASGI and Django.

Requests go over real HTTP to a real server where the app has one; the pages themselves are
driven in Chromium by tests/test_dashboard_browser.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from queue_pg import AccessDenied, Client, InvalidParameter, QueueNotFound
from queue_pg.ops.dashboard import Dashboard, Request, make_http_server
from queue_pg.ops.dashboard.adapters import WsgiApp
from queue_pg.ops.dashboard.core import BODY_CHARS
from tests.test_access import CONSUMER, PRODUCER, MakeRole, make_role  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "t0ken-for-tests"


def sample_twice(conn: psycopg.Connection[Any], client: Client) -> None:
    """Two samples 20 s apart on this session's clock (queue_pg.time_offset), 30 sends between."""
    conn.execute("SELECT queue_pg.sweep()")
    client.send_batch("jobs", [{"n": i} for i in range(30)])
    for m in client.receive("jobs", max_messages=10):
        client.delete("jobs", m.receipt)
    conn.execute("SET queue_pg.time_offset = '20 seconds'")
    conn.execute("SELECT queue_pg.sweep()")


def test_history_gives_counts_and_rates_per_second(
    client: Client, conn: psycopg.Connection[Any], sql: Any
) -> None:
    client.create_queue("jobs")
    client.create_queue("idle")
    sample_twice(conn, client)
    rows = sql("SELECT queue, at, visible, in_flight, sent_per_s, received_per_s, deleted_per_s"
               " FROM queue_pg.queue_history('jobs') ORDER BY at")
    assert [r[0] for r in rows] == ["jobs", "jobs"]
    assert rows[0][2:4] == (0, 0) and rows[0][4] is None  # no sample before the first
    dt = (rows[1][1] - rows[0][1]).total_seconds()  # 20 s on this clock, and the time the calls took
    assert rows[1][2:] == (20, 0, 30 / dt, 10 / dt, 10 / dt)
    every = sql("SELECT DISTINCT queue FROM queue_pg.queue_history() ORDER BY 1")
    assert every == [("idle",), ("jobs",)]
    # the window: the last `seconds` of the session's clock (now 20 s ahead)
    assert len(sql("SELECT * FROM queue_pg.queue_history('jobs', 10)")) == 1
    for seconds in (0, 7201, float("nan")):
        with pytest.raises(InvalidParameter, match="seconds"):
            sql("SELECT * FROM queue_pg.queue_history(NULL, %s)", seconds)
    with pytest.raises(QueueNotFound):
        sql("SELECT * FROM queue_pg.queue_history('nope')")


def test_a_role_sees_the_history_of_its_queues_only(
    client: Client, conn: psycopg.Connection[Any], request: pytest.FixtureRequest
) -> None:
    new_role: MakeRole = request.getfixturevalue("make_role")
    client.create_queue("jobs")
    client.create_queue("secret")
    sample_twice(conn, client)
    role = new_role("viewer", CONSUMER)
    client.grant("jobs", role.name, "receive")
    nobody = new_role("nobody")  # in no group role: may not even call it
    with nobody.connect() as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
        c.execute("SELECT * FROM queue_pg.queue_history()")
    with role.client() as c:
        assert {s.queue for s in c.queue_history()} == {"jobs"}
        assert c.queue_history("secret") == []
        board = Dashboard(c)
        answer = json.loads(board.handle(Request("GET", "api/overview")).body)
        assert [s["queue"] for s in answer["stats"]] == ["jobs"]


# --- the actions' guard, through the app's own HTTP server ------------------------------------


class Http:
    """A dashboard on a real port (queue_pg.ops.dashboard.make_http_server), serving in a thread."""

    def __init__(self, board: Dashboard) -> None:
        self.board = board
        self.server = make_http_server(board, "127.0.0.1", 0)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def call(self, path: str, body: Any = None, token: str | None = None,
             content_type: str = "application/json") -> tuple[int, Any, dict[str, str]]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method="POST" if data else "GET")
        if data is not None:
            request.add_header("Content-Type", content_type)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                raw, status, headers = r.read(), r.status, dict(r.headers)
        except urllib.error.HTTPError as e:
            raw, status, headers = e.read(), e.code, dict(e.headers)
        is_json = headers.get("Content-Type") == "application/json"
        return status, json.loads(raw) if is_json else raw, headers


@pytest.fixture
def http() -> Iterator[Any]:
    """``http(board)``: the board on a real port, stopped after the test."""
    made: list[Http] = []

    def make(board: Dashboard) -> Http:
        made.append(Http(board))
        return made[-1]

    yield make
    for h in made:
        h.close()


@pytest.fixture
def queues(client: Client) -> Client:
    client.create_queue("jobs-dlq")
    client.create_queue("jobs", dead_letter_queue="jobs-dlq", max_receive_count=1)
    client.send_batch("jobs", [{"n": i} for i in range(5)])
    for m in client.receive("jobs", max_messages=2):
        client.dead_letter("jobs", m.receipt, reason="bad input")
    return client


def test_read_only_unless_actions_and_token(queues: Client, http: Any) -> None:
    with pytest.raises(ValueError, match="token"):
        Dashboard(queues, actions=True)
    ro = http(Dashboard(queues))
    status, answer, _ = ro.call("api/purge", {"queue": "jobs", "confirm": "jobs"}, token=TOKEN)
    assert status == 403 and "read-only" in answer["error"]
    status, answer, _ = ro.call("api/config")
    assert answer == {"actions": False, "refresh": 5.0, "token": False}

    rw = http(Dashboard(queues, actions=True, token=TOKEN))
    for token in (None, "", "wrong", TOKEN + "x"):
        status, answer, _ = rw.call("api/purge", {"queue": "jobs", "confirm": "jobs"}, token=token)
        assert status == 401, token
    status, answer, _ = rw.call("api/purge", {"queue": "jobs", "confirm": "jobs"}, token=TOKEN,
                                content_type="text/plain")
    assert status == 415  # a cross-site form cannot send JSON (nor the header)
    status, answer, _ = rw.call("api/purge", {"queue": "jobs"}, token=TOKEN)
    assert status == 400 and "confirm" in answer["error"]
    status, answer, _ = rw.call("api/purge", {"queue": "nope", "confirm": "nope"}, token=TOKEN)
    assert status == 404 and answer["type"] == "QueueNotFound"
    assert queues.stats("jobs").visible == 3  # nothing refused touched a message

    status, answer, _ = rw.call("api/redrive", {"dlq": "jobs-dlq", "confirm": "jobs-dlq"}, token=TOKEN)
    assert (status, answer) == (200, {"dlq": "jobs-dlq", "redriven": 2})
    status, answer, _ = rw.call("api/purge", {"queue": "jobs", "confirm": "jobs"}, token=TOKEN)
    assert (status, answer) == (200, {"queue": "jobs", "purged": 5})
    assert queues.stats("jobs").visible == 0


READS = ("api/overview", "api/history", "api/in-flight", "api/dead-letters", "api/advice",
         "api/throughput?seconds=86400", "api/messages?queue=jobs", "api/workers",
         "api/tasks", "api/stuck")


@pytest.mark.parametrize("actions", [False, True])
def test_a_token_guards_every_read(queues: Client, http: Any, actions: bool) -> None:
    """With a token set, no data leaves without it: overview, history, messages in flight, dead
    letters (their reasons and last errors), advice. The HTML shells, the static assets and
    api/config hold no data and stay public, so the page can ask for the token."""
    web = http(Dashboard(queues, actions=actions, token=TOKEN))
    assert {r.split("?")[0] for r in READS} == set(web.board._get)  # every data route is here
    for path in READS:
        for token in (None, "", "wrong", TOKEN + "x"):
            status, answer, _ = web.call(path, token=token)
            assert (status, answer.get("token")) == (401, True), (path, token)
            assert "bad input" not in json.dumps(answer) and '"n"' not in json.dumps(answer)
        status, answer, _ = web.call(path, token=TOKEN)
        assert status == 200, path
    status, answer, _ = web.call("api/dead-letters", token=TOKEN)
    assert {d["reason"] for d in answer} == {"bad input"}
    assert web.call("api/config")[1] == {"actions": actions, "refresh": 5.0, "token": True}
    for page in ("", "dead-letters", "static/dashboard.js"):
        status, body, _ = web.call(page)
        assert status == 200 and b"bad input" not in body
    # no token set: the role of the DSN decides alone (keep it on 127.0.0.1, or use a token)
    assert http(Dashboard(queues)).call("api/dead-letters")[0] == 200


def test_bodies_on_request_for_a_role_that_may_receive(
    queues: Client, request: pytest.FixtureRequest, http: Any
) -> None:
    """api/messages shows the first visible messages' bodies as JSON text (cut at BODY_CHARS,
    hostile characters escaped); peek decides who may: a role with receive on the queue, not a
    role that may only send there."""
    new_role: MakeRole = request.getfixturevalue("make_role")
    reader, sender = new_role("reader", CONSUMER), new_role("sender", PRODUCER)
    queues.create_queue("bodies")
    queues.send("bodies", {"text": "\x9b" + "z" * 5000})
    queues.grant("bodies", reader.name, "receive")
    queues.grant("bodies", sender.name, "send")
    with reader.client() as c:
        status, answer, _ = http(Dashboard(c)).call("api/messages?queue=bodies")
    assert status == 200 and len(answer) == 1
    assert answer[0]["truncated"] is True and len(answer[0]["body"]) == BODY_CHARS
    assert answer[0]["body"].startswith('{"text": "\\u009bzzz')  # the C1 character escaped
    with sender.client() as c:
        status, answer, _ = http(Dashboard(c)).call("api/messages?queue=bodies")
    assert status == 403  # a producer may not peek at all; a consumer only where it receives
    web = http(Dashboard(queues))
    assert web.call("api/messages")[0] == 400


def test_workers_page_lists_live_and_lost_consumers_a_role_may_see(
    queues: Client, clean: str, request: pytest.FixtureRequest, http: Any
) -> None:
    new_role: MakeRole = request.getfixturevalue("make_role")
    watcher, stranger = new_role("watcher", CONSUMER), new_role("stranger", CONSUMER)
    queues.grant("jobs", watcher.name, "receive")
    name = "host\x1b]0;x\x07:42"  # the worker's own text: the page shows it as text
    with psycopg.connect(clean, autocommit=True) as session:
        me = queues.register_consumer(session, name=name)
        assert me is not None
        assert len(queues.receive("jobs", max_messages=2, consumer=me, visibility_timeout=600)) == 2
        with watcher.client() as c:
            status, answer, _ = http(Dashboard(c)).call("api/workers")
        assert status == 200
        assert [(w["id"], w["name"], w["queues"], w["running"], w["alive"]) for w in answer] == [
            (me, name, ["jobs"], 2, True)]
        with stranger.client() as c:  # no grant on jobs: not its worker to see
            assert http(Dashboard(c)).call("api/workers")[1] == []
    deadline = time.monotonic() + 30  # the session ended: its lock is free at once
    while time.monotonic() < deadline:
        [w] = http(Dashboard(queues)).call("api/workers")[1]
        if not w["alive"]:
            break
        time.sleep(0.1)
    assert w["alive"] is False


def test_a_lock_of_the_same_id_in_another_database_keeps_no_worker_alive(
    queues: Client, clean: str, scratch: str, http: Any
) -> None:
    """pg_locks is the whole server's: another database's session holding the advisory lock of
    this consumer's id (another install, on the same server) is not this worker's session."""
    with psycopg.connect(clean, autocommit=True) as session:
        me = queues.register_consumer(session, name="gone")
        assert me is not None
        space = session.execute("SELECT queue_pg._consumer_space()").fetchone()[0]  # type: ignore[index]
    with psycopg.connect(scratch, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s, %s)", [space, me])
        deadline = time.monotonic() + 30  # the session ended: its lock is free once it is gone
        while time.monotonic() < deadline:
            [w] = http(Dashboard(queues)).call("api/workers")[1]
            if not w["alive"]:
                break
            time.sleep(0.1)
        assert (w["id"], w["alive"]) == (me, False)


def test_tasks_page_reads_times_retries_and_failures_per_type(
    queues: Client, conn: psycopg.Connection, http: Any
) -> None:
    from tests.test_advice import add_history

    add_history(conn, "jobs", [0.5] * 10, type="resize")
    add_history(conn, "jobs", [2.0] * 2, type="resize", outcome="dead_lettered", receive_count=3)
    status, answer, _ = http(Dashboard(queues)).call("api/tasks")
    assert status == 200
    [task] = [t for t in answer if t["type"] == "resize"]
    assert (task["queue"], task["finished"], task["redeliveries"]) == ("jobs", 12, 4)
    assert task["dead_letter_rate"] == pytest.approx(2 / 12)
    assert task["p50"] == pytest.approx(0.5, rel=0.05)


def test_throughput_over_a_day_from_the_rollups(queues: Client, http: Any) -> None:
    web = http(Dashboard(queues))
    status, answer, _ = web.call("api/throughput?seconds=604800&queue=jobs")
    assert status == 200 and isinstance(answer, list)
    status, answer, _ = web.call("api/throughput?seconds=9999999")
    assert status == 400 and "seconds" in answer["error"]


def test_a_role_does_what_its_grants_allow(
    queues: Client, request: pytest.FixtureRequest, http: Any
) -> None:
    new_role: MakeRole = request.getfixturevalue("make_role")
    role = new_role("operator", CONSUMER)
    queues.grant("jobs", role.name, "receive")
    with role.client() as c:
        web = http(Dashboard(c, actions=True, token=TOKEN))
        status, answer, _ = web.call("api/purge", {"queue": "jobs", "confirm": "jobs"}, token=TOKEN)
        assert status == 403 and answer["type"] == AccessDenied.__name__
        assert "manage" in answer["error"]
        status, answer, _ = web.call("api/dead-letters", token=TOKEN)
        assert answer == []  # no grant on jobs-dlq: its dead letters are not this role's to see
        queues.grant("jobs", role.name, "manage")
        status, answer, _ = web.call("api/purge", {"queue": "jobs", "confirm": "jobs"}, token=TOKEN)
        assert (status, answer["purged"]) == (200, 3)


def test_pages_assets_and_headers(queues: Client, http: Any) -> None:
    web = http(Dashboard(queues))
    for page in ("", "queue?name=jobs", "in-flight", "dead-letters", "advice", "workers", "tasks"):
        status, body, headers = web.call(page)
        assert status == 200 and b"static/dashboard.js" in body
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert headers["X-Frame-Options"] == "DENY"
    for asset in ("dashboard.js", "dashboard.css", "uPlot.iife.min.js", "uPlot.min.css"):
        status, body, _ = web.call("static/" + asset)
        assert status == 200 and len(body) > 100
    assert web.call("static/uPlot.LICENSE")[0] == 404  # only the listed files, no path walking
    assert web.call("static/../core.py")[0] == 404
    assert web.call("nope")[0] == 404
    status, answer, _ = web.call("api/history?seconds=abc")
    assert status == 400 and "seconds" in answer["error"]
    status, answer, _ = web.call("api/history?seconds=99999")
    assert status == 400 and answer["type"] == "InvalidParameter"
    status, answer, _ = web.call("api/dead-letters?queue=jobs-dlq")
    assert [(d["reason"], d["source_queue"]) for d in answer] == [("bad input", "jobs")] * 2
    assert len(web.call("api/dead-letters?limit=1")[1]) == 1
    for bad in ("0", "10001", "-1", "x"):
        status, answer, _ = web.call("api/in-flight?limit=" + bad)
        assert status == 400 and "limit" in answer["error"]


def test_nothing_is_fetched_from_elsewhere() -> None:
    static = ROOT / "queue_pg" / "ops" / "dashboard" / "static"
    for name in ("page.html", "dashboard.js", "dashboard.css"):
        text = (static / name).read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name
    assert (static / "uPlot.LICENSE").read_text().startswith("The MIT License")


# --- mounted in other applications -------------------------------------------------------------


def wsgi_get(app: Any, path: str, script_name: str = "") -> tuple[str, bytes]:
    seen: list[str] = []
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "SCRIPT_NAME": script_name,
               "QUERY_STRING": "", "wsgi.input": None}
    body = b"".join(app(environ, lambda status, headers: seen.append(status)))
    return seen[0], body


def test_mounted_in_flask_under_a_prefix(queues: Client) -> None:
    from flask import Flask
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    app = Flask(__name__)
    app.wsgi_app = DispatcherMiddleware(app.wsgi_app, {"/ops/queues": Dashboard(queues).wsgi})  # type: ignore[method-assign]
    web = app.test_client()
    answer = web.get("/ops/queues")
    assert answer.status_code == 308 and answer.headers["Location"].endswith("/ops/queues/")
    assert b"static/uPlot.iife.min.js" in web.get("/ops/queues/").data
    stats = web.get("/ops/queues/api/overview").get_json()["stats"]
    assert [s["queue"] for s in stats] == ["jobs", "jobs-dlq"]
    assert wsgi_get(WsgiApp(Dashboard(queues)), "/advice")[0].startswith("200")


def asgi_call(app: Any, method: str, path: str, root_path: str = "", body: bytes = b"",
              headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": root_path + path, "root_path": root_path,
             "query_string": b"", "headers": headers or []}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], dict(sent[0]["headers"]), sent[1]["body"]


def test_asgi_lifespan_completes() -> None:
    sent: list[str] = []
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

    async def receive() -> dict[str, Any]:
        return inbox.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"])

    app = Dashboard.__new__(Dashboard).asgi  # no client needed: lifespan touches no database
    asyncio.run(app({"type": "lifespan"}, receive, send))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_mounted_as_asgi(queues: Client) -> None:
    app = Dashboard(queues, actions=True, token=TOKEN).asgi
    status, headers, _ = asgi_call(app, "GET", "", root_path="/queues")
    assert status == 308 and headers[b"Location"] == b"/queues/"
    status, _, body = asgi_call(app, "GET", "/api/dead-letters", root_path="/queues")
    assert status == 401 and json.loads(body)["token"] is True
    status, _, body = asgi_call(app, "GET", "/api/dead-letters", root_path="/queues",
                                headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    assert status == 200 and len(json.loads(body)) == 2
    status, _, body = asgi_call(app, "POST", "/api/redrive", body=b'{"dlq": "jobs-dlq", "confirm": "jobs-dlq"}',
                                headers=[(b"content-type", b"application/json"),
                                         (b"authorization", f"Bearer {TOKEN}".encode())])
    assert (status, json.loads(body)) == (200, {"dlq": "jobs-dlq", "redriven": 2})


DJANGO_SCRIPT = """
import json, sys
import django
from django.conf import settings
settings.configure(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"], SECRET_KEY="x",
                   MIDDLEWARE=["django.middleware.common.CommonMiddleware",
                               "django.middleware.csrf.CsrfViewMiddleware"])
django.setup()
from django.urls import include, path
from django.test import Client as Web
from queue_pg.contrib.django.dashboard import dashboard_urls
from queue_pg.ops.dashboard import Dashboard
board = Dashboard(sys.argv[1], actions=True, token="tok")
urlpatterns = [path("queues/", include(dashboard_urls(board)))]
web = Web(enforce_csrf_checks=True)
print(json.dumps({
    "root": web.get("/queues").status_code,
    "page": web.get("/queues/").status_code,
    "anonymous": web.get("/queues/api/overview").status_code,
    "stats": [s["queue"] for s in web.get("/queues/api/overview",
                                          headers={"Authorization": "Bearer tok"}).json()["stats"]],
    "purge": web.post("/queues/api/purge", {"queue": "jobs", "confirm": "jobs"},
                      content_type="application/json", headers={"Authorization": "Bearer tok"}).json(),
}))
"""


def test_mounted_in_django(queues: Client, clean: str) -> None:
    # a process of its own: Django's settings are global, and tests/test_django.py has others
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", DJANGO_SCRIPT, clean], env=env, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert json.loads(out) == {"root": 301, "page": 200, "anonymous": 401,
                               "stats": ["jobs", "jobs-dlq"],
                               "purge": {"queue": "jobs", "purged": 3}}


def test_cli_refuses_actions_without_a_token(clean: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "QUEUE_PG_DASHBOARD_TOKEN"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", "from queue_pg.ops.cli import main; main()", "--dsn", clean,
         "dashboard", "--allow-actions", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "needs a token" in done.stderr
