"""The dashboard's login mode over real HTTP against real PostgreSQL: each session runs as the
role it logged in as, so the SQL functions' grants decide what it sees and does.

Checking the password is the server's (pg_hba.conf), as for any client, and the dashboard
refuses a login the server let in without one: so these tests run on a server of this module's
own (Debian's initdb) that wants scram-sha-256 passwords, each on a fresh migrated database.
The shared test server trusts local connections: there, every login is refused.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as psql

from queue_pg import AccessDenied, Client
from queue_pg.install import migrate
from queue_pg.ops.dashboard import Dashboard, Request, make_http_server
from queue_pg.ops.dashboard.adapters import WsgiApp
from queue_pg.ops.dashboard.sessions import FAILED, NO_PASSWORD, PRIVILEGED, Sessions
from tests.conftest import new_database
from tests.procs import ended
from tests.test_access import CONSUMER, MakeRole, Role, make_role  # noqa: F401

PASSWORD = "s3cret-Pa55word"


class Browser:
    """One browser on a dashboard served on a real port: keeps the session cookie and the CSRF
    token its login gave, as the page does."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.cookie = ""
        self.csrf = ""

    def call(self, path: str, body: Any = None, *, csrf: bool = True,
             content_type: str = "application/json") -> tuple[int, Any, dict[str, str]]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data,
                                         method="GET" if data is None else "POST")
        if data is not None:
            request.add_header("Content-Type", content_type)
        if self.cookie:
            request.add_header("Cookie", self.cookie)
        if csrf and self.csrf:
            request.add_header("X-CSRF-Token", self.csrf)
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                raw, status, headers = r.read(), r.status, dict(r.headers)
        except urllib.error.HTTPError as e:
            raw, status, headers = e.read(), e.code, dict(e.headers)
        if "Set-Cookie" in headers:
            self.cookie = headers["Set-Cookie"].split(";")[0]
        is_json = headers.get("Content-Type") == "application/json"
        return status, json.loads(raw) if is_json else raw, headers

    def login(self, role: str, password: str = PASSWORD) -> tuple[int, Any]:
        status, answer, _ = self.call("api/login", {"role": role, "password": password})
        if status == 200:
            self.csrf = answer["csrf"]
        return status, answer


@pytest.fixture
def served() -> Iterator[Any]:
    """``served(board)``: the board on a real port; the servers and boards end with the test."""
    made: list[tuple[Any, Dashboard]] = []

    def serve(board: Dashboard) -> str:
        import threading

        server = make_http_server(board, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        made.append((server, board))
        return f"http://127.0.0.1:{server.server_port}/"

    yield serve
    for server, board in made:
        server.shutdown()
        server.server_close()
        board.close()


@pytest.fixture
def roles(client: Client, clean: str, request: pytest.FixtureRequest) -> dict[str, Role]:
    """Queues jobs (dead letters in jobs-dlq) and secret; LOGIN roles with a password: viewer
    (receive on jobs), stranger (no grant), and a NOLOGIN role."""
    new_role: MakeRole = request.getfixturevalue("make_role")
    client.create_queue("jobs-dlq")
    client.create_queue("jobs", dead_letter_queue="jobs-dlq", max_receive_count=1)
    client.create_queue("secret")
    client.send_batch("jobs", [{"n": i} for i in range(3)])
    made = {"viewer": new_role("viewer", CONSUMER), "stranger": new_role("stranger", CONSUMER),
            "nologin": new_role("nologin", CONSUMER, login=False)}
    with psycopg.connect(clean, autocommit=True) as c:
        for role in made.values():
            c.execute(psql.SQL("ALTER ROLE {} PASSWORD {}").format(
                psql.Identifier(role.name), psql.Literal(PASSWORD)))
    client.grant("jobs", made["viewer"].name, "receive")
    return made


def test_each_session_runs_as_its_role(
    client: Client, clean: str, roles: dict[str, Role], served: Any
) -> None:
    url = served(Dashboard(clean, login=True, actions=True))
    viewer, stranger, anonymous = Browser(url), Browser(url), Browser(url)

    for path in ("api/overview", "api/history", "api/in-flight", "api/dead-letters",
                 "api/advice"):
        status, answer, _ = anonymous.call(path)
        assert (status, answer["login"]) == (401, True), path  # nothing is read before a login
    assert anonymous.call("api/config")[1] == {
        "actions": True, "refresh": 5.0, "login": True, "token": False, "user": None, "csrf": None}
    assert anonymous.call("")[0] == 200  # the page itself: it shows the login form

    status, answer = viewer.login(roles["viewer"].name)
    assert (status, answer["user"]) == (200, roles["viewer"].name)  # SELECT current_user
    assert stranger.login(roles["stranger"].name)[0] == 200
    config = viewer.call("api/config")[1]
    assert (config["user"], config["csrf"]) == (roles["viewer"].name, viewer.csrf)

    # what each sees is what its grants allow; the server DSN's superuser reads nothing here
    assert [s["queue"] for s in viewer.call("api/overview")[1]["stats"]] == ["jobs"]
    assert stranger.call("api/overview")[1]["stats"] == []

    # actions: the session's CSRF token in a header, a JSON body, then the role's grants
    purge = {"queue": "jobs", "confirm": "jobs"}
    status, answer, _ = viewer.call("api/purge", purge, csrf=False)
    assert status == 403 and "CSRF" in answer["error"]
    status, answer, _ = viewer.call("api/purge", purge, content_type="text/plain")
    assert status == 415
    status, answer, _ = viewer.call("api/purge", purge)
    assert status == 403 and answer["type"] == AccessDenied.__name__ and "manage" in answer["error"]
    assert anonymous.call("api/purge", purge)[0] == 401
    assert client.stats("jobs").visible == 3
    client.grant("jobs", roles["viewer"].name, "manage")
    status, answer, _ = viewer.call("api/purge", purge)
    assert (status, answer) == (200, {"queue": "jobs", "purged": 3})

    # logout needs the CSRF token too, then ends the session: its cookie opens nothing
    assert viewer.call("api/logout", {}, csrf=False)[0] == 403
    old_cookie = viewer.cookie
    status, answer, headers = viewer.call("api/logout", {})
    assert status == 200 and "Max-Age=0" in headers["Set-Cookie"]
    viewer.cookie = old_cookie
    status, answer, _ = viewer.call("api/overview")
    assert (status, answer["login"]) == (401, True)
    assert viewer.call("api/config")[1]["user"] is None
    assert stranger.call("api/overview")[0] == 200  # another session is untouched


def test_failed_logins_answer_alike_and_are_limited_per_address(
    clean: str, roles: dict[str, Role], served: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    board = Dashboard(clean, login=True)
    browser = Browser(served(board))
    answers = [browser.login(role, password) for role, password in (
        ("qp_no_such_role", PASSWORD),  # unknown
        (roles["nologin"].name, PASSWORD),  # may not log in
        (roles["viewer"].name, ""),  # no password: libpq would fall back to PGPASSWORD / .pgpass
        ("x" * 64, PASSWORD),  # longer than any role name
    )]
    assert answers == [(401, {"error": FAILED, "login": True})] * 4
    status, answer = browser.login("qp_no_such_role")
    assert status == 401
    # five failures from this address: now even the right role waits, and is not even tried
    status, answer = browser.login(roles["viewer"].name)
    assert status == 429 and "wait" in answer["error"]
    assert len(board.sessions or []) == 0
    # another address is not held up by this one's failures
    answer = board.handle(Request("POST", "api/login", {}, {"content-type": "application/json"},
                                  json.dumps({"role": roles["viewer"].name,
                                              "password": PASSWORD}).encode(),
                                  address="192.0.2.7"))
    assert answer.status == 200
    assert PASSWORD not in caplog.text  # nothing logs a password


def test_sessions_are_bounded_and_end_when_idle(clean: str, roles: dict[str, Role]) -> None:
    sessions = Sessions(clean, max_sessions=1, idle_timeout=3600)
    try:
        first = sessions.login(roles["viewer"].name, PASSWORD, "127.0.0.1")
        assert sessions.get(first.id) is first and sessions.get("forged") is None
        sessions.idle_timeout = 0.01
        time.sleep(0.05)  # longer than the idle timeout, whatever the machine's load
        assert sessions.get(first.id) is None and len(sessions) == 0
        with pytest.raises(psycopg.OperationalError):  # its client is closed
            first.client.list_queues()
        second = sessions.login(roles["stranger"].name, PASSWORD, "127.0.0.1")
        assert second.user == roles["stranger"].name and second.id != first.id
    finally:
        sessions.close()


def test_one_role_cannot_lock_others_out(clean: str, roles: dict[str, Role]) -> None:
    """A role's logins past its cap end its own oldest sessions; a full dashboard ends the
    least recently used session of the role holding the most, never refuses a login."""
    viewer, stranger = roles["viewer"].name, roles["stranger"].name
    sessions = Sessions(clean, max_sessions=6, max_per_user=4, idle_timeout=3600)
    try:
        mine = [sessions.login(viewer, PASSWORD, "127.0.0.1") for _ in range(6)]
        assert len(sessions) == 4
        assert [sessions.get(s.id) is s for s in mine] == [False, False, True, True, True, True]
        with pytest.raises(psycopg.OperationalError):  # the evicted ones' clients are closed
            mine[0].client.list_queues()
        theirs = [sessions.login(stranger, PASSWORD, "127.0.0.1") for _ in range(2)]
        assert len(sessions) == 6  # full: 4 of viewer, 2 of stranger
        for s in (mine[5], mine[2], mine[3]):  # mine[4] is now viewer's least recently used
            sessions.get(s.id)
        third = sessions.login(stranger, PASSWORD, "127.0.0.1")
        assert sessions.get(third.id) is third and len(sessions) == 6
        assert sessions.get(mine[4].id) is None  # taken from the role holding the most
        assert all(sessions.get(s.id) is s for s in theirs)
    finally:
        sessions.close()


def test_a_logout_waits_for_the_requests_running_on_its_client(
    clean: str, roles: dict[str, Role]
) -> None:
    sessions = Sessions(clean)
    try:
        session = sessions.login(roles["viewer"].name, PASSWORD, "127.0.0.1")
        with sessions.using(session.id) as running:  # a request in progress
            assert running is session
            sessions.logout(session)
            assert sessions.get(session.id) is None  # ended for every later request
            with sessions.using(session.id) as later:
                assert later is None
            running.client.list_queues()  # the running request still has its client
        with pytest.raises(psycopg.OperationalError):  # closed once the request ended
            session.client.list_queues()
    finally:
        sessions.close()


def test_idle_sessions_end_without_a_request(clean: str, roles: dict[str, Role]) -> None:
    sessions = Sessions(clean, idle_timeout=0.01)  # its thread looks every second
    try:
        session = sessions.login(roles["viewer"].name, PASSWORD, "127.0.0.1")
        deadline = time.monotonic() + 60  # a bound for a loaded machine, not a measure
        while len(sessions) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(sessions) == 0
        with pytest.raises(psycopg.OperationalError):
            session.client.list_queues()
    finally:
        sessions.close()


def test_the_cookie_is_http_only_strict_and_under_the_mount(
    clean: str, roles: dict[str, Role], client: Client
) -> None:
    board = Dashboard(clean, login=True)
    try:
        body = json.dumps({"role": roles["viewer"].name, "password": PASSWORD}).encode()
        captured: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]]) -> None:
            captured.update(status=status, headers=dict(headers))

        environ = {"REQUEST_METHOD": "POST", "SCRIPT_NAME": "/ops/queues",
                   "PATH_INFO": "/api/login", "CONTENT_TYPE": "application/json",
                   "CONTENT_LENGTH": str(len(body)), "wsgi.input": BytesIO(body),
                   "REMOTE_ADDR": "127.0.0.1", "wsgi.url_scheme": "https"}
        WsgiApp(board)(environ, start_response)
        assert captured["status"].startswith("200")
        cookie = captured["headers"]["Set-Cookie"]
        name, _, rest = cookie.partition("; ")
        assert name.startswith("queue_pg_session=") and len(name) > 40
        assert rest.split("; ") == ["Path=/ops/queues/", "HttpOnly", "SameSite=Strict", "Secure"]
    finally:
        board.close()
    with pytest.raises(ValueError, match="DSN"):
        Dashboard(client, login=True)


def test_login_through_asgi_under_a_prefix(clean: str, roles: dict[str, Role]) -> None:
    from tests.test_dashboard import asgi_call

    board = Dashboard(clean, login=True)
    try:
        body = json.dumps({"role": roles["viewer"].name, "password": PASSWORD}).encode()
        status, headers, answer = asgi_call(board.asgi, "POST", "/api/login", "/ops", body,
                                            [(b"content-type", b"application/json")])
        assert (status, json.loads(answer)["user"]) == (200, roles["viewer"].name)
        cookie = headers[b"Set-Cookie"].decode()
        assert "; Path=/ops/; HttpOnly; SameSite=Strict" in cookie and "Secure" not in cookie
        status, _, answer = asgi_call(board.asgi, "GET", "/api/overview", "/ops", b"",
                                      [(b"cookie", cookie.split(";")[0].encode())])
        assert [s["queue"] for s in json.loads(answer)["stats"]] == ["jobs"]
    finally:
        board.close()


def test_login_mode_stays_read_only_without_allow_actions(
    clean: str, roles: dict[str, Role], served: Any, client: Client
) -> None:
    client.grant("jobs", roles["viewer"].name, "manage")
    browser = Browser(served(Dashboard(clean, login=True)))
    assert browser.login(roles["viewer"].name)[0] == 200
    status, answer, _ = browser.call("api/purge", {"queue": "jobs", "confirm": "jobs"})
    assert status == 403 and "read-only" in answer["error"]
    # with a token as well as a login, actions need both
    url = served(Dashboard(clean, login=True, actions=True, token="t0ken"))
    both = Browser(url)
    assert both.login(roles["viewer"].name)[0] == 200
    status, answer, _ = both.call("api/purge", {"queue": "jobs", "confirm": "jobs"})
    assert status == 401 and "token" in answer["error"]
    assert client.stats("jobs").visible == 3


def _initdb() -> str | None:
    found = shutil.which("initdb") or sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[-1:]
    return found if isinstance(found, str) else (found[0] if found else None)


@pytest.fixture(scope="module")
def scram_server() -> Iterator[str]:
    """A PostgreSQL server of this module's own whose pg_hba.conf wants scram-sha-256
    passwords everywhere; its superuser's DSN (with password)."""
    initdb = _initdb()
    if initdb is None:
        pytest.skip("needs initdb (Debian: postgresql)")
    bindir = os.path.dirname(initdb)
    home = tempfile.mkdtemp(prefix="queue_pg_scram_")
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: run the server as postgres
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(home, "postgres")
    admin = "scram-" + os.urandom(8).hex()
    with open(os.path.join(home, "pw"), "w") as f:
        f.write(admin + "\n")
    if as_user:
        shutil.chown(os.path.join(home, "pw"), "postgres")
    data = os.path.join(home, "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run([*as_user, initdb, "-D", data, "-U", "postgres", "-A", "scram-sha-256",
                    f"--pwfile={home}/pw"], check=True, capture_output=True, timeout=120)
    pg_ctl = [*as_user, os.path.join(bindir, "pg_ctl"), "-D", data]
    subprocess.run([*pg_ctl, "-w", "-l", os.path.join(home, "log"), "-o",
                    f"-p {port} -k {home} -c listen_addresses=127.0.0.1", "start"],
                   check=True, capture_output=True, timeout=120)
    try:
        dsn = f"postgresql://postgres:{admin}@127.0.0.1:{port}/postgres"
        migrate(dsn)
        yield dsn
    finally:
        subprocess.run([*pg_ctl, "-w", "-m", "fast", "stop"], capture_output=True, timeout=120)
        shutil.rmtree(home, ignore_errors=True)


def test_the_server_checks_the_password(scram_server: str, served: Any) -> None:
    role = "qp_scram_viewer"
    with psycopg.connect(scram_server, autocommit=True) as c:
        c.execute(psql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE queue_pg_consumer").format(
            psql.Identifier(role), psql.Literal(PASSWORD)))
    with Client(scram_server, sweep_interval=None) as owner:
        owner.create_queue("jobs")
        owner.create_queue("secret")
        owner.grant("jobs", role, "receive")
    browser = Browser(served(Dashboard(scram_server, login=True)))
    # a wrong password and an unknown role: the same answer (the DSN's own password is not used)
    assert browser.login(role, PASSWORD + "x") == (401, {"error": FAILED, "login": True})
    assert browser.login("qp_no_such_role") == (401, {"error": FAILED, "login": True})
    status, answer = browser.login(role)
    assert (status, answer["user"]) == (200, role)
    assert [s["queue"] for s in browser.call("api/overview")[1]["stats"]] == ["jobs"]


@pytest.fixture(scope="module")
def dsn(scram_server: str) -> Iterator[str]:
    """This module's database (``clean``, ``client`` and ``make_role`` use it): on the server
    that checks passwords, migrated."""
    with new_database(scram_server, "queue_pg_login") as db_dsn:
        migrate(db_dsn)
        yield db_dsn


def test_a_login_the_server_did_not_check_is_refused(server_dsn: str, served: Any) -> None:
    """On a server that trusts local connections any password would open any role, the
    superuser too: the dashboard refuses a connection that used no password."""
    name = "qp_trusted_" + os.urandom(4).hex()
    with psycopg.connect(server_dsn, autocommit=True) as c:
        c.execute(psql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE queue_pg_consumer").format(
            psql.Identifier(name), psql.Literal(PASSWORD)))
    try:
        board = Dashboard(server_dsn, login=True, allow_superuser=True)
        browser = Browser(served(board))
        superuser = str(psycopg.conninfo.conninfo_to_dict(server_dsn).get("user", "postgres"))
        for role, password in ((name, PASSWORD), (name, "anything"), (superuser, "guess")):
            assert browser.login(role, password) == (401, {"error": NO_PASSWORD, "login": True})
        assert len(board.sessions or []) == 0
        assert browser.call("api/overview")[0] == 401
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as c:
            c.execute(psql.SQL("DROP ROLE {}").format(psql.Identifier(name)))


def test_superusers_and_the_schema_owner_need_allow_superuser(
    clean: str, roles: dict[str, Role], served: Any
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(clean)
    admin, admin_password = str(params["user"]), str(params["password"])
    owner_member = "qp_owner_member_" + os.urandom(4).hex()
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(psql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            psql.Identifier(owner_member), psql.Literal(PASSWORD)))
        owner = c.execute("SELECT pg_get_userbyid(nspowner) FROM pg_namespace"
                          " WHERE nspname = 'queue_pg'").fetchone()
        assert owner is not None
        c.execute(psql.SQL("GRANT {} TO {}").format(psql.Identifier(owner[0]),
                                                    psql.Identifier(owner_member)))
    try:
        browser = Browser(served(Dashboard(clean, login=True)))
        refused = (403, {"error": PRIVILEGED})
        assert browser.login(admin, admin_password) == refused  # the superuser
        assert browser.login(owner_member) == refused  # the schema owner's rights
        assert browser.call("api/overview")[0] == 401
        assert browser.login(roles["viewer"].name)[0] == 200  # an ordinary role: as before
        allowed = Browser(served(Dashboard(clean, login=True, allow_superuser=True)))
        status, answer = allowed.login(admin, admin_password)
        assert (status, answer["user"]) == (200, admin)
        assert allowed.login(owner_member)[0] == 200
    finally:
        with psycopg.connect(clean, autocommit=True) as c:
            c.execute(psql.SQL("DROP ROLE {}").format(psql.Identifier(owner_member)))


def test_cli_login_mode_needs_no_token(clean: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "QUEUE_PG_DASHBOARD_TOKEN"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen(
        [sys.executable, "-c", "from queue_pg.ops.cli import main; main()", "--dsn", clean,
         "dashboard", "--login", "--allow-actions", "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with ended(proc):
        assert proc.stdout is not None
        line = ""
        while "dashboard at" not in line:
            line = proc.stdout.readline()
            assert line, "the dashboard ended before it listened"
        assert "actions enabled (a login required)" in line, line
        assert "logs in as a PostgreSQL role" in line
        url = line.split("dashboard at ")[1].split()[0]
        status, answer, _ = Browser(url).call("api/overview")
        assert (status, answer["login"]) == (401, True)
