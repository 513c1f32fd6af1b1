"""Deduplication and redrive tasks through both clients (see conftest.py); time moves with
``advance`` on a connection passed as ``conn=``."""

from __future__ import annotations

import hashlib
import json
import math
import re
import time

import psycopg
import pytest

from client.helpers import advance, db_messages
from queue_pg import (
    Client,
    InvalidParameter,
    QueueNotFound,
    RedriveAllow,
    RedriveInProgress,
    RedriveTask,
    RedriveTaskNotFound,
)


def _dedup_rows(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM queue_pg.dedup").fetchone()
    assert row is not None
    return int(row[0])


def test_a_dedup_id_sends_once_within_the_window_even_after_delete(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs")
    first = client.send("jobs", {"n": 1}, dedup_id="order-1", conn=conn)
    assert client.send("jobs", {"n": 2}, dedup_id="order-1", conn=conn) == first
    assert client.send("jobs", {"n": 3}, dedup_id="order-2", conn=conn) != first
    received = client.receive("jobs", 10, conn=conn)
    assert (received[0].id, received[0].body) == (first, {"n": 1})
    for m in received:
        assert client.delete("jobs", m.receipt, conn=conn)  # type: ignore[arg-type]
    assert client.send("jobs", {"n": 4}, dedup_id="order-1", conn=conn) == first
    assert client.receive("jobs", 10, conn=conn) == []
    advance(conn, 301)  # past the default window of 300 s: the id is free again
    again = client.send("jobs", {"n": 5}, dedup_id="order-1", conn=conn)
    assert again != first
    assert [x.body for x in client.receive("jobs", 10, conn=conn)] == [{"n": 5}]


def test_sends_without_ids_never_touch_the_dedup_table(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs")
    client.send("jobs", 1)
    client.send_batch("jobs", [1, 1, 1])
    assert db_messages(conn) == 4 and _dedup_rows(conn) == 0


def test_content_dedup_takes_the_sha256_of_the_body(
    client: Client, conn: psycopg.Connection
) -> None:
    q = client.create_queue("jobs", content_dedup=True, dedup_window=60)
    assert (q.content_dedup, q.dedup_window) == (True, 60)
    a = client.send("jobs", {"b": 1, "a": [1, 2]})
    assert client.send("jobs", {"a": [1, 2], "b": 1}) == a  # the same JSON value
    assert client.send("jobs", {"a": [2, 1], "b": 1}) != a
    assert client.send("jobs", {"b": 1, "a": [1, 2]}, dedup_id="own") != a  # an id wins
    [(key,)] = conn.execute(
        "SELECT dedup_id FROM queue_pg.dedup WHERE message_id = %s", [a]).fetchall()
    text = json.dumps({"a": [1, 2], "b": 1})  # jsonb's printed form
    assert key == hashlib.sha256(text.encode()).hexdigest()
    assert client.alter_queue("jobs", content_dedup=False).content_dedup is False
    assert client.send("jobs", {"b": 1, "a": [1, 2]}) != a
    assert db_messages(conn) == 4


def test_send_batch_dedups_within_the_batch_and_across_batches(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs")
    ids = client.send_batch("jobs", ["a", "b", "a2", "c", "n"],
                            dedup_ids=["x", "y", "x", "z", None])
    assert len(set(ids)) == 4 and ids[2] == ids[0]
    again = client.send_batch("jobs", ["b2", "w", "c2", "n2"], dedup_ids=["y", "w", "z", None])
    assert again[0] == ids[1] and again[2] == ids[3] and again[1] not in ids
    assert client.send("jobs", "x again", dedup_id="x") == ids[0]
    # every id distinct in the batch, some held: the others are sent
    mixed = client.send_batch("jobs", ["p", "x3", "q"], dedup_ids=["p", "x", "q"])
    assert mixed[1] == ids[0] and len(set(mixed) | set(ids) | set(again)) == 8
    bodies = sorted(m.body for m in client.receive("jobs", 100, conn=conn))
    assert bodies == ["a", "b", "c", "n", "n2", "p", "q", "w"]
    assert client.stats("jobs").visible == 0


def test_dedup_ids_are_checked(client: Client) -> None:
    client.create_queue("jobs")
    with pytest.raises(InvalidParameter, match="dedup_id = ''"):
        client.send("jobs", 1, dedup_id="")
    with pytest.raises(InvalidParameter, match="allowed 1 to 128 characters"):
        client.send("jobs", 1, dedup_id="x" * 129)
    with pytest.raises(InvalidParameter, match=r"dedup_id\[1\]"):
        client.send_batch("jobs", [1, 2], dedup_ids=["a", ""])
    with pytest.raises(InvalidParameter, match=r"len\(dedup_ids\) = 1"):
        client.send_batch("jobs", [1, 2], dedup_ids=["a"])
    with pytest.raises(InvalidParameter, match="dedup_id"):
        client.send("jobs", 1, dedup_id=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter, match="dedup_window = 0"):
        client.create_queue("other", dedup_window=0)
    assert client.send("jobs", 1, dedup_id="x" * 128) > 0


def test_sweep_forgets_ended_windows(client: Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs", dedup_window=10)
    client.send_batch("jobs", list(range(5)), dedup_ids=[str(i) for i in range(5)])
    client.sweep(conn=conn)
    assert _dedup_rows(conn) == 5
    advance(conn, 11)
    client.sweep(conn=conn)
    assert _dedup_rows(conn) == 0


# --- redrive tasks ---------------------------------------------------------------------------


def _dead_letters(conn: psycopg.Connection, n: int) -> list[int]:
    """n messages of "jobs" dead-lettered into "dlq" (by the owner, as a receive would)."""
    rows = conn.execute(
        "WITH s AS (SELECT id FROM queue_pg.queues WHERE name = 'jobs'),"
        " d AS (SELECT id FROM queue_pg.queues WHERE name = 'dlq')"
        " INSERT INTO queue_pg.messages (queue_id, source_queue_id, visible_at, enqueued_at,"
        " receive_count, body) SELECT d.id, s.id, now() - interval '1 s', now(), 3, to_jsonb(i)"
        " FROM s, d, generate_series(1, %s) i RETURNING id", [n]).fetchall()
    return [r[0] for r in rows]


def _setup(client: Client) -> None:
    client.create_queue("dlq")
    client.create_queue("jobs", dead_letter_queue="dlq", max_receive_count=3)


def test_a_redrive_task_without_rate_moves_everything(
    client: Client, conn: psycopg.Connection
) -> None:
    _setup(client)
    ids = _dead_letters(conn, 30)
    task = client.start_redrive("dlq")
    [t] = client.list_redrives("dlq")
    assert isinstance(t, RedriveTask)
    assert (t.id, t.dlq, t.target, t.rate, t.status, t.moved, t.to_move) == (
        task, "dlq", None, None, "completed", 30, 30)
    assert t.finished_at is not None and t.error is None
    back = client.receive("jobs", 100)
    assert sorted(m.id for m in back) == ids and all(m.receive_count == 1 for m in back)
    assert client.list_redrives() == [t]


def test_a_redrive_task_keeps_its_rate_and_cancel_keeps_what_moved(
    client: Client, conn: psycopg.Connection
) -> None:
    _setup(client)
    client.create_queue("other")
    _dead_letters(conn, 100)
    began = time.monotonic()

    def real() -> int:  # what the real clock, on top of the advances, allows at 5 a second
        return math.ceil(5 * (time.monotonic() - began))

    task = client.start_redrive("dlq", to="other", rate=5, conn=conn)
    [t] = client.list_redrives("dlq", conn=conn)
    assert (t.status, t.moved, t.to_move, t.target, t.rate) == ("running", 5, 100, "other", 5)
    assert 0 <= client.redrive_step(conn=conn) <= real()  # no time passed but the real clock's
    advance(conn, 4)
    client.redrive_step(conn=conn)
    [t] = client.list_redrives("dlq", conn=conn)
    assert 25 <= t.moved <= 25 + real()  # 5 a second for 4 more seconds
    with pytest.raises(RedriveInProgress, match="id " + str(task)):
        client.start_redrive("dlq")
    advance(conn, 2)
    client.sweep(conn=conn)  # sweeps advance the tasks too
    cancelled = client.cancel_redrive(task, conn=conn)
    moved = cancelled.moved
    assert cancelled.status == "cancelled" and 35 <= moved <= 35 + real()
    assert client.stats("other", conn=conn).visible == moved
    assert client.stats("dlq", conn=conn).visible == 100 - moved
    advance(conn, 100)
    assert client.redrive_step(conn=conn) == 0
    assert client.cancel_redrive(task, conn=conn) == cancelled  # ended: unchanged
    again = client.start_redrive("dlq")  # one at a time: the next may start
    assert client.list_redrives("dlq")[0].id == again != task
    assert client.stats("jobs", conn=conn).visible == 100 - moved


def test_redrive_task_errors(client: Client, conn: psycopg.Connection) -> None:
    _setup(client)
    client.create_queue("gone")
    with pytest.raises(QueueNotFound):
        client.start_redrive("nope")
    with pytest.raises(InvalidParameter, match="rate = 0 is out of range"):
        client.start_redrive("dlq", rate=0)
    with pytest.raises(InvalidParameter, match="to = 'dlq' is invalid"):
        client.start_redrive("dlq", to="dlq")
    with pytest.raises(InvalidParameter, match="rate = '5' is not a number"):
        client.start_redrive("dlq", rate="5")  # type: ignore[arg-type]
    with pytest.raises(RedriveTaskNotFound, match="redrive task 12345"):
        client.cancel_redrive(12345)
    _dead_letters(conn, 10)
    task = client.start_redrive("dlq", to="gone", rate=1, conn=conn)
    client.drop_queue("gone")
    advance(conn, 5)
    assert client.redrive_step(conn=conn) == 0
    [t] = client.list_redrives("dlq")
    assert (t.id, t.status, t.moved) == (task, "failed", 1)
    assert t.error is not None and "'gone'" in t.error
    client.create_queue("empty")
    client.start_redrive("empty")
    [t] = client.list_redrives("empty")
    assert (t.status, t.moved, t.to_move) == ("completed", 0, 0)


def test_duplicates_are_not_counted_as_sent_and_routes_apply_to_the_first(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs", content_dedup=True)
    client.create_queue("mail")
    client.add_route("jobs", "mail", "mail")
    first = client.send("jobs", {"to": "a"}, attributes={"type": "mail"})
    assert client.send("jobs", {"to": "a"}, attributes={"type": "mail"}) == first
    ids = client.send_batch("jobs", [{"to": "a"}, {"to": "b"}, {"to": "b"}, {"x": 1}],
                            attributes=[{"type": "mail"}, {"type": "mail"}, {"type": "mail"}, None])
    assert ids[0] == first and ids[2] == ids[1] and len(set(ids)) == 3
    [jobs] = client.queue_health("jobs")
    [mail] = client.queue_health("mail")
    assert (jobs.sent, mail.sent) == (1, 2)
    assert sorted(m.body["to"] for m in client.receive("mail", 10)) == ["a", "b"]


def test_a_sweep_forgets_at_most_its_batch_of_ended_windows(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs", dedup_window=1)
    ids = client.send_batch("jobs", list(range(30)), dedup_ids=[str(i) for i in range(30)])
    advance(conn, 2)
    conn.execute("SELECT queue_pg.sweep(10)")
    assert _dedup_rows(conn) == 20
    # swept or not, an ended window's id is free: its next send is a new message
    assert client.send("jobs", "new", dedup_id="29", conn=conn) not in ids
    assert _dedup_rows(conn) in (20, 21)


def test_a_task_goes_on_from_another_client(client: Client, clean: str) -> None:
    """Its state is a row: a client (or worker) that started it may be gone; any other's
    sweep or step of a role that manages the queue carries on."""
    _setup(client)
    with psycopg.connect(clean, autocommit=True) as c:
        _dead_letters(c, 20)
    task = client.start_redrive("dlq", rate=10)
    with psycopg.connect(clean, autocommit=True) as later:
        advance(later, 5)
        later.execute("SELECT queue_pg.sweep()")
        [(moved, status)] = later.execute(
            "SELECT moved, status FROM queue_pg.list_redrives('dlq') WHERE id = %s", [task]
        ).fetchall()
    assert (moved, status) == (20, "completed")


def test_redrive_allow_decides_which_queues_may_dead_letter_into_a_queue(client: Client) -> None:
    client.create_queue("dlq")
    assert client.redrive_allow("dlq") == RedriveAllow("allow_all")
    assert client.set_redrive_allow("dlq", "by_queue", ["b", "a", "a"]) == RedriveAllow(
        "by_queue", ("a", "b"))
    assert client.redrive_allow("dlq") == RedriveAllow("by_queue", ("a", "b"))
    client.create_queue("a", dead_letter_queue="dlq", max_receive_count=3)
    with pytest.raises(InvalidParameter, match="dead_letter_queue = 'dlq' is not allowed for queue 'c'"):
        client.create_queue("c", dead_letter_queue="dlq", max_receive_count=3)
    client.create_queue("c")
    with pytest.raises(InvalidParameter, match="by_queue"):
        client.alter_queue("c", dead_letter_queue="dlq", max_receive_count=3)
    assert client.get_queue("c").dead_letter_queue is None  # bad input changes nothing
    client.set_redrive_allow("dlq", "deny_all")
    with pytest.raises(InvalidParameter, match="deny_all"):
        client.create_queue("b", dead_letter_queue="dlq", max_receive_count=3)
    # queues linked before the change stay linked, and their other settings still change
    assert client.alter_queue("a", visibility_timeout=5).dead_letter_queue == "dlq"
    assert client.set_redrive_allow("dlq", "allow_all") == RedriveAllow("allow_all")
    client.alter_queue("c", dead_letter_queue="dlq", max_receive_count=3)
    for permission, sources, says in (
        ("some", None, "permission = 'some' is invalid"),
        ("by_queue", None, "by_queue takes 1 to 10 queue names"),
        ("deny_all", ["a"], "by_queue takes 1 to 10 queue names"),
        ("by_queue", [], "len(sources) = 0"),
        ("by_queue", [f"q{i}" for i in range(11)], "len(sources) = 11"),
        ("by_queue", ["a b"], "'a b' is not a queue name"),
    ):
        with pytest.raises(InvalidParameter, match=re.escape(says)):
            client.set_redrive_allow("dlq", permission, sources)
    assert client.redrive_allow("dlq") == RedriveAllow("allow_all")
    with pytest.raises(QueueNotFound):
        client.set_redrive_allow("nope", "deny_all")
