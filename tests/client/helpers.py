"""Helpers of the client tests."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import conninfo
from sqlalchemy import URL

Snapshot = Callable[[], dict[str, list[Any]]]


def advance(conn: Any, seconds: float) -> None:
    """Move this connection's queue_pg clock forward (it only affects calls made with conn=)."""
    conn.execute(
        "SELECT set_config('queue_pg.time_offset', (coalesce(nullif(current_setting("
        "'queue_pg.time_offset', true), '')::interval, '0') + make_interval(secs => %s))::text, false)",
        (seconds,),
    )


def about(delta: timedelta, seconds: float) -> bool:
    """``delta`` is ``seconds`` plus the little real time the test itself took."""
    return seconds <= delta.total_seconds() < seconds + 1.0


def db_messages(conn: Any) -> int:
    row = conn.execute("SELECT count(*) FROM queue_pg.messages").fetchone()
    assert row is not None
    return int(row[0])


def sqlalchemy_url(dsn: str) -> URL:
    """The test DSN (libpq key=value or URI, TCP or unix socket) as a postgresql+psycopg URL."""
    params = conninfo.conninfo_to_dict(dsn)
    host = params.pop("host", None)
    port = params.pop("port", None)
    socket = isinstance(host, str) and host.startswith("/")
    query = {k: str(v) for k, v in params.items() if k not in ("user", "password", "dbname")}
    if socket:
        query["host"] = str(host)
    return URL.create(
        "postgresql+psycopg",
        username=params.get("user"),  # type: ignore[arg-type]
        password=params.get("password"),  # type: ignore[arg-type]
        host=None if socket else host,  # type: ignore[arg-type]
        port=int(port) if port else None,
        database=params.get("dbname"),  # type: ignore[arg-type]
        query=query,
    )


def insert_poison(clean: str, queue: str) -> dict[str, int]:
    """Bodies Python cannot read, written straight into the table (as the superuser: send
    refuses them), beside healthy ones; their ids by name."""
    ids = {}
    with psycopg.connect(clean, autocommit=True) as su:
        for name, body in (("ok1", '"fine"'), ("deep", "[" * 3000 + "]" * 3000),
                           ("huge", "1e5000"), ("ok2", '{"a": 1}')):
            row = su.execute(
                "INSERT INTO queue_pg.messages (queue_id, body, visible_at, enqueued_at)"
                " SELECT id, %s::jsonb, queue_pg.now() - interval '1 s', queue_pg.now()"
                " FROM queue_pg.queues WHERE name = %s RETURNING id", (body, queue)).fetchone()
            assert row is not None
            ids[name] = row[0]
    return ids
