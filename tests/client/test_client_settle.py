"""The client tests, delete, change_visibility, update: run against both clients (see conftest.py)."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

import psycopg
import pytest

from client.helpers import Snapshot, about, advance, db_messages
from queue_pg import (
    Client,
    DeleteResult,
    InvalidParameter,
    InvalidReceipt,
    LeaseLimitExceeded,
    Message,
    MessageNotFound,
    MessageTooLarge,
    QueueNotFound,
    StaleReceipt,
)


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
