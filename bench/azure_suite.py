"""Scenario "azure-suite": Azurite's own queue tests (vendored in
``tests/third_party/azurite_queue``, MIT licence) run against ``queue-pg azure``.

The tests are TypeScript on Microsoft's JavaScript SDK (``@azure/storage-queue``), run by mocha
under ts-node from that folder's ``node_modules`` (``npm ci`` there: CI's ``.ci/run`` does it;
nothing is downloaded here). They start an in-process Azurite in their ``before()`` hooks; the
folder's ``src/`` shim makes that a no-op, and this module serves ``queue-pg azure`` (a real
process, authentication on) in its place, on the address the tests use, 127.0.0.1:11001, with an
account key of the emulator's well-known account ``devstoreaccount1`` (its published key, sealed
like any other). The run counts passes and compares the failures with :data:`EXPECTED_FAILURES`,
each there with its reason (docs/azure.md lists them too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg

from bench import Scenario, db
from bench.report import SuiteResult, report_suite

__all__ = ["ACCOUNT", "EXPECTED_FAILURES", "MIN_PASSED", "PORT", "SCENARIO", "SUITE",
           "SuiteMissing", "SuiteResult", "missing", "run_suite", "serve_endpoint"]

SUITE = Path(__file__).resolve().parent.parent / "tests" / "third_party" / "azurite_queue"
#: Where the tests expect the server (hard-coded in each of their files).
PORT = 11001
#: The emulator's well-known account and key (tests/testutils.ts, src/blob/utils/constants.ts).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
#: At least this many of the suite's tests pass.
MIN_PASSED = 67
#: Tests expected to fail, by mocha's full title, and why (docs/azure.md).
EXPECTED_FAILURES: dict[str, str] = {
    "Queue SpecialNaming Should work with non-production secondary url when"
    " http://127.0.0.1:11001/devstoreaccount1-secondary is resolvable":
        "Azurite's test of itself: it creates a queue through the secondary endpoint, which"
        " Azurite treats as the primary; Azure's secondary (read-access geo-redundant) is"
        " read-only, and so is queue_pg's (InsufficientAccountPermissions, 403)",
}


class SuiteMissing(RuntimeError):
    """The suite's node_modules (or node) are not there: ``npm ci`` in SUITE first."""


def missing() -> str | None:
    """Why the suite cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (SUITE / "node_modules" / ".bin" / "mocha").exists():
        return f"{SUITE / 'node_modules'} is missing: run `npm ci --prefix {SUITE}` (.ci/run does)"
    return None



def _port_taken(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def serve_endpoint(dsn: str, port: int = PORT) -> Iterator[str]:
    """``queue-pg azure`` on 127.0.0.1:``port`` for account devstoreaccount1 (its well-known
    key made on ``dsn``, sealed with QUEUE_PG_SECRET_KEY: one is made for the run if unset);
    its URL. The process ends on the way out."""
    from queue_pg import sealing

    if _port_taken(port):
        raise RuntimeError(f"127.0.0.1:{port} is taken: the suite needs that port (it is in"
                           " every test file)")
    env = os.environ.copy()
    if not (env.get(sealing.ENV) or env.get(sealing.ENV_FILE)):
        env[sealing.ENV] = sealing.generate_key()
    ring = sealing.Keyring.required(env)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT queue_pg.azure_revoke_key(%s)", [ACCOUNT])
        me = conn.execute("SELECT current_user").fetchone()
        assert me is not None
        sealing.create_azure_key(conn, str(me[0]), ACCOUNT, ring, secret=ACCOUNT_KEY)
    server = subprocess.Popen(
        [sys.executable, "-c", "from queue_pg.ops.cli import main; main()", "--dsn", dsn, "azure",
         "--port", str(port), "--account", ACCOUNT],
        env=env, stdout=subprocess.DEVNULL, stderr=None)
    try:
        deadline = time.monotonic() + 60
        while not _port_taken(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("queue-pg azure did not start")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/{ACCOUNT}"
    finally:
        server.terminate()
        server.wait(30)


def _titles(report: dict[str, object], key: str) -> list[dict[str, object]]:
    value = report.get(key)
    return value if isinstance(value, list) else []


def run_suite(*, grep: str | None = None, timeout: float = 1200) -> SuiteResult:
    """Run the vendored suite with mocha (JSON reporter) against the server on PORT; each
    test's outcome by its full title."""
    why = missing()
    if why:
        raise SuiteMissing(why)
    argv = [str(SUITE / "node_modules" / ".bin" / "mocha"), "--require", "ts-node/register",
            "--no-timeouts", "--recursive", "--exit", "--reporter", "json",
            "tests/queue/*.test.ts", "tests/queue/**/*.test.ts"]
    if grep:
        argv += ["--grep", grep]
    env = {**os.environ, "TS_NODE_PROJECT": str(SUITE / "tsconfig.json")}
    env.pop("AZURITE_LIVE_TEST_CONNECTION_STRING", None)
    done = subprocess.run(argv, cwd=SUITE, env=env, timeout=timeout, check=False,
                          capture_output=True, text=True)
    start = done.stdout.find("{\n")
    if start < 0:
        raise RuntimeError(f"mocha gave no report (exit {done.returncode}):"
                           f" {done.stderr[-2000:]}")
    report = json.loads(done.stdout[start:])
    result = SuiteResult(EXPECTED_FAILURES)
    pending = {str(t.get("fullTitle", "")) for t in _titles(report, "pending")}
    for test in _titles(report, "tests"):  # in order; a title Azurite uses twice gets " [2]"
        title = str(test.get("fullTitle", ""))
        n = 2
        while title in result.outcomes:
            title, n = f"{test.get('fullTitle', '')} [{n}]", n + 1
        err = test.get("err")
        failed = isinstance(err, dict) and bool(err)
        result.outcomes[title] = ("failed" if failed else
                                  "skipped" if test.get("fullTitle") in pending else "passed")
        if failed and isinstance(err, dict):
            result.messages[title] = str(err.get("message", ""))[:300]
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grep", default=None, help="run only the tests matching (mocha --grep)")


def run(args: argparse.Namespace) -> int:
    log: Callable[[str], None] = (lambda _: None) if args.quiet else print
    why = missing()
    if why:
        log(f"cannot run: {why}")
        return 2
    with db.scratch_database(args.dsn, args.database, keep=args.keep) as dsn:
        db.install(dsn)
        with serve_endpoint(dsn) as url:
            log(f"Azurite's queue tests against queue-pg azure at {url}...")
            result = run_suite(grep=args.grep)
    return report_suite(result, scenario="azure-suite",
                        heading="Azurite's queue tests against queue-pg azure", skipped="skipped",
                        command=args.command_line, out=args.out, log=log,
                        min_passed=MIN_PASSED, partial=bool(args.grep))


SCENARIO = Scenario(
    name="azure-suite",
    help="Azurite's queue tests (JavaScript SDK) against queue-pg azure: passes and known failures",
    add_arguments=add_arguments,
    run=run,
)
