"""The client tests, receive: run against both clients (see conftest.py)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from client.helpers import Snapshot, about, advance
from queue_pg import (
    Client,
    InvalidParameter,
    Message,
    QueueNotFound,
)


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
