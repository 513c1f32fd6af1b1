"""The client tests, peek, purge, sweep, stats, redrive: run against both clients (see conftest.py)."""

from __future__ import annotations

import time

import psycopg
import pytest

from client.helpers import advance, db_messages
from queue_pg import (
    Client,
    InvalidParameter,
    QueueNotFound,
    QueueStats,
    StaleReceipt,
)


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
    assert empty == QueueStats("jobs", 0, 0, 0, 0, None, 0, 0, False)
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
