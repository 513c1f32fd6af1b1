"""The client tests, send: run against both clients (see conftest.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from client.helpers import Snapshot
from queue_pg import (
    Client,
    InvalidParameter,
    MessageTooLarge,
    QueueError,
    QueueNotFound,
)


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


def test_groups_on_a_fifo_queue(client: Client, connect: Callable[[], Any]) -> None:
    """Both clients pass ``group`` (one name or a list); a send in the caller's transaction
    joins its group when it commits."""
    from queue_pg import GroupRequired

    client.create_queue("fifo", fifo=True)
    with pytest.raises(GroupRequired):
        client.send("fifo", 1)
    with pytest.raises(InvalidParameter, match="group = 5 is not a string"):
        client.send("fifo", 1, group=5)  # type: ignore[arg-type]
    client.send_batch("fifo", [1, 2], group="a")
    client.send_batch("fifo", [10, 20], group=["b", "b"])
    with connect() as tx:
        client.send("fifo", 3, group="a", conn=tx)
    got = client.receive("fifo", 10, visibility_timeout=30)  # each group in its order (as SQS)
    bodies = [m.body for m in got]
    assert sorted(bodies) == [1, 2, 3, 10, 20]
    assert [b for b in bodies if b < 10] == [1, 2, 3] and [b for b in bodies if b >= 10] == [10, 20]
    assert client.receive("fifo", 10) == []  # both groups are held while their messages are out
    for m in got[:1] + got[-1:]:
        client.delete("fifo", m.receipt)
    assert client.receive("fifo", 10) == []  # still held: the rest of each group is leased
