"""Scenario "sqs-suite": moto's own SQS tests (vendored in ``tests/third_party/moto_sqs``, Apache
License 2.0) run in their server mode against the SQS endpoint.

The tests sign with fixed fake keys and call two moto-only URLs between tests: a reset
(``POST /moto-api/reset``) and an STS identity lookup (``GetCallerIdentity``, for the account id
they build URLs and ARNs with). :func:`harness_app` answers those two in front of the endpoint,
which runs without authentication (``create_app(dsn, auth=False)``): a test harness, not part of
the product. The run counts passes and compares the failures with :data:`EXPECTED_FAILURES`,
each there with its reason (docs/sqs.md lists them too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from bench import Scenario, db
from bench.report import SuiteResult, report_suite

__all__ = ["EXPECTED_FAILURES", "MIN_PASSED", "SCENARIO", "SuiteResult", "free_port",
           "harness_app", "run_suite", "serve", "serve_harness"]

SUITE = Path(__file__).resolve().parent.parent / "tests" / "third_party" / "moto_sqs"
FILES = ["tests/test_sqs/test_sqs.py", "tests/test_sqs/test_sqs_message_attributes.py",
         "tests/test_sqs/test_sqs_multiaccount.py", "tests/test_sqs/test_sqs_authentication.py"]
#: The account id the endpoint shows in queue URLs and ARNs (queue_pg.sqs.names.ACCOUNT).
ACCOUNT = "000000000000"
#: At least this many of the suite's tests pass.
MIN_PASSED = 134

_SELF = ("moto's test of itself: it expects moto's account id 123456789012, its region in ARNs"
         " or its server's address http://localhost:5000")
_FENCE = ("queue_pg's receipts fence on purpose: a receipt from an earlier receive is refused"
          " (its ChangeMessageVisibility answers ReceiptHandleIsInvalid, its DeleteMessage"
          " deletes nothing), where SQS lets the last-but-one receipt still act")
#: Tests expected to fail, by pytest node id (without the file's folder), and why (docs/sqs.md).
EXPECTED_FAILURES: dict[str, str] = {
    "TestStsAssumeRole::test_list_queues_in_different_account":
        "moto's test of itself: it assumes a role in another account through moto's STS; the"
        " endpoint has one account",
    "test_sqs::test_create_queues_in_multiple_region": _SELF,
    "test_sqs::test_get_queue_attributes": _SELF,
    "test_sqs::test_get_queue_with_prefix": _SELF,
    "test_sqs::test_permissions": _SELF,
    "test_sqs::test_receive_message_using_name_should_return_name_as_url": _SELF,
    "test_sqs::test_batch_change_message_visibility_on_old_message": _FENCE,
    "test_sqs::test_change_message_visibility_on_old_message": _FENCE,
    "test_sqs::test_delete_message_using_old_receipt_handle": _FENCE,
}

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_IDENTITY = (
    '<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
    "<GetCallerIdentityResult><Arn>arn:aws:iam::{account}:user/queue-pg</Arn>"
    "<UserId>QUEUEPGHARNESS</UserId><Account>{account}</Account></GetCallerIdentityResult>"
    "<ResponseMetadata><RequestId>00000000-0000-0000-0000-000000000000</RequestId>"
    "</ResponseMetadata></GetCallerIdentityResponse>"
)


def reset(dsn: str) -> None:
    """Drop every queue (dead-letter links first), as moto's reset forgets every queue."""
    import queue_pg

    with queue_pg.Client(dsn, sweep_interval=None) as client:
        queues = client.list_queues()
        for q in queues:
            if q.dead_letter_queue is not None:
                client.alter_queue(q.name, clear=["dead_letter_queue", "max_receive_count"])
        for q in queues:
            client.drop_queue(q.name, if_exists=True)


def harness_app(dsn: str) -> App:
    """The endpoint without authentication, behind moto's reset and STS identity URLs."""
    from queue_pg.sqs import create_app

    inner = create_app(dsn, auth=False)

    async def answer(send: Send, status: int, body: str, media: str) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", media.encode())]})
        await send({"type": "http.response.body", "body": body.encode()})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                       for k, v in scope.get("headers", [])}
            if path == "/moto-api/reset-auth":
                await answer(send, 200, json.dumps({"PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT":
                                                    float("inf")}), "application/json")
                return
            if path == "/moto-api/reset":
                import asyncio

                await asyncio.to_thread(reset, dsn)
                await answer(send, 200, json.dumps({"status": "ok"}), "application/json")
                return
            if "/sts/aws4_request" in headers.get("authorization", ""):
                await answer(send, 200, _IDENTITY.format(account=ACCOUNT), "text/xml")
                return
        await inner(scope, receive, send)

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """An ASGI app served by uvicorn in a thread on a free loopback port; its URL. The server
    stops on the way out, whatever happened."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def serve_harness(dsn: str) -> contextlib.AbstractContextManager[str]:
    """:func:`harness_app` served (:func:`serve`); its URL."""
    return serve(harness_app(dsn))



def run_suite(url: str, *, select: str | None = None, timeout: float = 1800) -> SuiteResult:
    """Run the vendored suite against ``url`` in a pytest of its own (a subprocess: moto's test
    helpers patch boto3); each test's outcome from its JUnit XML."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AWS_", "MOTO_", "PYTEST_", "QUEUE_PG_"))}
        env.update(TEST_SERVER_MODE="true", TEST_SERVER_MODE_ENDPOINT=url,
                   AWS_DEFAULT_REGION="us-east-1", AWS_ACCESS_KEY_ID="FOOBARKEY",
                   AWS_SECRET_ACCESS_KEY="FOOBARSECRET", PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=str(SUITE))
        argv = [sys.executable, "-m", "pytest", "-c", str(SUITE / "pytest.ini"),
                "--rootdir", str(SUITE), "-p", "no:cacheprovider", "-o", "addopts=", "-q",
                f"--junitxml={junit}", "-p", "no:randomly", *FILES]
        if select:
            argv += ["-k", select]
        subprocess.run(argv, cwd=SUITE, env=env, timeout=timeout, check=False,
                       stdout=subprocess.DEVNULL if not os.environ.get("SQS_SUITE_VERBOSE")
                       else None)
        result = SuiteResult(EXPECTED_FAILURES)
        for case in ET.parse(junit).getroot().iter("testcase"):
            module = case.get("classname", "").rsplit(".", 1)[-1]
            name = f"{module}::{case.get('name')}"
            problem = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
            outcome = "passed" if problem is None else (
                "skipped" if problem.tag == "skipped" else "failed")
            result.outcomes[name] = outcome
            if problem is not None:
                result.messages[name] = (problem.get("message") or "")[:300]
        return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-k", dest="select", default=None,
                        help="run only the tests matching this pytest -k expression")


def run(args: argparse.Namespace) -> int:
    log: Callable[[str], None] = (lambda _: None) if args.quiet else print
    with db.scratch_database(args.dsn, args.database, keep=args.keep) as dsn:
        db.install(dsn)
        with serve_harness(dsn) as url:
            log(f"moto's SQS tests against the endpoint at {url}...")
            result = run_suite(url, select=args.select)
    return report_suite(result, scenario="sqs-suite",
                        heading="moto's SQS tests against the endpoint",
                        skipped="skipped by moto in server mode", command=args.command_line,
                        out=args.out, log=log, min_passed=MIN_PASSED, partial=bool(args.select))


SCENARIO = Scenario(
    name="sqs-suite",
    help="moto's SQS tests against the SQS endpoint: passes and the known failures",
    add_arguments=add_arguments,
    run=run,
)
