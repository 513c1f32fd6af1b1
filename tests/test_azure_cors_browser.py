"""CORS on the Azure endpoint in a real headless Chromium: a page on one origin calls the
endpoint, on another, with ``fetch`` and an account SAS, as browser code written for Azure
Storage does. The browser's own CORS checks decide; the endpoint's rules are set with the Python
SDK. Playwright drives Debian's ``chromium`` ($QUEUE_PG_CHROMIUM or the one on PATH); the tests
skip when either is missing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest

pytestmark = pytest.mark.browser
import tests.browser  # noqa: E402, F401  (skips without playwright and chromium)

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("azure.storage.queue")

from azure.storage.queue import (  # noqa: E402
    AccountSasPermissions,
    CorsRule,
    QueueServiceClient,
    ResourceTypes,
    generate_account_sas,
)

from bench.sqs_suite import serve  # noqa: E402
from queue_pg.azure import create_app  # noqa: E402
from tests.test_azure import _conn_str, _key  # noqa: E402

#: Put Message then Get Messages, as browser code for Azure does (x-ms-version: a preflight);
#: what the page could read of each response, or the error fetch threw.
SCRIPT = """async ([base, sas]) => {
  const out = {};
  try {
    const put = await fetch(`${base}/jobs/messages?${sas}`, {method: "POST",
      headers: {"x-ms-version": "2019-02-02", "content-type": "application/xml"},
      body: "<QueueMessage><MessageText>from the page</MessageText></QueueMessage>"});
    out.put = put.status;
    out.putRequestId = put.headers.get("x-ms-request-id");
    const got = await fetch(`${base}/jobs/messages?numofmessages=1&${sas}`,
                            {headers: {"x-ms-version": "2019-02-02"}});
    out.get = got.status;
    out.text = await got.text();
  } catch (e) {
    out.error = String(e);
  }
  return out;
}"""



@pytest.fixture(scope="module")
def endpoint(dsn: str) -> Iterator[str]:
    with serve(create_app(dsn)) as url:
        yield url


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<!doctype html><title>app</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page_origin() -> Iterator[str]:
    """The page's origin: http://localhost:PORT, a server of its own on loopback; the endpoint
    is on 127.0.0.1 and another port, so another origin (both loopback: the browser's local
    network rules do not apply)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(30)


def run_page(browser: Any, origin: str, base: str, sas: str) -> dict[str, Any]:
    """SCRIPT run by a page loaded from ``origin``."""
    context = browser.new_context()
    try:
        page = context.new_page()
        console: list[str] = []
        page.on("console", lambda m: console.append(m.text))
        page.goto(f"{origin}/")
        result: dict[str, Any] = page.evaluate(SCRIPT, [base, sas])
        return result | {"console": console}
    finally:
        context.close()


def refused_by_cors(got: dict[str, Any]) -> bool:
    """Whether fetch failed because the preflight was refused (not for any other reason)."""
    return ("error" in got and "put" not in got and any(
        "blocked by CORS policy" in line and "preflight" in line for line in got["console"])
        and not any("address space" in line for line in got["console"]))


def test_a_page_on_another_origin_gets_through_only_under_a_rule(
        browser: Any, endpoint: str, page_origin: str, clean: str) -> None:
    page = page_origin
    with psycopg.connect(clean) as c:
        row = c.execute("SELECT current_user").fetchone()
        assert row is not None
    account, key = _key(clean, str(row[0]))
    svc = QueueServiceClient.from_connection_string(_conn_str(endpoint, account, key),
                                                    retry_total=0)
    jobs = svc.create_queue("jobs")
    sas = generate_account_sas(account, key, ResourceTypes(object=True),
                               AccountSasPermissions(add=True, process=True, read=True),
                               expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    base = f"{endpoint}/{account}"

    # no rules: the browser refuses after the preflight, and the message is never sent
    got = run_page(browser, page, base, sas)
    assert refused_by_cors(got), got
    assert jobs.get_queue_properties().approximate_message_count == 0

    # a rule for another origin: the same
    svc.set_service_properties(cors=[CorsRule(["https://elsewhere.example"], ["GET", "POST"],
                                              allowed_headers=["x-ms-*", "content-type"])])
    got = run_page(browser, page, base, sas)
    assert refused_by_cors(got), got
    assert jobs.get_queue_properties().approximate_message_count == 0

    # the page's origin, nothing exposed: the calls go through, the x-ms-* headers stay hidden
    svc.set_service_properties(cors=[CorsRule([page], ["GET", "POST"],
                                              allowed_headers=["x-ms-*", "content-type"])])
    got = run_page(browser, page, base, sas)
    assert got.get("put") == 201 and got.get("get") == 200, got
    assert "from the page" in got["text"] and got["putRequestId"] is None

    # x-ms-* exposed: the page reads them
    svc.set_service_properties(cors=[CorsRule([page], ["GET", "POST"],
                                              allowed_headers=["x-ms-*", "content-type"],
                                              exposed_headers=["x-ms-*"], max_age_in_seconds=0)])
    got = run_page(browser, page, base, sas)
    assert got.get("put") == 201 and got["putRequestId"], got

    # a method the rule leaves out (POST): refused again
    svc.set_service_properties(cors=[CorsRule([page], ["GET"], allowed_headers=["x-ms-*"])])
    before = jobs.get_queue_properties().approximate_message_count
    got = run_page(browser, page, base, sas)
    assert refused_by_cors(got), got
    assert jobs.get_queue_properties().approximate_message_count == before
