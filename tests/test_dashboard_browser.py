"""The dashboard in a real headless Chromium, against real PostgreSQL under a running load.

A load process (tests/dashboard_load.py) sends, receives, fails and dead-letters messages the
whole time; ``queue-pg dashboard`` processes serve the pages: one as the owner with actions
enabled, one read-only as a role granted one queue, one with actions as a role that may not
manage, and one in login mode where the browser logs in as a role. Playwright drives Debian's ``chromium`` (``$QUEUE_PG_CHROMIUM`` or the one on PATH)
through ``executable_path``; the tests skip when either is missing. Every page is saved as a
screenshot in ``$QUEUE_PG_SCREENSHOTS`` (default: a temporary folder named in the output).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import new_database
from psycopg import sql as psql

from queue_pg import Client
from queue_pg.install import migrate

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (the [test] extra)")
CHROMIUM = os.environ.get("QUEUE_PG_CHROMIUM") or shutil.which("chromium")
if CHROMIUM is None or not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"needs Debian's chromium (apt-get install chromium); not at {CHROMIUM}",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "browser-test-token"
PASSWORD = "browser-test-password"
CLI = [sys.executable, "-c", "from queue_pg.cli import main; main()"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def start(args: list[str], expect: str, **env: str) -> tuple[subprocess.Popen[str], str]:
    """A process of ours, once it printed the line `expect` matches (its first group returned)."""
    proc = subprocess.Popen(args, env={**ENV, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            found = re.search(expect, line)
            if found:
                return proc, found.group(1) if found.groups() else line
    except BaseException:  # a timeout while it starts: it is not the caller's to stop yet
        stop(proc)
        raise
    raise AssertionError(f"{args} ended before {expect!r}: {''.join(seen)}")


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def dashboard(dsn: str, *flags: str, **env: str) -> tuple[subprocess.Popen[str], str]:
    return start([*CLI, "--dsn", dsn, "dashboard", "--port", "0", "--refresh", "1", *flags],
                 r"dashboard at (\S+)", **env)


class World:
    def __init__(self, owner_dsn: str, shots: Path) -> None:
        self.owner_dsn = owner_dsn
        self.shots = shots
        self.urls: dict[str, str] = {}
        self.roles: list[str] = []

    def count(self, query: str, *params: object) -> Any:
        with psycopg.connect(self.owner_dsn, autocommit=True) as c:
            row = c.execute(query, params or None).fetchone()
            assert row is not None
            return row[0]


@pytest.fixture(scope="module")
def world(server_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    shots = Path(os.environ.get("QUEUE_PG_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots in {shots}")
    procs: list[subprocess.Popen[str]] = []
    roles = [f"qp_dash_{label}_{uuid.uuid4().hex[:6]}" for label in ("viewer", "operator")]
    with new_database(server_dsn, "queue_pg_dashboard") as dsn:
        migrate(dsn)
        w = World(dsn, shots)
        try:
            load, _ = start([sys.executable, "-m", "tests.dashboard_load", dsn], r"^ready")
            procs.append(load)
            with psycopg.connect(dsn, autocommit=True) as c:
                for role in roles:
                    c.execute(psql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE queue_pg_consumer")
                              .format(psql.Identifier(role), psql.Literal(PASSWORD)))
                # the viewer may receive from orders; the operator too, and see orders-dlq
                for role, queue in ((roles[0], "orders"), (roles[1], "orders"), (roles[1], "orders-dlq")):
                    c.execute("SELECT queue_pg.grant(%s, %s, 'receive')", [queue, role])
            params = psycopg.conninfo.conninfo_to_dict(dsn)
            params.pop("password", None)
            w.roles = roles
            for key, flags, role in (("owner", ["--allow-actions"], None),
                                     ("viewer", [], roles[0]), ("operator", ["--allow-actions"], roles[1]),
                                     ("login", ["--login", "--allow-actions"], None)):
                role_dsn = psycopg.conninfo.make_conninfo(**{**params, "user": role}) if role else dsn  # type: ignore[arg-type]
                # in login mode the session replaces the token: none is given
                token = "" if key == "login" else TOKEN
                proc, w.urls[key] = dashboard(role_dsn, *flags, QUEUE_PG_DASHBOARD_TOKEN=token)
                procs.append(proc)
            yield w
        finally:
            for proc in reversed(procs):
                stop(proc)
            with psycopg.connect(server_dsn, autocommit=True) as c:
                for role in roles:
                    c.execute(psql.SQL("DROP ROLE IF EXISTS {}").format(psql.Identifier(role)))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        # --no-sandbox: Chromium's sandbox refuses to run as root, as CI and containers do
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page (own storage); fails the test on any script error or console error."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    p = context.new_page()
    problems: list[str] = []
    p.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    p.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
    p.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    p.set_default_timeout(30_000)
    yield p
    context.close()
    assert not [x for x in problems if "status of 4" not in x], problems


def polled(page: Any, times: int = 1) -> None:
    """Waits until the page has redrawn from the server `times` more times."""
    now = int(page.get_attribute("body", "data-ticks") or 0)
    page.wait_for_selector(f"body[data-ticks='{now + times}']")


def open_page(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("body[data-ticks]")


def shot(world: World, page: Any, name: str) -> None:
    page.screenshot(path=str(world.shots / f"{name}.png"), full_page=True)


def test_overview_charts_every_queue_live(world: World, page: Any) -> None:
    open_page(page, world.urls["owner"])
    names = page.locator("#queues tbody tr td:first-child").all_inner_texts()
    assert names == ["emails", "emails-dlq", "orders", "orders-dlq"]
    # two charts per queue (messages, per second), drawn by uPlot into canvases
    assert page.locator("[data-chart] canvas").count() == 8
    assert page.locator("[data-chart] .u-legend").first.inner_text().count("visible") == 1
    # the load's first sweep took a sample of every queue: each chart has a point at least
    page.wait_for_selector("[data-chart='depth:orders']:not([data-points='0'])")
    assert page.locator("[data-chart][data-points='0']").count() == 0
    polled(page, 2)  # live: the page polls on its own (every second here)
    assert page.inner_text("#mode") == "actions enabled"
    shot(world, page, "overview")


def test_queue_page_shows_advice_and_in_flight(world: World, page: Any) -> None:
    open_page(page, world.urls["owner"])
    page.click("a.queue-link >> text=orders")
    page.wait_for_selector("#queue-name")
    assert page.inner_text("#queue-name") == "Queue orders"
    assert page.locator("[data-chart] canvas").count() == 2
    # the load leaves a few messages leased for ten minutes; the advice needs finished runs
    page.wait_for_selector("#in-flight tbody tr")
    for kind in ("invoice", "refund"):
        page.wait_for_selector(f"#advice tbody tr:has-text('{kind}')")
    assert page.locator("#advice tbody tr td:nth-child(2)").first.inner_text() == "(all)"
    assert page.locator("#purge").is_visible()
    assert page.locator("[data-redrive]").count() == 0  # orders is no dead-letter queue
    shot(world, page, "queue")


def test_in_flight_dead_letters_and_advice_pages(world: World, page: Any) -> None:
    open_page(page, world.urls["owner"] + "in-flight")
    page.wait_for_selector("#in-flight tbody tr")
    assert set(page.locator("#in-flight tbody td:first-child").all_inner_texts()) <= {"orders", "emails"}
    shot(world, page, "in-flight")

    # text from the database is shown as text: a hostile type and reason stay inert
    hostile = "<img src=x onerror=alert(1)>"
    with Client(world.owner_dsn, sweep_interval=None) as owner:
        # a queue of its own: the load's consumers may take any message of orders first
        owner.create_queue("hostile-dlq")
        owner.create_queue("hostile", dead_letter_queue="hostile-dlq", max_receive_count=5)
        owner.send("hostile", {"n": 1}, attributes={"type": "invoice"})
        [m] = owner.receive("hostile", wait=20)
        owner.update("hostile", m.receipt, attributes={"type": "<b>bold</b>"}, visibility_timeout=None)
        owner.dead_letter("hostile", m.receipt, reason=hostile)
    open_page(page, world.urls["owner"] + "dead-letters")
    page.wait_for_selector(f"#dead-letters tbody tr:has-text('{hostile}')")
    assert "<b>bold</b>" in page.locator(f"#dead-letters tbody tr:has-text('{hostile}')").inner_text()
    assert page.locator("#dead-letters img, #dead-letters b").count() == 0
    # the reason given to dead_letter, or the error the consumer recorded before the last try;
    # the load dead-letters about one message in 100: wait for the page to show its first
    died = re.compile("malformed: missing customer|ValueError: order")
    page.locator("#dead-letters tbody tr").filter(has_text=died).first.wait_for(timeout=90_000)
    assert page.locator("[data-redrive]").count() >= 1
    shot(world, page, "dead-letters")

    open_page(page, world.urls["owner"] + "advice")
    page.wait_for_selector("#advice tbody tr")
    assert {"orders", "emails"} <= set(page.locator("#advice tbody td:first-child").all_inner_texts())
    shot(world, page, "advice")


def confirm(page: Any, name: str, typed: str, token: str | None) -> None:
    """Fills the confirmation dialog: the name typed again, the token if it asks for one."""
    page.wait_for_selector("#confirm[open]")
    assert page.locator("#confirm-ok").is_disabled()
    page.fill("#confirm-input", typed)
    if token is not None:
        page.fill("#token-input", token)
    assert page.locator("#confirm-ok").is_disabled() == (typed != name)


def test_purge_behind_a_confirmation(world: World, page: Any) -> None:
    purged = "SELECT count(*) FROM queue_pg.message_history WHERE queue = 'emails' AND outcome = 'purged'"
    open_page(page, world.urls["owner"] + "queue?name=emails")
    page.click("#purge")
    confirm(page, "emails", "email", TOKEN)  # a name not quite right: Confirm stays disabled
    shot(world, page, "purge-dialog")
    page.click("#confirm-cancel")
    assert world.count(purged) == 0

    page.click("#purge")
    confirm(page, "emails", "emails", "not-the-token")
    page.click("#confirm-ok")
    page.wait_for_selector("#status.error")
    assert "wrong or missing token" in page.inner_text("#status")
    assert world.count(purged) == 0

    page.click("#purge")
    confirm(page, "emails", "emails", TOKEN)
    page.click("#confirm-ok")
    page.wait_for_selector("#status:not(.error):has-text('Purged')")
    n = int(re.search(r"Purged (\d+) messages from emails", page.inner_text("#status")).group(1))  # type: ignore[union-attr]
    assert world.count(purged) == n
    shot(world, page, "purged")


def test_redrive_a_dead_letter_queue(world: World, page: Any) -> None:
    redriven = ("SELECT count(*) FROM queue_pg.messages m JOIN queue_pg.queues q ON q.id = m.queue_id"
                " WHERE q.name = 'orders' AND m.attributes ? 'dead_letter_reason'")
    open_page(page, world.urls["owner"] + "dead-letters")
    page.wait_for_selector("[data-redrive='orders-dlq']")
    page.click("[data-redrive='orders-dlq']")
    confirm(page, "orders-dlq", "orders-dlq", TOKEN)
    page.click("#confirm-ok")
    page.wait_for_selector("#status:has-text('Redrove')")
    n = int(re.search(r"Redrove (\d+) messages from orders-dlq", page.inner_text("#status")).group(1))  # type: ignore[union-attr]
    assert n >= 1
    # what came back still says why it died; the load's consumers may have finished some already
    assert world.count(redriven) <= n
    shot(world, page, "redriven")


def test_a_read_only_role_sees_its_queue_only(world: World, page: Any) -> None:
    open_page(page, world.urls["viewer"])
    assert page.locator("#queues tbody tr td:first-child").all_inner_texts() == ["orders"]
    assert page.inner_text("#mode") == "read-only"
    page.click("a.queue-link >> text=orders")
    page.wait_for_selector("#queue-name")
    assert page.locator("#purge").count() == 0
    assert "Read-only" in page.inner_text("#content")
    shot(world, page, "viewer")
    open_page(page, world.urls["viewer"] + "dead-letters")
    assert page.locator("#dead-letters").inner_text() == "No dead letters."  # no grant on orders-dlq


def test_a_role_without_manage_is_refused_by_sql(world: World, page: Any) -> None:
    open_page(page, world.urls["operator"] + "queue?name=orders")
    page.click("#purge")
    confirm(page, "orders", "orders", TOKEN)
    page.click("#confirm-ok")
    page.wait_for_selector("#status.error")
    assert "permission denied" in page.inner_text("#status")
    assert "manage" in page.inner_text("#status")
    shot(world, page, "operator-refused")


def test_logging_in_as_a_role(world: World, page: Any) -> None:
    viewer = world.roles[0]
    page.goto(world.urls["login"] + "queue?name=orders")
    page.wait_for_selector("#login:not([hidden])")
    assert page.locator("#content").inner_text() == ""  # nothing is shown before a login
    page.fill("#login-role", "qp_nobody_here")
    page.fill("#login-password", PASSWORD)
    shot(world, page, "login")
    page.click("#login-submit")
    page.wait_for_selector("#status.error")
    assert "login failed" in page.inner_text("#status")
    assert page.input_value("#login-password") == ""  # the page keeps no password

    page.fill("#login-role", viewer)
    page.fill("#login-password", PASSWORD)
    page.click("#login-submit")
    page.wait_for_selector("#queue-name")  # the page reloaded, logged in, and drew
    assert page.inner_text("#user") == f"role {viewer}"  # current_user of its session
    assert page.locator("#queues tbody tr td:first-child").all_inner_texts() == ["orders"]
    assert page.locator("#login").is_hidden()
    shot(world, page, "logged-in")
    # the session replaces the token: the dialog asks for none; SQL still wants manage
    page.click("#purge")
    page.wait_for_selector("#confirm[open]")
    assert page.locator("#token-label").is_hidden()
    confirm(page, "orders", "orders", None)
    page.click("#confirm-ok")
    page.wait_for_selector("#status.error")
    assert "manage" in page.inner_text("#status")

    open_page(page, world.urls["login"])
    assert page.locator("#queues tbody tr td:first-child").all_inner_texts() == ["orders"]
    page.click("#logout")
    page.wait_for_selector("#login:not([hidden])")
    assert page.locator("#user").is_hidden()
    assert page.locator("#content").inner_text() == ""
