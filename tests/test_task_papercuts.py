"""What a first run meets with tasks, each in one clear line with a hint; and Celery's
``delay`` / ``apply_async`` beside ``enqueue``."""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import queue_pg
from queue_pg.jobs.tasks import Registry
from queue_pg.ops import cli
from tests.test_access import MakeRole, make_role  # noqa: F401


def test_an_argument_that_is_not_json_is_named_with_the_task(client: queue_pg.Client) -> None:
    reg = Registry()

    @queue_pg.task(queue="j", name="greet", create=True, registry=reg)
    def greet(user: Any, when: Any = None) -> None: ...

    with pytest.raises(TypeError, match=r"task greet: argument 'when' = datetime\.datetime\(.*"
                       r" is not JSON .*isoformat"):
        greet.send([1], {"when": datetime.now(timezone.utc)}, client=client)
    with pytest.raises(TypeError, match=r"task greet: argument 1 = nan is not JSON"):
        greet.send([math.nan], client=client)
    with psycopg.connect(client_dsn(client)) as conn:  # the caller's transaction stays usable
        with pytest.raises(TypeError, match="argument 1 = inf"):
            greet.enqueue(math.inf, conn=conn)
        greet.enqueue(1, conn=conn)
    assert client.stats("j").visible == 1


def client_dsn(client: queue_pg.Client) -> str:
    dsn = client._dsn
    assert dsn is not None
    return dsn


def test_an_unparsable_dsn_is_one_line_with_a_hint() -> None:
    result = CliRunner().invoke(cli.main, ["--dsn", "foo bar", "list"])
    assert result.exit_code == 1
    assert "error: the DSN cannot be parsed" in result.output
    assert "hint: give a URL" in result.output and "Traceback" not in result.output
    with pytest.raises(queue_pg.InvalidParameter, match="DSN cannot be parsed"):
        queue_pg.Client("foo bar")


def test_a_role_in_no_group_gets_a_hint_not_a_bare_permission_error(
    client: queue_pg.Client, clean: str, make_role: MakeRole,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    client.create_queue("p")
    nobody = make_role("nobody")
    result = CliRunner().invoke(cli.main, ["--dsn", clean, "grant", "p", nobody.name, "send"])
    assert result.exit_code == 0, result.output
    assert "is in none of queue_pg_producer, queue_pg_admin" in result.output
    assert f"GRANT queue_pg_producer TO {nobody.name}" in result.output
    help_text = CliRunner().invoke(cli.main, ["grant", "--help"]).output
    assert "QUEUE ROLE PRIVILEGE" in help_text and "Give ROLE the PRIVILEGE" in help_text
    caplog.set_level(logging.WARNING, "queue_pg.client")
    with (queue_pg.Client(nobody.dsn, sweep_interval=0.01) as c,
          pytest.raises(queue_pg.AccessDenied, match="hint: the connecting role is not in the group role")):
        c.receive("p")  # sweeps first (a failure it logs), then the receive is refused
    sweeps = [r for r in caplog.records if "periodic sweep failed" in r.getMessage()]
    assert all("hint: the connecting role is not in the group role" in r.getMessage() for r in sweeps)
    assert sweeps and all(not r.exc_info for r in sweeps)  # one line, no traceback


def test_delay_and_apply_async(client: queue_pg.Client) -> None:
    reg = Registry()

    @queue_pg.task(queue="c", name="add", create=True, registry=reg)
    def add(x: int, y: int = 0) -> int:
        return x + y

    add.registry.set_client(client)
    a = add.delay(1, y=2)
    b = add.apply_async((3,), {"y": 4}, countdown=60)
    c = add.apply_async((5,), eta=datetime.now(timezone.utc) + timedelta(minutes=5),
                        expires=600, queue="c")
    d = add.apply_async((6,), expires=datetime.now(timezone.utc) + timedelta(seconds=30))
    with pytest.raises(ValueError, match="runs from queue 'c' only"):
        add.apply_async((7,), queue="other")
    with pytest.raises(ValueError, match="aware datetime"):
        add.apply_async((7,), eta=datetime.now())
    with pytest.raises(ValueError, match="already passed"):
        add.apply_async((7,), expires=datetime.now(timezone.utc) - timedelta(seconds=1))
    visible = {m.id: m for m in client.peek("c", 10)}
    assert set(visible) == {a, d}
    assert visible[a].body == {"task": "add", "args": [1], "kwargs": {"y": 2}}
    assert client.stats("c").delayed == 2 and {b, c}.isdisjoint(visible)
    with psycopg.connect(client_dsn(client)) as conn:
        rows = dict(conn.execute(
            "SELECT id, extract(epoch FROM expires_at - enqueued_at) FROM queue_pg.messages"
            " WHERE id = ANY (%s)", [[c, d]]).fetchall())
    assert 590 < rows[c] < 610 and 20 < rows[d] <= 31


def test_a_libpq_dsn_works_as_a_sqlalchemy_url(clean: str) -> None:
    """The embedded server's DSN (key=value, a socket folder) for SQLALCHEMY_DATABASE_URI."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from queue_pg.dsn import sqlalchemy_url

    url = sqlalchemy_url("host='/tmp/qp sock' port=5433 dbname=app user=me password='p w'")
    again = make_url(url.render_as_string(hide_password=False))  # as a config string too
    assert (again.drivername, again.database, again.username, again.password) == (
        "postgresql+psycopg", "app", "me", "p w")
    assert dict(again.query) == {"host": "/tmp/qp sock", "port": "5433"}
    engine = create_engine(sqlalchemy_url(clean))
    try:
        with engine.connect() as c:
            assert c.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()
