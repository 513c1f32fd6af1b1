"""What the client reads about a pooler in front of PostgreSQL, and how a worker reports a
registration that failed (no I/O: the parts that decide)."""

from __future__ import annotations

import logging

import pytest

from queue_pg.dsn import pooler_of, split_option
from queue_pg.errors import InvalidParameter
from queue_pg.jobs.pulse import Pulse


@pytest.mark.parametrize(("dsn", "rest", "value"), [
    ("postgresql://u@h:6432/db?queue_pg_pooler=transaction", "postgresql://u@h:6432/db", "transaction"),
    ("postgresql://u@h/db?sslmode=disable&queue_pg_pooler=session&application_name=x",
     "postgresql://u@h/db?sslmode=disable&application_name=x", "session"),
    ("postgresql://u@h/db?queue_pg_pooler=none&sslmode=disable", "postgresql://u@h/db?sslmode=disable", "none"),
    ("host=h port=6432 queue_pg_pooler=transaction dbname=d", "host=h port=6432  dbname=d", "transaction"),
    ("queue_pg_pooler = 'transaction' dbname=d", "dbname=d", "transaction"),
    ("postgresql://u@h/db", "postgresql://u@h/db", None),
])
def test_the_pooler_option_is_taken_out_of_the_dsn(dsn: str, rest: str, value: str | None) -> None:
    assert split_option(dsn, "queue_pg_pooler") == (rest, value)


def test_the_argument_wins_then_the_dsn_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_PG_POOLER", "session")
    assert pooler_of(None, "dbname=d") == ("dbname=d", "session")
    assert pooler_of(None, "dbname=d queue_pg_pooler=transaction") == ("dbname=d", "transaction")
    assert pooler_of("none", "dbname=d queue_pg_pooler=transaction") == ("dbname=d", "none")
    monkeypatch.delenv("QUEUE_PG_POOLER")
    assert pooler_of(None, None) == (None, "none")
    with pytest.raises(InvalidParameter, match="pooler = 'statement'"):
        pooler_of("statement", None)


def test_a_registration_that_fails_is_said_loudly_and_flagged(caplog: pytest.LogCaptureFixture) -> None:
    pulse = Pulse()
    with caplog.at_level(logging.INFO, "queue_pg.worker"):
        pulse.registered(None)
    assert not pulse.active and pulse.failures == 1
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and "crash detection is OFF" in record.getMessage()
    pulse.registered(7)
    assert pulse.active and pulse.consumer == 7
    caplog.clear()
    with caplog.at_level(logging.INFO, "queue_pg.worker"):
        pulse.beat(False, 0)  # reaped while it lives: said, and registered again
    assert not pulse.active and pulse.adopt() is None
    assert caplog.records[0].levelno == logging.ERROR


@pytest.mark.parametrize("cls", ["InvalidSqlStatementName", "DuplicatePreparedStatement"])
def test_a_prepared_statement_a_pooler_mixed_up_is_no_outage(cls: str) -> None:
    """'prepared statement "_pg3_0" does not exist' (26000) or 'already exists' (42P05) is a
    misconfigured pooler, reported as itself: never ServerUnavailable, never an outage."""
    import psycopg

    from queue_pg import ServerUnavailable, outage
    from queue_pg.errors import translate

    exc = getattr(psycopg.errors, cls)('prepared statement "_pg3_0" does not exist')
    assert not outage.is_connection_error(exc)
    with pytest.raises(psycopg.Error) as raised:
        translate(exc)
    assert not isinstance(raised.value, ServerUnavailable)
