"""The client tests, errors: run against both clients (see conftest.py)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import queue_pg
from client.helpers import Snapshot
from queue_pg import (
    Client,
    InvalidParameter,
    InvalidReceipt,
    LeaseLimitExceeded,
    MessageNotFound,
    MessageTooLarge,
    OverLimit,
    QueueAlreadyExists,
    QueueError,
    QueueInUse,
    QueueNotFound,
    StaleReceipt,
)


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


def test_wrong_argument_types_are_refused_before_any_round_trip(
    client: Any, snapshot: Snapshot
) -> None:
    """A str where a number is due, a bool for a duration, a float count: InvalidParameter that
    names the parameter, raised by the client itself (no SQLSTATE), and nothing changed."""
    client.create_queue("jobs")
    client.send("jobs", "x")
    before = snapshot()
    for call, name in (
        (lambda: client.send("jobs", 1, delay="5"), "delay"),
        (lambda: client.send("jobs", 1, delay=True), "delay"),
        (lambda: client.receive("jobs", 1.5), "max_messages"),
        (lambda: client.receive("jobs", 1, wait="1"), "wait"),
        (lambda: client.change_visibility("jobs", "r", "10"), "timeout"),
        (lambda: client.peek("jobs", "2"), "n"),
        (lambda: client.create_queue("other", visibility_timeout="30"), "visibility_timeout"),
    ):
        with pytest.raises(InvalidParameter, match=rf"^{name} = ") as err:
            call()
        assert err.value.sqlstate is None
    assert snapshot() == before


def test_a_body_nested_too_deep_to_encode_is_invalid_parameter(
    client: Any, snapshot: Snapshot
) -> None:
    client.create_queue("jobs")
    before = snapshot()
    deep: list[Any] = []
    inner = deep
    for _ in range(5000):
        inner.append([])
        inner = inner[0]
    with pytest.raises(InvalidParameter, match="nested too deep"):
        client.send("jobs", deep)
    assert snapshot() == before
