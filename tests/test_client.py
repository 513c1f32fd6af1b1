"""queue_pg.Client from Python: every method, the Message / QueueConfig / QueueStats fields, each
error class for its cause, transactional enqueue (DSN, pool, SQLAlchemy engine) and long polling.

Time passes without sleeping through the session setting ``queue_pg.time_offset`` of a connection
handed to a method as ``conn=`` (see ``advance``); long polling uses real, sub-second waits.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import conninfo
from psycopg.pq import Format
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool
from sqlalchemy import URL, create_engine, text

import queue_pg
from queue_pg import (
    Client,
    DeleteResult,
    InvalidParameter,
    InvalidReceipt,
    LeaseLimitExceeded,
    Message,
    MessageNotFound,
    MessageTooLarge,
    OverLimit,
    QueueAlreadyExists,
    QueueConfig,
    QueueError,
    QueueInUse,
    QueueNotFound,
    QueueStats,
    StaleReceipt,
    _ops,
)

Snapshot = Callable[[], dict[str, list[Any]]]


def advance(conn: psycopg.Connection, seconds: float) -> None:
    """Move this connection's queue_pg clock forward (it only affects calls made with conn=)."""
    conn.execute(
        "SELECT set_config('queue_pg.time_offset', (coalesce(nullif(current_setting("
        "'queue_pg.time_offset', true), '')::interval, '0') + make_interval(secs => %s))::text, false)",
        (seconds,),
    )


@pytest.fixture
def snapshot(conn: psycopg.Connection) -> Snapshot:
    """Every row of every queue_pg table, to show that a refused call changed nothing."""

    def take() -> dict[str, list[Any]]:
        return {
            table: [
                r[0] for r in conn.execute(f"SELECT t::text FROM queue_pg.{table} t ORDER BY 1")
            ]
            for table in ("queues", "messages", "in_flight", "message_history")
        }

    return take


def about(delta: timedelta, seconds: float) -> bool:
    """``delta`` is ``seconds`` plus the little real time the test itself took."""
    return seconds <= delta.total_seconds() < seconds + 1.0


def db_messages(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM queue_pg.messages").fetchone()
    assert row is not None
    return int(row[0])


# --- queues -----------------------------------------------------------------------------------


def test_create_queue_returns_its_config_with_the_documented_defaults(client: Client) -> None:
    cfg = client.create_queue("jobs")
    assert isinstance(cfg, QueueConfig)
    assert (
        cfg.name,
        cfg.visibility_timeout,
        cfg.message_ttl,
        cfg.delay,
        cfg.max_message_size,
        cfg.receive_wait,
        cfg.max_lease,
        cfg.dead_letter_queue,
        cfg.max_receive_count,
        cfg.in_flight_limit,
        cfg.history,
        cfg.history_retention,
    ) == ("jobs", 30.0, 345600.0, 0.0, 1048576, 0.0, 43200.0, None, None, None, True, 604800.0)
    assert isinstance(cfg.created_at, datetime) and cfg.created_at.tzinfo is not None
    assert client.get_queue("jobs") == cfg


def test_create_queue_takes_timedelta_settings(client: Client) -> None:
    client.create_queue("dlq")
    cfg = client.create_queue(
        "jobs",
        visibility_timeout=timedelta(minutes=2),
        message_ttl=timedelta(days=1, milliseconds=500),
        delay=timedelta(milliseconds=250),
        max_message_size=4096,
        receive_wait=timedelta(seconds=3),
        max_lease=timedelta(hours=1),
        dead_letter_queue="dlq",
        max_receive_count=5,
        in_flight_limit=100,
        history=False,
        history_retention=timedelta(hours=2),
    )
    assert (
        cfg.visibility_timeout,
        cfg.message_ttl,
        cfg.delay,
        cfg.max_message_size,
        cfg.receive_wait,
        cfg.max_lease,
        cfg.dead_letter_queue,
        cfg.max_receive_count,
        cfg.in_flight_limit,
        cfg.history,
        cfg.history_retention,
    ) == (120.0, 86400.5, 0.25, 4096, 3.0, 3600.0, "dlq", 5, 100, False, 7200.0)
    # the same settings again (as floats now) are a no-op that returns the existing row
    again = client.create_queue(
        "jobs",
        visibility_timeout=120,
        message_ttl=86400.5,
        delay=0.25,
        max_message_size=4096,
        receive_wait=3,
        max_lease=3600,
        dead_letter_queue="dlq",
        max_receive_count=5,
        in_flight_limit=100,
        history=False,
        history_retention=7200,
    )
    assert again == cfg


def test_create_queue_with_other_settings_is_refused_and_changes_nothing(
    client: Client, snapshot: Snapshot
) -> None:
    client.create_queue("jobs", visibility_timeout=10)
    before = snapshot()
    with pytest.raises(QueueAlreadyExists, match=r"visibility_timeout = 10 \(asked 11\)") as err:
        client.create_queue("jobs", visibility_timeout=11)
    assert err.value.sqlstate == "QP002"
    with pytest.raises(QueueAlreadyExists, match="message_ttl"):
        client.create_queue("jobs", visibility_timeout=10, message_ttl=None)
    assert snapshot() == before
    assert client.get_queue("jobs").visibility_timeout == 10


def test_message_ttl_none_means_messages_never_expire(client: Client) -> None:
    assert client.create_queue("forever", message_ttl=None).message_ttl is None
    client.send("forever", 1)
    [m] = client.peek("forever")
    assert m.expires_at is None


def test_unknown_setting_is_a_type_error_before_any_sql(client: Client) -> None:
    with pytest.raises(TypeError, match="visibilty_timeout"):
        client.create_queue("jobs", visibilty_timeout=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="bogus"):
        client.alter_queue("jobs", bogus=1)  # type: ignore[call-arg]
    assert client.list_queues() == []


@pytest.mark.parametrize(
    ("name", "settings", "match"),
    [
        ("bad name", {}, "name = 'bad name'"),
        ("", {}, "name"),
        ("x" * 81, {}, "name"),
        (
            "jobs",
            {"visibility_timeout": timedelta(days=7, seconds=1)},
            "visibility_timeout = 604801",
        ),
        ("jobs", {"visibility_timeout": math.nan}, "visibility_timeout = NaN"),
        ("jobs", {"visibility_timeout": -0.5}, "visibility_timeout"),
        ("jobs", {"message_ttl": 0}, "message_ttl = 0"),
        ("jobs", {"message_ttl": math.inf}, "message_ttl"),
        ("jobs", {"delay": timedelta(seconds=-1)}, "delay = -1"),
        ("jobs", {"max_message_size": 1023}, "max_message_size = 1023"),
        ("jobs", {"max_message_size": 2**40}, "out of range"),  # PostgreSQL's own 22003
        ("jobs", {"receive_wait": 20.5}, "receive_wait = 20.5"),
        ("jobs", {"max_lease": 0}, "max_lease = 0"),
        ("jobs", {"max_lease": 5, "visibility_timeout": 6}, "max_lease = 5"),
        ("jobs", {"max_receive_count": 3}, "set both or neither"),
        ("jobs", {"dead_letter_queue": "missing", "max_receive_count": 3}, "no such queue"),
        ("jobs", {"dead_letter_queue": "jobs", "max_receive_count": 3}, "its own"),
        ("jobs", {"dead_letter_queue": "dlq", "max_receive_count": 0}, "max_receive_count = 0"),
        ("jobs", {"in_flight_limit": 0}, "in_flight_limit = 0"),
        ("jobs", {"history": None}, "history = NULL"),
        ("jobs", {"history_retention": 3599}, "history_retention = 3599"),
    ],
)
def test_bad_queue_settings_raise_invalid_parameter_and_change_nothing(
    client: Client, snapshot: Snapshot, name: str, settings: dict[str, Any], match: str
) -> None:
    client.create_queue("dlq")
    before = snapshot()
    with pytest.raises(InvalidParameter, match=match) as err:
        client.create_queue(name, **settings)
    assert isinstance(err.value, ValueError)
    assert snapshot() == before


def test_alter_queue_changes_only_what_it_is_given(client: Client) -> None:
    client.create_queue("dlq")
    created = client.create_queue("jobs", visibility_timeout=10, delay=1)
    cfg = client.alter_queue(
        "jobs", visibility_timeout=timedelta(seconds=45), receive_wait=timedelta(milliseconds=500)
    )
    assert (cfg.visibility_timeout, cfg.receive_wait, cfg.delay) == (45.0, 0.5, 1.0)
    assert cfg.created_at == created.created_at
    cfg = client.alter_queue(
        "jobs", dead_letter_queue="dlq", max_receive_count=3, in_flight_limit=7
    )
    assert (cfg.dead_letter_queue, cfg.max_receive_count, cfg.in_flight_limit) == ("dlq", 3, 7)
    assert client.get_queue("jobs") == cfg


def test_alter_queue_clear_sets_nullable_settings_to_null(client: Client) -> None:
    client.create_queue("dlq")
    client.create_queue("jobs", dead_letter_queue="dlq", max_receive_count=3, in_flight_limit=5)
    cfg = client.alter_queue("jobs", clear=["message_ttl", "in_flight_limit"])
    assert (cfg.message_ttl, cfg.in_flight_limit, cfg.max_receive_count) == (None, None, 3)
    cfg = client.alter_queue("jobs", clear=("dead_letter_queue",))  # any iterable; pairs clear
    assert (cfg.dead_letter_queue, cfg.max_receive_count) == (None, None)
    assert client.get_queue("jobs") == cfg
    # a cleared dead_letter_queue is no longer "in use"
    assert client.drop_queue("dlq") is True


@pytest.mark.parametrize(
    ("settings", "clear", "error", "match"),
    [
        ({"visibility_timeout": 604801}, None, InvalidParameter, "visibility_timeout"),
        ({"max_lease": 20}, None, InvalidParameter, "max_lease = 20"),  # below visibility 30
        ({"max_receive_count": 4}, None, InvalidParameter, "set both"),
        ({"delay": 1}, ["visibility_timeout"], InvalidParameter, "clear = 'visibility_timeout'"),
        ({"dead_letter_queue": "nope", "max_receive_count": 2}, None, InvalidParameter, "no such"),
    ],
)
def test_bad_alter_queue_changes_nothing(
    client: Client,
    snapshot: Snapshot,
    settings: dict[str, Any],
    clear: list[str] | None,
    error: type[QueueError],
    match: str,
) -> None:
    client.create_queue("jobs", in_flight_limit=3)
    before = snapshot()
    with pytest.raises(error, match=match):
        client.alter_queue("jobs", clear=clear, **settings)
    assert snapshot() == before


def test_alter_get_drop_of_a_missing_queue_raise_queue_not_found(client: Client) -> None:
    for call in (
        lambda: client.alter_queue("nope", delay=1),
        lambda: client.get_queue("nope"),
        lambda: client.drop_queue("nope"),
    ):
        with pytest.raises(QueueNotFound, match="queue 'nope' does not exist") as err:
            call()
        assert err.value.sqlstate == "QP001"
    assert client.drop_queue("nope", if_exists=True) is False


def test_list_queues_is_sorted_by_name(client: Client) -> None:
    for name in ("b", "c", "a"):
        client.create_queue(name, delay=ord(name) - ord("a"))
    queues = client.list_queues()
    assert [(q.name, q.delay) for q in queues] == [("a", 0.0), ("b", 1.0), ("c", 2.0)]
    assert all(isinstance(q, QueueConfig) for q in queues)


def test_drop_queue_removes_it_and_its_messages_only(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs")
    client.create_queue("other")
    client.send_batch("jobs", [1, 2])
    client.receive("jobs")
    client.send("other", 3)
    assert client.drop_queue("jobs") is True
    assert [q.name for q in client.list_queues()] == ["other"]
    assert db_messages(conn) == 1
    assert client.drop_queue("jobs", if_exists=True) is False
    with pytest.raises(QueueNotFound):
        client.send("jobs", 1)


def test_drop_of_a_dead_letter_queue_in_use_raises_queue_in_use(
    client: Client, snapshot: Snapshot
) -> None:
    client.create_queue("dlq")
    client.create_queue("jobs", dead_letter_queue="dlq", max_receive_count=2)
    client.send("dlq", "parked")
    before = snapshot()
    with pytest.raises(QueueInUse, match="'jobs'") as err:
        client.drop_queue("dlq")
    assert err.value.sqlstate == "QP010"
    assert snapshot() == before
    client.drop_queue("jobs")
    assert client.drop_queue("dlq") is True


# --- send -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"order": 42, "items": [1, 2.5, None, True], "nested": {"x": "y"}},
        [1, "two", {"three": 3}],
        "plain text with ünïcödé and emoji \U0001f680",
        12345678901234567,
        -0.125,
        True,
        None,  # JSON null is a body too
    ],
)
def test_send_stores_any_json_body(client: Client, body: Any) -> None:
    client.create_queue("jobs")
    mid = client.send("jobs", body)
    [m] = client.receive("jobs")
    assert (m.id, m.body) == (mid, body)


def test_send_returns_increasing_ids_and_keeps_attributes(client: Client) -> None:
    client.create_queue("jobs")
    a = client.send("jobs", {"n": 1}, attributes={"type": "email", "trace": {"id": "abc"}})
    b = client.send("jobs", {"n": 2})
    assert isinstance(a, int) and b > a
    got = {m.id: m for m in client.receive("jobs", 10)}
    assert got[a].attributes == {"type": "email", "trace": {"id": "abc"}}
    assert got[b].attributes is None


def test_send_delay_and_ttl_take_floats_and_timedeltas(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs", delay=5, message_ttl=100)
    plain = client.send("jobs", 0)  # the queue's delay and ttl
    floats = client.send("jobs", 1, delay=0.5, ttl=30.25)
    deltas = client.send("jobs", 2, delay=timedelta(seconds=2), ttl=timedelta(minutes=1))
    now = client.send("jobs", 3, delay=0)
    rows = {
        mid: (delay, ttl)
        for mid, delay, ttl in conn.execute(
            "SELECT id, extract(epoch FROM visible_at - enqueued_at)::float8,"
            " extract(epoch FROM expires_at - enqueued_at)::float8 FROM queue_pg.messages"
        )
    }
    assert rows == {plain: (5, 100), floats: (0.5, 30.25), deltas: (2, 60), now: (0, 100)}
    assert [m.id for m in client.receive("jobs", 10)] == [now]
    assert client.stats("jobs").delayed == 3


def test_send_batch_returns_ids_in_order_with_one_or_many_attributes(client: Client) -> None:
    client.create_queue("jobs")
    ids = client.send_batch("jobs", [{"i": i} for i in range(5)], attributes={"type": "bulk"})
    assert len(ids) == 5 and ids == sorted(ids)
    per = client.send_batch(
        "jobs", (x for x in ["a", "b", "c"]), attributes=[{"type": "x"}, None, {"type": "z"}]
    )
    assert len(per) == 3 and per[0] > ids[-1]
    got = {m.id: m for m in client.receive("jobs", 100)}
    assert [(got[i].body, got[i].attributes) for i in ids] == [
        ({"i": i}, {"type": "bulk"}) for i in range(5)
    ]
    assert [(got[i].body, got[i].attributes) for i in per] == [
        ("a", {"type": "x"}),
        ("b", None),
        ("c", {"type": "z"}),
    ]


def test_send_batch_delay_and_ttl(client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs")
    ids = client.send_batch("jobs", [1, 2], delay=timedelta(seconds=3), ttl=9.5)
    rows = conn.execute(
        "SELECT extract(epoch FROM visible_at - enqueued_at)::float8,"
        " extract(epoch FROM expires_at - enqueued_at)::float8 FROM queue_pg.messages"
        " WHERE id = ANY(%s)",
        (ids,),
    ).fetchall()
    assert rows == [(3.0, 9.5), (3.0, 9.5)]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda c: c.send("jobs", "nul \u0000 in a string"), InvalidParameter, "Unicode"),
        (lambda c: c.send("jobs", {"deep": ["ok", {"k": "\u0000"}]}), InvalidParameter, "Unicode"),
        (lambda c: c.send("jobs", {"key\u0000": 1}), InvalidParameter, "Unicode"),
        (lambda c: c.send("jobs", 1, attributes={"type": "\u0000"}), InvalidParameter, "Unicode"),
        (lambda c: c.send("jobs", math.nan), InvalidParameter, "json"),
        (lambda c: c.send("jobs", "x" * 3000), MessageTooLarge, "max_message_size = 2048"),
        (
            lambda c: c.send("jobs", 1, attributes=[1, 2]),
            InvalidParameter,
            "attributes is a JSON array",
        ),
        (lambda c: c.send("jobs", 1, ttl=0), InvalidParameter, "ttl = 0"),
        (lambda c: c.send("jobs", 1, ttl=timedelta(days=-1)), InvalidParameter, "ttl = -86400"),
        (lambda c: c.send("jobs", 1, delay=604801), InvalidParameter, "delay = 604801"),
        (lambda c: c.send("jobs", 1, delay=math.nan), InvalidParameter, "delay = NaN"),
        (lambda c: c.send("nope", 1), QueueNotFound, "'nope'"),
        (lambda c: c.send_batch("jobs", []), InvalidParameter, r"len\(bodies\) = 0"),
        (lambda c: c.send_batch("jobs", [1] * 10001), InvalidParameter, r"len\(bodies\) = 10001"),
        (lambda c: c.send_batch("jobs", [1, "x" * 3000, 3]), MessageTooLarge, r"body\[1\]"),
        (lambda c: c.send_batch("jobs", [1, "\u0000"]), InvalidParameter, "Unicode"),
        (
            lambda c: c.send_batch("jobs", [1, 2], attributes=[{}]),
            InvalidParameter,
            r"len\(attributes\) = 1",
        ),
        (
            lambda c: c.send_batch("jobs", [1, 2], attributes=[{}, [3]]),
            InvalidParameter,
            r"attributes\[1\]",
        ),
        (lambda c: c.send_batch("jobs", [1, 2], ttl=-1), InvalidParameter, "ttl = -1"),
        (lambda c: c.send_batch("nope", [1]), QueueNotFound, "'nope'"),
    ],
)
def test_bad_sends_raise_their_error_and_change_nothing(
    client: Client,
    snapshot: Snapshot,
    call: Callable[[Client], object],
    error: type[QueueError],
    match: str,
) -> None:
    client.create_queue("jobs", max_message_size=2048)
    client.send("jobs", "already here")
    before = snapshot()
    with pytest.raises(error, match=match):
        call(client)
    assert snapshot() == before


def test_message_too_large_is_an_invalid_parameter_that_names_the_limit(client: Client) -> None:
    client.create_queue("jobs", max_message_size=1024)
    with pytest.raises(MessageTooLarge) as err:
        client.send("jobs", {"blob": "y" * 5000})
    assert isinstance(err.value, InvalidParameter) and isinstance(err.value, ValueError)
    assert err.value.sqlstate == "QP004"
    assert "up to max_message_size = 1024 bytes of queue 'jobs'" in str(err.value)
    client.send("jobs", {"blob": "y" * 500})  # under the limit: fine


# --- receive ----------------------------------------------------------------------------------


def test_receive_returns_messages_with_every_field(client: Client) -> None:
    client.create_queue("jobs", visibility_timeout=20, message_ttl=3600)
    mid = client.send("jobs", {"hello": "world"}, attributes={"type": "greeting"})
    [m] = client.receive("jobs")
    assert isinstance(m, Message)
    assert (m.id, m.queue, m.body, m.attributes, m.receive_count) == (
        mid,
        "jobs",
        {"hello": "world"},
        {"type": "greeting"},
        1,
    )
    assert isinstance(m.receipt, str) and m.receipt.count(".") == 3
    assert m.first_received_at is not None
    assert m.enqueued_at <= m.first_received_at
    assert m.visible_until - m.first_received_at == timedelta(seconds=20)
    assert m.expires_at is not None and m.expires_at - m.enqueued_at == timedelta(hours=1)
    assert client.receive("jobs") == []  # leased: nothing else to get


def test_receive_visibility_timeout_as_float_and_timedelta(client: Client) -> None:
    client.create_queue("jobs", visibility_timeout=30)
    client.send_batch("jobs", [1, 2, 3])
    [a] = client.receive("jobs", visibility_timeout=0.5)
    [b] = client.receive("jobs", visibility_timeout=timedelta(seconds=7, milliseconds=250))
    [c] = client.receive("jobs")
    for m, lease in ((a, 0.5), (b, 7.25), (c, 30.0)):
        assert m.first_received_at is not None
        assert m.visible_until - m.first_received_at == timedelta(seconds=lease)


def test_receive_again_after_the_lease_lapses(client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs", visibility_timeout=10)
    client.send("jobs", "x")
    [first] = client.receive("jobs", conn=conn)
    assert client.receive("jobs", conn=conn) == []
    advance(conn, 10.5)
    [second] = client.receive("jobs", visibility_timeout=5, conn=conn)
    assert second.id == first.id and second.receipt != first.receipt
    assert second.receive_count == 2
    assert second.first_received_at == first.first_received_at
    assert about(second.visible_until - first.visible_until, 5.5)


def test_receive_max_messages_oldest_first(client: Client) -> None:
    client.create_queue("jobs")
    ids = client.send_batch("jobs", list(range(7)))
    got = client.receive("jobs", 5)
    assert [m.id for m in got] == ids[:5]
    assert len({m.receipt for m in got}) == 5
    assert [m.id for m in client.receive("jobs", 1000)] == ids[5:]
    assert client.receive("jobs", 3) == []


def test_receive_never_returns_expired_messages(client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs")
    client.send("jobs", "short", ttl=5)
    keep = client.send("jobs", "long")
    advance(conn, 6)
    assert [m.id for m in client.receive("jobs", 10, conn=conn)] == [keep]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_messages": 0}, "max_messages = 0"),
        ({"max_messages": 1001}, "max_messages = 1001"),
        ({"max_messages": 2**40}, "out of range"),
        ({"visibility_timeout": -1}, "visibility_timeout = -1"),
        ({"visibility_timeout": math.nan}, "visibility_timeout = NaN"),
        ({"visibility_timeout": timedelta(minutes=2)}, "max_lease = 100"),
        ({"wait": 21}, "wait = 21"),
    ],
)
def test_bad_receives_raise_invalid_parameter_and_lease_nothing(
    client: Client, snapshot: Snapshot, kwargs: dict[str, Any], match: str
) -> None:
    client.create_queue("jobs", max_lease=100)
    client.send("jobs", 1)
    before = snapshot()
    with pytest.raises(InvalidParameter, match=match):
        client.receive("jobs", **kwargs)
    assert snapshot() == before
    with pytest.raises(QueueNotFound):
        client.receive("nope")


# --- delete, change_visibility, update --------------------------------------------------------


def test_delete_returns_true_then_false_on_retry(client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs")
    mid = client.send("jobs", "x", attributes={"type": "t1"})
    [m] = client.receive("jobs")
    assert m.receipt is not None
    assert client.delete("jobs", m.receipt) is True
    assert client.delete("jobs", m.receipt) is False
    assert db_messages(conn) == 0
    rows = conn.execute(
        "SELECT message_id, outcome, receive_count, type FROM queue_pg.message_history"
    ).fetchall()
    assert rows == [(mid, "deleted", 1, "t1")]


def test_stale_receipt_is_refused_counted_and_changes_nothing(
    client: Client, conn: psycopg.Connection, snapshot: Snapshot
) -> None:
    client.create_queue("jobs", visibility_timeout=10)
    client.send("jobs", "x")
    [old] = client.receive("jobs", conn=conn)
    advance(conn, 11)
    [new] = client.receive("jobs", conn=conn)
    assert old.receipt is not None and new.receipt is not None
    before = snapshot()
    with pytest.raises(StaleReceipt, match="received again") as err:
        client.delete("jobs", old.receipt, conn=conn)
    assert err.value.sqlstate == "QP005"
    assert err.value.diag is not None and "visibility_timeout" in (
        err.value.diag.message_hint or ""
    )
    with pytest.raises(StaleReceipt):
        client.change_visibility("jobs", old.receipt, 60, conn=conn)
    with pytest.raises(StaleReceipt):
        client.update("jobs", old.receipt, body="hijack", conn=conn)
    assert snapshot() == before
    stats = client.stats("jobs", conn=conn)
    assert (stats.stale_receipts, stats.lease_expiries) == (3, 1)
    assert client.delete("jobs", new.receipt, conn=conn) is True


def test_a_lapsed_lease_nobody_took_can_still_be_deleted(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs", visibility_timeout=1)
    client.send("jobs", "x")
    [m] = client.receive("jobs", conn=conn)
    advance(conn, 30)
    assert m.receipt is not None
    assert client.delete("jobs", m.receipt, conn=conn) is True


@pytest.mark.parametrize(
    "receipt",
    ["", "nonsense", "1.1.1", "1.1.1.0123456789abcdef", "9" * 200, "1.1.1.zzzzzzzzzzzzzzzz"],
)
def test_malformed_or_forged_receipts_raise_invalid_receipt(
    client: Client, snapshot: Snapshot, receipt: str
) -> None:
    client.create_queue("jobs")
    client.send("jobs", 1)
    client.receive("jobs")
    before = snapshot()
    for call in (
        lambda: client.delete("jobs", receipt),
        lambda: client.change_visibility("jobs", receipt, 5),
        lambda: client.update("jobs", receipt, body=2),
    ):
        with pytest.raises(InvalidReceipt) as err:
            call()
        assert err.value.sqlstate == "QP006"
    assert snapshot() == before


def test_receipt_of_another_queue_is_invalid(client: Client) -> None:
    client.create_queue("a")
    client.create_queue("b")
    client.send("a", 1)
    [m] = client.receive("a")
    assert m.receipt is not None
    with pytest.raises(InvalidReceipt, match="queue 'b'"):
        client.delete("b", m.receipt)
    assert client.delete("a", m.receipt) is True


def test_delete_batch_gives_a_result_per_receipt(client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs", visibility_timeout=5)
    client.send_batch("jobs", [1, 2, 3, 4])
    first = client.receive("jobs", 1, visibility_timeout=1, conn=conn)
    first += client.receive("jobs", 3, conn=conn)
    advance(conn, 2)
    again = client.receive("jobs", 1, conn=conn)  # the first message again: its receipt is stale
    receipts = [m.receipt for m in first]
    assert all(receipts) and again[0].id == first[0].id
    assert client.delete("jobs", first[1].receipt or "", conn=conn) is True  # gone already
    results = client.delete_batch("jobs", [*receipts, "junk"], conn=conn)
    assert all(isinstance(r, DeleteResult) for r in results)
    assert [(r.receipt, r.deleted, r.error) for r in results] == [
        (receipts[0], False, "StaleReceipt"),
        (receipts[1], False, None),
        (receipts[2], True, None),
        (receipts[3], True, None),
        ("junk", False, "InvalidReceipt"),
    ]
    assert client.stats("jobs", conn=conn).stale_receipts == 1
    assert client.delete_batch("jobs", iter([again[0].receipt or ""]), conn=conn) == [
        DeleteResult(again[0].receipt or "", True, None)
    ]
    assert db_messages(conn) == 0


def test_bad_delete_batches_change_nothing(client: Client, snapshot: Snapshot) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", [1, 2])
    a, b = (m.receipt or "" for m in client.receive("jobs", 2))
    before = snapshot()
    with pytest.raises(InvalidParameter, match="duplicate"):
        client.delete_batch("jobs", [a, b, a])
    with pytest.raises(InvalidParameter, match=r"len\(receipts\) = 0"):
        client.delete_batch("jobs", [])
    with pytest.raises(InvalidParameter, match=r"len\(receipts\) = 1001"):
        client.delete_batch("jobs", [f"r{i}" for i in range(1001)])
    with pytest.raises(QueueNotFound):
        client.delete_batch("nope", [a])
    assert snapshot() == before


def test_change_visibility_extends_releases_and_keeps_the_receipt(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs", visibility_timeout=10, max_lease=60)
    client.send("jobs", "x")
    [m] = client.receive("jobs", conn=conn)
    assert m.receipt is not None and m.first_received_at is not None
    advance(conn, 8)
    until = client.change_visibility("jobs", m.receipt, 20.5, conn=conn)
    assert isinstance(until, datetime)
    assert about(until - m.first_received_at, 8 + 20.5)  # counted from now, not from the receive
    advance(conn, 10)
    until = client.change_visibility("jobs", m.receipt, timedelta(seconds=40), conn=conn)
    assert about(until - m.first_received_at, 18 + 40)
    assert client.receive("jobs", conn=conn) == []
    # release: visible again at once, same receipt still the holder's
    until = client.change_visibility("jobs", m.receipt, 0, conn=conn)
    assert about(until - m.first_received_at, 18)
    [peeked] = client.peek("jobs", conn=conn)
    assert peeked.id == m.id
    assert client.delete("jobs", m.receipt, conn=conn) is True


def test_change_visibility_past_max_lease_raises_lease_limit_exceeded(
    client: Client, conn: psycopg.Connection, snapshot: Snapshot
) -> None:
    client.create_queue("jobs", visibility_timeout=10, max_lease=60)
    client.send("jobs", "x")
    [m] = client.receive("jobs", conn=conn)
    assert m.receipt is not None
    advance(conn, 50)
    before = snapshot()
    with pytest.raises(LeaseLimitExceeded, match="max_lease = 60") as err:
        client.change_visibility("jobs", m.receipt, 10.5, conn=conn)
    assert err.value.sqlstate == "QP007"
    assert re.search(r"allowed up to 9\.\d+ seconds from now", str(err.value))
    with pytest.raises(LeaseLimitExceeded):
        client.update("jobs", m.receipt, visibility_timeout=timedelta(seconds=11), conn=conn)
    with pytest.raises(InvalidParameter, match="timeout = -1"):
        client.change_visibility("jobs", m.receipt, -1, conn=conn)
    with pytest.raises(InvalidParameter, match="timeout = NaN"):
        client.change_visibility("jobs", m.receipt, math.nan, conn=conn)
    assert snapshot() == before
    client.change_visibility("jobs", m.receipt, 9.5, conn=conn)  # within the cap: allowed


def test_change_visibility_or_update_of_a_gone_message_raises_message_not_found(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs", message_ttl=100)
    client.send_batch("jobs", [1, 2])
    a, b = client.receive("jobs", 2, conn=conn)
    assert a.receipt is not None and b.receipt is not None
    client.delete("jobs", a.receipt)
    with pytest.raises(MessageNotFound, match="no longer in queue 'jobs'") as err:
        client.change_visibility("jobs", a.receipt, 5, conn=conn)
    assert err.value.sqlstate == "QP009"
    with pytest.raises(MessageNotFound):
        client.update("jobs", a.receipt, body=3, conn=conn)
    advance(conn, 101)  # b expired while leased: expiry wins
    with pytest.raises(MessageNotFound):
        client.change_visibility("jobs", b.receipt, 5, conn=conn)
    assert client.delete("jobs", b.receipt, conn=conn) is False


def test_update_replaces_body_and_visibility_and_keeps_the_receipt(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs", max_message_size=1024)
    client.send("jobs", {"step": 0}, attributes={"type": "job"})
    [m] = client.receive("jobs", conn=conn)
    assert m.receipt is not None and m.first_received_at is not None
    u = client.update("jobs", m.receipt, body={"step": 1}, visibility_timeout=12.5, conn=conn)
    assert isinstance(u, Message)
    assert (u.id, u.queue, u.body, u.attributes, u.receipt, u.receive_count) == (
        m.id,
        "jobs",
        {"step": 1},
        {"type": "job"},
        m.receipt,
        1,
    )
    assert about(u.visible_until - m.first_received_at, 12.5)
    assert client.peek("jobs") == []
    with pytest.raises(MessageTooLarge):
        client.update("jobs", m.receipt, body="z" * 2000, conn=conn)
    # defaults: body kept, visible again at once
    u = client.update("jobs", m.receipt, conn=conn)
    assert u.body == {"step": 1}
    [p] = client.peek("jobs")
    assert (p.id, p.body) == (m.id, {"step": 1})
    [again] = client.receive("jobs")
    assert again.body == {"step": 1} and again.receive_count == 2


# --- peek, purge, sweep, stats, redrive -------------------------------------------------------


def test_peek_shows_visible_messages_without_leasing_them(client: Client) -> None:
    client.create_queue("jobs")
    ids = client.send_batch("jobs", ["a", "b", "c"], attributes={"type": "p"})
    client.send("jobs", "later", delay=60)
    [one] = client.peek("jobs")
    assert (one.id, one.body, one.receipt, one.receive_count, one.attributes) == (
        ids[0],
        "a",
        None,
        0,
        {"type": "p"},
    )
    assert one.first_received_at is None and one.visible_until >= one.enqueued_at
    assert [m.id for m in client.peek("jobs", n=10)] == ids
    assert [m.id for m in client.peek("jobs", 10)] == ids  # twice: still visible
    assert [m.id for m in client.receive("jobs", 10)] == ids
    assert client.peek("jobs", 10) == []
    with pytest.raises(InvalidParameter, match="n = 0"):
        client.peek("jobs", 0)
    with pytest.raises(QueueNotFound):
        client.peek("nope")


def test_purge_removes_messages_in_every_state(client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs", in_flight_limit=10)
    client.create_queue("other")
    client.send_batch("jobs", [1, 2, 3])
    client.send("jobs", 4, delay=100)
    client.receive("jobs")
    client.send("other", 5)
    assert client.purge("jobs") == 4
    assert client.purge("jobs") == 0
    stats = client.stats("jobs")
    assert (stats.visible, stats.in_flight, stats.delayed) == (0, 0, 0)
    assert db_messages(conn) == 1
    assert [r[0] for r in conn.execute("SELECT outcome FROM queue_pg.message_history")] == [
        "purged"
    ] * 4
    with pytest.raises(QueueNotFound):
        client.purge("nope")


def test_sweep_deletes_expired_messages(client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs", message_ttl=10)
    client.create_queue("forever", message_ttl=None)
    client.send_batch("jobs", [1, 2, 3])
    client.send("jobs", 4, ttl=1000)
    client.send("forever", 5)
    assert client.sweep() == 0
    advance(conn, 11)
    assert client.sweep(conn=conn) == 3
    assert client.sweep(conn=conn) == 0
    assert db_messages(conn) == 2
    rows = conn.execute(
        "SELECT outcome, count(*) FROM queue_pg.message_history GROUP BY 1"
    ).fetchall()
    assert rows == [("expired", 3)]


def test_stats_fields(client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("dlq")
    client.create_queue("jobs", visibility_timeout=10, dead_letter_queue="dlq", max_receive_count=2)
    empty = client.stats("jobs")
    assert isinstance(empty, QueueStats)
    assert empty == QueueStats("jobs", 0, 0, 0, 0, None, 0, 0)
    client.send_batch("jobs", [1, 2, 3, 4])
    client.send("jobs", 5, delay=1000)
    a, b = client.receive("jobs", 2, conn=conn)
    advance(conn, 11)  # a and b lapse: their next receive is a redelivery after a lapse
    assert len(client.receive("jobs", 4, conn=conn)) == 4
    with pytest.raises(StaleReceipt):
        client.delete("jobs", a.receipt or "", conn=conn)
    advance(conn, 11)  # all four lapse: a and b are dead-lettered (2 receives), c and d redelivered
    got = client.receive("jobs", 10, conn=conn)
    assert sorted(m.body for m in got) == [3, 4]
    assert sorted(m.id for m in client.peek("dlq", 10, conn=conn)) == sorted([a.id, b.id])
    s = client.stats("jobs", conn=conn)
    assert (s.queue, s.visible, s.in_flight, s.delayed, s.dead_lettered) == ("jobs", 0, 2, 1, 2)
    assert s.oldest_visible_age is None
    assert (s.stale_receipts, s.lease_expiries) == (1, 2 + 4)
    client.change_visibility("jobs", got[0].receipt or "", 0, conn=conn)  # a release, no expiry
    advance(conn, 5)
    s = client.stats("jobs", conn=conn)
    assert (s.visible, s.in_flight) == (1, 1)
    assert s.oldest_visible_age is not None and 27 < s.oldest_visible_age < 27 + 5
    assert client.stats("dlq", conn=conn).visible == 2
    with pytest.raises(QueueNotFound):
        client.stats("nope")


def test_redrive_moves_dead_letters_back_with_to_and_limit(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("dlq")
    client.create_queue("other")
    client.create_queue("jobs", visibility_timeout=1, dead_letter_queue="dlq", max_receive_count=1)
    ids = client.send_batch("jobs", [1, 2, 3])
    client.receive("jobs", 3, conn=conn)
    advance(conn, 2)
    assert client.receive("jobs", 3, conn=conn) == []  # all dead-lettered
    assert sorted(m.id for m in client.peek("dlq", 10, conn=conn)) == ids
    assert client.stats("jobs", conn=conn).dead_lettered == 3
    assert client.redrive("dlq", to="other", limit=1, conn=conn) == 1
    [moved] = client.peek("other", conn=conn)
    assert moved.id in ids and moved.receive_count == 0
    assert client.redrive("dlq", conn=conn) == 2  # back where each came from
    back = client.receive("jobs", 10, conn=conn)
    assert sorted(m.id for m in back) == sorted(set(ids) - {moved.id})
    assert all(m.receive_count == 1 for m in back)
    assert client.redrive("dlq", conn=conn) == 0
    with pytest.raises(QueueNotFound):
        client.redrive("dlq", to="nope")
    with pytest.raises(InvalidParameter, match="limit = 0"):
        client.redrive("dlq", limit=0)


def test_channel_names_the_queues_listen_channel(client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs")
    first = client.channel("jobs")
    assert first.startswith("queue_pg_")
    conn.execute(f"LISTEN {first}")
    client.send("jobs", 1)
    assert [n.channel for n in conn.notifies(timeout=1, stop_after=1)] == [first]
    client.drop_queue("jobs")
    client.create_queue("jobs")
    assert client.channel("jobs") != first  # a queue created again has a channel of its own
    with pytest.raises(QueueNotFound):
        client.channel("nope")


def test_receive_sweeps_expired_messages_every_sweep_interval(
    clean: str, conn: psycopg.Connection
) -> None:
    with Client(clean, sweep_interval=0.6) as client:
        client.create_queue("jobs")
        client.create_queue("idle")
        client.send("idle", "short-lived", ttl=0.1)
        time.sleep(0.15)
        with psycopg.connect(clean) as tx:
            client.receive("jobs", conn=tx)  # never sweeps inside the caller's transaction...
            tx.rollback()
        # ...but on a connection of its own: the expired message of another queue is gone
        assert db_messages(conn) == 0
        outcomes = conn.execute("SELECT queue, outcome FROM queue_pg.message_history").fetchall()
        assert outcomes == [("idle", "expired")]
        client.send("idle", "short-lived", ttl=0.1)
        time.sleep(0.15)
        client.receive("jobs")  # within the interval: no sweep
        assert db_messages(conn) == 1
        time.sleep(0.45)
        client.receive("jobs")
        assert db_messages(conn) == 0
    with Client(clean, sweep_interval=None) as never:
        never.send("idle", "short-lived", ttl=0.1)
        time.sleep(0.15)
        never.receive("jobs")
        assert db_messages(conn) == 1


# --- errors -----------------------------------------------------------------------------------


def test_error_hierarchy() -> None:
    for cls in (
        QueueNotFound,
        QueueAlreadyExists,
        InvalidParameter,
        MessageTooLarge,
        StaleReceipt,
        InvalidReceipt,
        LeaseLimitExceeded,
        OverLimit,
        MessageNotFound,
        QueueInUse,
    ):
        assert issubclass(cls, QueueError)
        assert getattr(queue_pg, cls.__name__) is cls
    assert issubclass(InvalidParameter, ValueError)
    assert issubclass(MessageTooLarge, InvalidParameter)
    assert not issubclass(StaleReceipt, ValueError)


def test_over_limit_on_a_short_poll(client: Client, snapshot: Snapshot) -> None:
    client.create_queue("jobs", in_flight_limit=2)
    client.send_batch("jobs", [1, 2, 3])
    got = client.receive("jobs", 10)
    assert len(got) == 2  # capped at the limit
    before = snapshot()
    with pytest.raises(OverLimit, match="in_flight_limit = 2") as err:
        client.receive("jobs")
    assert err.value.sqlstate == "QP008"
    assert snapshot() == before
    client.delete("jobs", got[0].receipt or "")
    assert [m.body for m in client.receive("jobs")] == [3]


def test_database_errors_that_are_not_queue_errors_propagate_unchanged(
    client: Client, conn: psycopg.Connection, clean: str
) -> None:
    client.create_queue("jobs")
    with psycopg.connect(clean) as locker:
        locker.execute("LOCK TABLE queue_pg.messages IN ACCESS EXCLUSIVE MODE")
        conn.execute("SET lock_timeout = '100ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable) as err:
            client.send("jobs", 1, conn=conn)
        assert not isinstance(err.value, QueueError)
        locker.rollback()


# --- transactional enqueue: conn= runs inside the caller's transaction ------------------------


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


def test_send_in_a_transaction_exists_if_and_only_if_it_commits(
    client: Client, clean: str, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs")
    with psycopg.connect(clean) as tx:  # not autocommit: the caller's transaction
        tx.execute("CREATE TEMP TABLE orders (id int)")
        tx.commit()
        tx.execute("INSERT INTO orders VALUES (1)")
        mid = client.send("jobs", {"order": 1}, conn=tx)
        ids = client.send_batch("jobs", [{"order": 2}, {"order": 3}], conn=tx)
        assert client.peek("jobs", 10, conn=tx)[0].id == mid  # the transaction sees its own
        assert client.peek("jobs", 10) == []  # nobody else does
        tx.rollback()
        assert db_messages(conn) == 0
        assert tx.execute("SELECT count(*) FROM orders").fetchone() == (0,)

        tx.execute("INSERT INTO orders VALUES (2)")
        kept = client.send("jobs", {"order": 2}, conn=tx)
        assert client.receive("jobs") == []  # not committed yet
        tx.commit()
    assert kept not in ids
    [m] = client.receive("jobs")
    assert (m.id, m.body) == (kept, {"order": 2})


def test_receive_and_delete_in_a_rolled_back_transaction_are_undone(
    client: Client, clean: str
) -> None:
    client.create_queue("jobs")
    mid = client.send("jobs", "x")
    with psycopg.connect(clean) as tx:
        [m] = client.receive("jobs", conn=tx)
        assert m.receipt is not None
        assert client.delete("jobs", m.receipt, conn=tx) is True
        tx.rollback()
        [again] = client.peek("jobs")  # the lease and the delete never happened
        assert (again.id, again.receive_count) == (mid, 0)
        [m] = client.receive("jobs", conn=tx)
        client.change_visibility("jobs", m.receipt or "", 300, conn=tx)
        tx.commit()
    assert client.peek("jobs") == []
    assert client.stats("jobs").in_flight == 1


def test_client_on_a_connection_pool_borrows_it_and_joins_its_transactions(
    clean: str, conn: psycopg.Connection
) -> None:
    with ConnectionPool(clean, min_size=1, max_size=2, open=True) as pool:
        client = Client(pool, sweep_interval=None)
        client.create_queue("jobs")  # the client commits what it runs on its own
        assert [q.name for q in client.list_queues(conn=conn)] == ["jobs"]
        with pytest.raises(RuntimeError, match="abort"), pool.connection() as c:
            client.send("jobs", "lost", conn=c)
            raise RuntimeError("abort")  # the pool rolls the caller's transaction back
        with pool.connection() as c:
            client.send("jobs", "kept", conn=c)
            assert client.peek("jobs", conn=conn) == []
        # committed when the block left
        assert [m.body for m in client.receive("jobs", 10)] == ["kept"]
        client.close()  # a borrowed pool stays open
        assert not pool.closed
        with pool.connection() as c:
            assert c.execute("SELECT 1").fetchone() == (1,)


def test_client_on_a_sqlalchemy_engine_joins_the_callers_transaction(
    clean: str, conn: psycopg.Connection
) -> None:
    engine = create_engine(sqlalchemy_url(clean))
    try:
        client = Client(engine, sweep_interval=None)
        client.create_queue("jobs")
        assert [q.name for q in client.list_queues(conn=conn)] == ["jobs"]
        with pytest.raises(RuntimeError, match="abort"), engine.begin() as sa:
            sa.execute(text("CREATE TEMP TABLE t (x int)"))
            client.send("jobs", "lost", conn=sa.connection.driver_connection)
            raise RuntimeError("abort")
        assert db_messages(conn) == 0
        with engine.begin() as sa:
            client.send("jobs", "kept", conn=sa.connection.driver_connection)
            assert client.peek("jobs", conn=conn) == []
        [m] = client.receive("jobs")
        assert m.body == "kept"
        assert client.delete("jobs", m.receipt or "") is True
        assert db_messages(conn) == 0  # committed by the client
    finally:
        engine.dispose()


def test_client_rejects_other_sources() -> None:
    with pytest.raises(TypeError, match="DSN"):
        Client(42)  # type: ignore[arg-type]


# --- long polling -----------------------------------------------------------------------------


def send_later(
    dsn: str, queue: str, body: Any, after: float
) -> tuple[threading.Thread, dict[str, float]]:
    """Send ``body`` from another thread and connection ``after`` seconds from now."""
    times: dict[str, float] = {}
    sender = psycopg.connect(dsn, autocommit=True)

    def run() -> None:
        with sender:
            time.sleep(after)
            times["sent"] = time.monotonic()
            sender.execute(
                "SELECT queue_pg.send(%s, %s::jsonb)", (queue, psycopg.types.json.Jsonb(body))
            )
            times["committed"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, times


def woken_by_send(
    client: Client, dsn: str, body: Any, after: float = 0.15
) -> tuple[float, float, dict[str, float]]:
    """Long-poll "jobs" while another connection sends ``body`` ``after`` seconds later; assert
    the poll got it, woken by the NOTIFY (the re-check without one comes only a second after the
    poll began). Returns when the poll started and ended, and the sender's times."""
    thread, times = send_later(dsn, "jobs", body, after=after)
    start = time.monotonic()
    got = client.receive("jobs", wait=5)
    end = time.monotonic()
    thread.join()
    assert [m.body for m in got] == [body]
    assert end - times["committed"] < 0.6
    return start, end, times


@pytest.fixture(params=["dsn", "pool", "engine"])
def any_client(request: pytest.FixtureRequest, clean: str) -> Iterator[Client]:
    """A Client on each kind of source (a caller's pool is not autocommit, nor is an engine)."""
    if request.param == "dsn":
        with Client(clean, sweep_interval=None) as c:
            yield c
    elif request.param == "pool":
        with ConnectionPool(clean, min_size=1, max_size=4, open=True) as pool:
            yield Client(pool, sweep_interval=None)
    else:
        engine = create_engine(sqlalchemy_url(clean))
        yield Client(engine, sweep_interval=None)
        engine.dispose()


def test_long_poll_wakes_up_on_a_send(any_client: Client, clean: str) -> None:
    any_client.create_queue("jobs")
    any_client.receive("jobs")  # warm the connection up
    start, end, times = woken_by_send(any_client, clean, {"wake": "up"})
    assert end - start < 2
    assert end >= times["sent"]  # it waited for the message rather than returning early


def test_long_poll_in_the_callers_transaction_wakes_up_and_rolls_back(
    client: Client, clean: str
) -> None:
    client.create_queue("jobs")
    with psycopg.connect(clean) as tx:
        thread, times = send_later(clean, "jobs", "hi", after=0.15)
        got = client.receive("jobs", wait=5, conn=tx)
        end = time.monotonic()
        thread.join()
        assert [m.body for m in got] == ["hi"]
        assert times["sent"] <= end < times["committed"] + 0.6
        tx.rollback()  # the lease was part of the caller's transaction
    [m] = client.peek("jobs")
    assert m.receive_count == 0


def test_long_poll_returns_nothing_after_about_the_wait(client: Client) -> None:
    client.create_queue("jobs")
    for wait in (0.6, timedelta(milliseconds=400)):
        start = time.monotonic()
        assert client.receive("jobs", wait=wait) == []
        elapsed = time.monotonic() - start
        expected = wait.total_seconds() if isinstance(wait, timedelta) else wait
        assert expected - 0.02 <= elapsed < expected + 0.5


def test_long_poll_picks_up_a_delayed_message_when_it_comes_due(client: Client) -> None:
    client.create_queue("jobs")
    mid = client.send("jobs", "later", delay=0.5)
    start = time.monotonic()
    got = client.receive("jobs", wait=3)
    elapsed = time.monotonic() - start
    assert [m.id for m in got] == [mid]
    assert 0.45 <= elapsed < 2


def test_long_poll_picks_up_a_lapsed_lease(client: Client) -> None:
    client.create_queue("jobs")
    client.send("jobs", "x")
    [first] = client.receive("jobs", visibility_timeout=0.3)
    start = time.monotonic()
    [again] = client.receive("jobs", wait=3)
    assert again.id == first.id and again.receive_count == 2
    assert time.monotonic() - start < 2


def test_over_limit_on_a_long_poll_returns_nothing(client: Client, clean: str) -> None:
    client.create_queue("jobs", in_flight_limit=1)
    client.send_batch("jobs", [1, 2])
    [held] = client.receive("jobs")
    with pytest.raises(OverLimit):
        client.receive("jobs")
    start = time.monotonic()
    assert client.receive("jobs", wait=0.4) == []
    assert time.monotonic() - start >= 0.38
    # a slot that frees up during the poll is taken
    timer = threading.Timer(0.2, client.delete, ("jobs", held.receipt))
    timer.start()
    start = time.monotonic()
    got = client.receive("jobs", wait=3)
    timer.join()
    assert [m.body for m in got] == [2]
    assert 0.2 <= time.monotonic() - start < 2


def test_receive_wait_of_the_queue_is_used_when_wait_is_none(client: Client, clean: str) -> None:
    client.create_queue("jobs", receive_wait=0.5)
    start = time.monotonic()
    assert client.receive("jobs") == []
    assert 0.48 <= time.monotonic() - start < 1.2
    start = time.monotonic()
    assert client.receive("jobs", wait=0) == []  # an explicit 0 is a short poll
    assert time.monotonic() - start < 0.3
    client.alter_queue("jobs", receive_wait=5)
    thread, times = send_later(clean, "jobs", "x", after=0.15)
    got = client.receive("jobs")
    end = time.monotonic()
    thread.join()
    assert [m.body for m in got] == ["x"]
    assert end - times["committed"] < 0.6


@pytest.mark.parametrize("wait", [25, 20.001, -1, math.nan, math.inf, timedelta(seconds=-0.5)])
def test_wait_out_of_range_is_invalid_parameter(
    client: Client, conn: psycopg.Connection, wait: Any
) -> None:
    client.create_queue("jobs")
    for where in (None, conn):
        start = time.monotonic()
        with pytest.raises(InvalidParameter, match=r"wait = \S+ is out of range: allowed 0 to 20"):
            client.receive("jobs", wait=wait, conn=where)
        assert time.monotonic() - start < 0.3


def test_a_long_poll_leaves_no_listener_on_the_pooled_connection(clean: str) -> None:
    with ConnectionPool(clean, min_size=1, max_size=1, open=True) as pool:
        client = Client(pool, sweep_interval=None)
        client.create_queue("jobs")
        assert client.receive("jobs", wait=0.2) == []
        thread, _ = send_later(clean, "jobs", 1, after=0.1)
        assert len(client.receive("jobs", wait=3)) == 1
        thread.join()
        client.send("jobs", 2)  # a NOTIFY nobody listens to any more
        with pool.connection() as c:
            assert c.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
            assert list(c.notifies(timeout=0.05)) == []


def test_own_pool_stays_listening_between_long_polls(clean: str) -> None:
    """The client's own connection keeps its LISTEN after a long poll (no UNLISTEN round trip
    on the woken poll's way back, no LISTEN on the next), one channel at a time, and the pool's
    lend check drops what arrives meanwhile, so nothing piles up or looks like a dead socket."""
    with Client(clean, min_size=1, max_size=1, sweep_interval=None) as client:
        client.create_queue("jobs")
        client.create_queue("other")
        assert client._pool is not None

        def listening() -> list[str]:
            assert client._pool is not None
            with client._pool.connection() as c:
                return [r[0] for r in c.execute("SELECT pg_listening_channels()").fetchall()]

        assert client.receive("jobs", wait=0.1) == []
        assert listening() == [client.channel("jobs")]
        for i in range(20):
            client.send("jobs", i)  # each may NOTIFY the client's own listening connection
            time.sleep(0.003)  # past the 2 ms debounce
        with client._pool.connection() as c:  # lent: the check has drained them
            assert list(c.notifies(timeout=0.05)) == []
        assert len(client.receive("jobs", 20, wait=1)) == 20
        woken_by_send(client, clean, "late", after=0.2)  # by the kept LISTEN
        assert client.receive("other", wait=0.1) == []
        assert listening() == [client.channel("other")]


def test_long_poll_on_a_queue_dropped_and_created_again_still_wakes_up(
    client: Client, clean: str
) -> None:
    client.create_queue("jobs")
    assert client.receive("jobs", wait=0.1) == []  # the client has listened for "jobs" once
    client.drop_queue("jobs")
    client.create_queue("jobs")  # a new queue (new id) with the same name
    woken_by_send(client, clean, "new")


def test_rows_decode_by_column_name_whatever_the_order() -> None:
    """Rows are tuples matched to the dataclass by column name: in field order they build
    positionally; reordered or with a column a newer schema added they still decode; a
    missing column is an error that says so."""
    from datetime import datetime, timezone

    from queue_pg.types import Message

    now = datetime.now(timezone.utc)
    values = {"id": 7, "queue": "q", "body": {"a": 1}, "attributes": None, "receipt": "r",
              "receive_count": 1, "enqueued_at": now, "first_received_at": now,
              "visible_until": now, "expires_at": None}
    want = Message(**values)
    in_order = tuple(values)
    decode = _ops._many(_ops.message)
    assert decode(in_order, [tuple(values.values())]) == [want]
    shuffled = ("extra", *reversed(in_order))
    assert decode(shuffled, [("x", *reversed(tuple(values.values())))]) == [want]
    with pytest.raises(RuntimeError, match="receipt"):
        decode(tuple(c for c in in_order if c != "receipt"), [tuple(range(9))])
    # the positional builder sets the slots itself: still a frozen, hashable Message
    built = decode(in_order, [tuple(values.values())])[0]
    assert type(built) is Message and built == want and repr(built) == repr(want)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.receipt = "other"  # type: ignore[misc]


TRICKY_BODIES: list[Any] = [
    {"nested": {"list": [1, 2.5, -0.0, 1e308, 2**70, -(2**63)], "t": True, "n": None}},
    "quotes \" and \\ backslashes, tab\t, newline\n",
    "é, 漢字, 🎉 (outside the BMP), \u2028",
    [],
    {},
    0.1,
    12345678901234567890123,
    "",
]


def test_own_pool_loads_jsonb_exactly_as_json_loads(client: queue_pg.Client, clean: str) -> None:
    """The client's own connections load jsonb with the faster loader (_ops._JsonbLoader); every
    body decodes to what json.loads makes of the server's own text for it."""
    client.create_queue("jobs")
    client.send_batch("jobs", TRICKY_BODIES)
    got = client.receive("jobs", 10)
    with psycopg.connect(clean, autocommit=True) as plain:
        texts = dict(plain.execute("select id, body::text from queue_pg.messages").fetchall())
    assert [m.body for m in got] == [json.loads(texts[m.id]) for m in got]
    assert len(got) == len(TRICKY_BODIES)  # (jsonb itself reorders keys, normalises numbers)
    assert sorted(m.body for m in got if isinstance(m.body, str)) == sorted(
        b for b in TRICKY_BODIES if isinstance(b, str)
    )
    with client._borrow() as own:
        assert own.adapters.get_loader(3802, Format.TEXT) is _ops._JsonbLoader


def test_jsonb_loader_falls_back_to_json_loads_and_keeps_custom_loads(conn: psycopg.Connection) -> None:
    """Text PostgreSQL never sends (whitespace around, trailing data, invalid) goes to json.loads,
    so values and errors are its own; a connection whose jsonb loading was customised keeps it."""
    load = _ops._JsonbLoader(3802).load
    assert load(b' {"a": [1, 2]} ') == {"a": [1, 2]}
    for bad in (b'{"a": 1} x', b"{'a': 1}", b""):
        with pytest.raises(json.JSONDecodeError) as got:
            load(bad)
        with pytest.raises(json.JSONDecodeError) as want:
            json.loads(bad)
        assert str(got.value) == str(want.value)

    set_json_loads(lambda text: ("custom", text), conn)
    _ops.fast_jsonb(conn.adapters)
    assert conn.adapters.get_loader(3802, Format.TEXT) is not _ops._JsonbLoader
    assert conn.execute("""select '{"a": 1}'::jsonb""").fetchone() == (("custom", b'{"a": 1}'),)
