"""The dashboard in a real headless Chromium, against real PostgreSQL under a running load.

A load process (tests/dashboard_load.py) sends, receives, fails and dead-letters messages the
whole time; ``queue-pg dashboard`` processes serve the pages: one as the owner with actions
enabled, one read-only as a role granted one queue, one with actions as a role that may not
manage, and one in login mode where the browser logs in as a role. Its server checks passwords
(scram-sha-256, a server of the tests' own: the dashboard refuses logins a server let in
without one), and the dashboards with a token want it on every read. Playwright drives Debian's ``chromium`` (``$QUEUE_PG_CHROMIUM`` or the one on PATH)
through ``executable_path``; the tests skip when either is missing. Every page is saved as a
screenshot in ``$QUEUE_PG_SCREENSHOTS`` (default: a temporary folder named in the output).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as psql

from queue_pg import Client
from queue_pg.install import migrate
from tests.conftest import new_database
from tests.test_dashboard_login import scram_server  # noqa: F401

pytestmark = pytest.mark.browser
import tests.browser  # noqa: E402, F401  (skips without playwright and chromium)

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "browser-test-token"
PASSWORD = "browser-test-password"
CLI = [sys.executable, "-c", "from queue_pg.ops.cli import main; main()"]
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
def world(scram_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:  # noqa: F811
    shots = Path(os.environ.get("QUEUE_PG_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots in {shots}")
    procs: list[subprocess.Popen[str]] = []
    roles = [f"qp_dash_{label}_{uuid.uuid4().hex[:6]}" for label in ("viewer", "operator")]
    with new_database(scram_server, "queue_pg_dashboard") as dsn:
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
            w.roles = roles
            for key, flags, role in (("owner", ["--allow-actions"], None),
                                     ("viewer", [], roles[0]), ("operator", ["--allow-actions"], roles[1]),
                                     ("login", ["--login", "--allow-actions"], None)):
                role_dsn = psycopg.conninfo.make_conninfo(**{**params, "user": role, "password": PASSWORD}) if role else dsn  # type: ignore[arg-type]
                # in login mode the session replaces the token: none is given
                token = "" if key == "login" else TOKEN
                proc, w.urls[key] = dashboard(role_dsn, *flags, QUEUE_PG_DASHBOARD_TOKEN=token)
                procs.append(proc)
            yield w
        finally:
            for proc in reversed(procs):
                stop(proc)
            with psycopg.connect(scram_server, autocommit=True) as c:
                for role in roles:
                    c.execute(psql.SQL("DROP ROLE IF EXISTS {}").format(psql.Identifier(role)))



@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page (own storage) holding the token, as if typed once into the page's form;
    fails the test on any script error or console error."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.add_init_script(f"sessionStorage.setItem('queue_pg_token', {TOKEN!r})")
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
    confirm(page, "emails", "email", None)  # a name not quite right: Confirm stays disabled
    shot(world, page, "purge-dialog")
    page.click("#confirm-cancel")
    assert world.count(purged) == 0

    page.click("#purge")
    confirm(page, "emails", "emails", None)
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
    confirm(page, "orders-dlq", "orders-dlq", None)
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
    confirm(page, "orders", "orders", None)
    page.click("#confirm-ok")
    page.wait_for_selector("#status.error")
    assert "permission denied" in page.inner_text("#status")
    assert "manage" in page.inner_text("#status")
    shot(world, page, "operator-refused")


def test_a_token_dashboard_asks_for_it_before_showing_anything(world: World, browser: Any) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 900})  # no token held
    try:
        page = context.new_page()
        page.goto(world.urls["owner"] + "dead-letters")
        page.wait_for_selector("#token-form:not([hidden])")
        assert page.locator("#content").inner_text() == ""
        shot(world, page, "token")
        page.fill("#token-value", "not-the-token")
        page.click("#token-submit")
        page.wait_for_selector("#status.error")
        assert "wrong or missing token" in page.inner_text("#status")
        assert page.locator("#content").inner_text() == ""
        page.fill("#token-value", TOKEN)
        page.click("#token-submit")
        page.wait_for_selector("#dead-letters")
        assert page.locator("#token-form").is_hidden()
    finally:
        context.close()


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


LONG = "W" * 5600  # an unbroken error as long as the one that once widened a page to 5,600 px


def token_context(browser: Any, width: int) -> Any:
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.add_init_script(f"sessionStorage.setItem('queue_pg_token', {TOKEN!r})")
    return context


def fits(page: Any, where: str) -> None:
    """The page is no wider than the window: nothing scrolls sideways but inside a table."""
    width, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width <= inner, f"{where}: {width} px wide in a window of {inner}"


def test_long_unbroken_text_keeps_every_page_within_the_window(world: World, browser: Any) -> None:
    queue, dlq = "L" * 80, "D" * 80  # the longest names SQL allows
    with Client(world.owner_dsn, sweep_interval=None) as owner:
        owner.create_queue(dlq)
        owner.create_queue(queue, dead_letter_queue=dlq, max_receive_count=50)
        for _ in range(3):  # finished work of a long type: a row of advice
            owner.send(queue, {"n": 0}, attributes={"type": LONG})
        for m in owner.receive(queue, max_messages=3):
            owner.delete(queue, m.receipt or "")
        owner.send(queue, {"leased": LONG}, attributes={"type": LONG})
        owner.send(queue, {"dead": LONG}, attributes={"type": LONG})
        for m in owner.receive(queue, max_messages=2, visibility_timeout=600):
            if m.body == {"dead": LONG}:  # the error a worker recorded, and a reason (<= 1 KB)
                owner.update(queue, m.receipt or "", visibility_timeout=None,
                             attributes={"error": {"type": "ValueError", "message": LONG}})
                owner.dead_letter(queue, m.receipt or "", reason=LONG[:1024])
        owner.send(queue, {"visible": LONG}, attributes={"type": LONG})
    worker = psycopg.connect(world.owner_dsn, autocommit=True)  # a registered consumer
    try:
        with Client(world.owner_dsn, sweep_interval=None) as owner:
            me = owner.register_consumer(worker, name="<b>" + "H" * 190 + ":1</b>")
            assert owner.receive(queue, max_messages=1, consumer=me, visibility_timeout=600)
            owner.send(queue, {"visible": LONG}, attributes={"type": LONG})  # for the bodies
        for width in (1400, 900):
            context = token_context(browser, width)
            try:
                page = context.new_page()
                open_page(page, world.urls["owner"] + "workers")
                page.wait_for_selector("#workers tbody tr:has-text('<b>HHH')")
                assert page.locator("#workers b").count() == 0  # its name is text
                fits(page, f"workers at {width}")
                for path in ("", f"queue?name={queue}", f"queue?name={dlq}", "in-flight", "dead-letters",
                             "advice", "tasks"):
                    open_page(page, world.urls["owner"] + path)
                    if path.startswith("queue"):
                        page.wait_for_selector("#queue-name")
                    fits(page, f"{path or 'overview'} at {width}")
                open_page(page, world.urls["owner"] + "dead-letters")
                page.fill("[data-filter='dead-letters']", LONG[:50])
                row = page.locator("#dead-letters tbody tr").filter(has_text=LONG[:150]).first
                row.wait_for()
                assert "\u2026" in row.inner_text()  # cut at 200 characters; the tooltip holds more
                fits(page, f"dead letters filtered at {width}")
                open_page(page, world.urls["owner"] + f"queue?name={queue}")
                page.click("#show-bodies")
                page.wait_for_selector("[data-list='bodies'] pre.body")
                assert "visible" in page.inner_text("[data-list='bodies']")
                fits(page, f"bodies at {width}")
                shot(world, page, f"long-text-{width}")
            finally:
                context.close()
    finally:
        worker.close()


def test_every_list_has_pages_and_a_filter_that_survive_polls(world: World, browser: Any) -> None:
    with Client(world.owner_dsn, sweep_interval=None) as owner:
        owner.create_queue("paged-dlq")
        owner.create_queue("paged", dead_letter_queue="paged-dlq", max_receive_count=50)
        owner.send_batch("paged", [{"n": i} for i in range(120)])
        got = owner.receive("paged", max_messages=120, visibility_timeout=600)
        assert len(got) == 120
        for i, m in enumerate(got):
            owner.dead_letter("paged", m.receipt or "", reason="needle" if i < 3 else f"hay {i}")
    context = token_context(browser, 1400)
    try:
        page = context.new_page()
        open_page(page, world.urls["owner"] + "queue?name=paged-dlq")
        info = page.locator("[data-info='dead-letters']")
        page.wait_for_selector("[data-info='dead-letters']:has-text('1\u201350 of 120')")
        assert page.locator("#dead-letters tbody tr").count() == 50
        page.click("[data-next='dead-letters']")
        assert info.inner_text().startswith("51\u2013100 of 120")
        page.fill("[data-filter='dead-letters']", "needle")
        assert info.inner_text() == "1\u20133 of 3"
        polled(page, 2)  # the page redrew twice: the filter, its focus and its rows stay
        assert info.inner_text() == "1\u20133 of 3"
        assert page.evaluate("document.activeElement.dataset.filter") == "dead-letters"
        assert page.locator("#dead-letters tbody tr").count() == 3
        shot(world, page, "paged")
    finally:
        context.close()


def test_charts_move_from_the_first_seconds(world: World, browser: Any) -> None:
    """A queue sweep has not sampled yet still gets a point per poll (every second here);
    the 24-hour range charts the hourly rollups instead."""
    with Client(world.owner_dsn, sweep_interval=None) as owner:
        owner.create_queue("fresh")
        owner.send_batch("fresh", [1, 2, 3])
    context = token_context(browser, 1400)
    try:
        page = context.new_page()
        open_page(page, world.urls["owner"])
        polled(page, 3)
        points = int(page.get_attribute("[data-chart='depth:fresh']", "data-points") or 0)
        assert points >= 3, points  # sweep samples at most every 15 seconds
        page.select_option("#range", "86400")
        page.wait_for_selector("[data-chart='throughput:orders']")
        assert page.locator("[data-chart^='depth:']").count() == 0
        assert page.input_value("#range") == "86400"
        shot(world, page, "range-24h")
        page.select_option("#range", "3600")
        page.wait_for_selector("[data-chart='depth:orders']")
    finally:
        context.close()
