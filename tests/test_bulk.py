"""Bulk sends once per key (sql/api/58_bulk.sql), at the SQL level: stage, COPY, send_staged."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from queue_pg import Client
from queue_pg.errors import (
    AccessDenied,
    GroupRequired,
    InvalidParameter,
    MessageTooLarge,
    translate,
)
from tests.test_access import PRODUCER, MakeRole, make_role  # noqa: F401

COPY = "COPY pg_temp.queue_pg_staging ({}) FROM STDIN"
COLUMNS = ("body", "attributes", "dedup_id", "group_id")


def send_chunk(
    conn: psycopg.Connection[Any],
    rows: list[tuple[str | None, ...]],
    key: tuple[str, str, int, int] = ("jobs", "w", 0, 0),
    *,
    commit: bool = True,
) -> int | None:
    """stage, COPY, send_staged in one transaction; the number sent (None: written before)."""
    with translate():
        conn.execute("BEGIN")
        conn.execute("SELECT queue_pg.stage(%s, %s, %s, %s)", key)
        width = len(rows[0]) if rows else 2
        with conn.cursor().copy(COPY.format(", ".join(COLUMNS[:width]))) as copy:
            for row in rows:
                copy.write_row(row)
        got = conn.execute("SELECT queue_pg.send_staged(%s, %s, %s, %s)", key).fetchone()
        if commit:
            conn.execute("COMMIT")
    assert got is not None
    return None if got[0] is None else int(got[0])


def bodies(conn: psycopg.Connection[Any]) -> list[Any]:
    return [r[0] for r in conn.execute("SELECT body FROM queue_pg.messages ORDER BY id")]


@pytest.fixture
def jobs(client: Client) -> Client:
    client.create_queue("jobs", max_message_size=1024)
    return client


def test_a_chunk_is_sent_once_in_staging_order_and_a_second_send_is_skipped(
    jobs: Client, conn: psycopg.Connection[Any]
) -> None:
    rows = [(f'{{"i": {i}}}', '{"type": "t"}' if i % 2 else None) for i in range(5)]
    with psycopg.connect(conn.info.dsn, autocommit=True) as w:
        assert w.execute("SELECT queue_pg.stage('jobs', 'w', 0, 0)").fetchone() == (False,)
        w.execute("ROLLBACK")
        assert send_chunk(w, rows) == 5
        assert w.execute("SELECT queue_pg.stage('jobs', 'w', 0, 0)").fetchone() == (True,)
        assert send_chunk(w, rows) is None
        assert send_chunk(w, rows, ("jobs", "w", 0, 1)) == 5
    assert bodies(conn) == [{"i": i} for i in range(5)] * 2
    assert conn.execute(
        "SELECT count(*) FILTER (WHERE attributes IS NULL) FROM queue_pg.messages"
    ).fetchone() == (6,)
    assert conn.execute(
        "SELECT chunk, messages FROM queue_pg.bulk_writes ORDER BY chunk"
    ).fetchall() == [(0, 5), (1, 5)]


def test_a_concurrent_duplicate_waits_for_the_first_then_sends_nothing(
    jobs: Client, conn: psycopg.Connection[Any]
) -> None:
    rows = [('{"n": 1}', None), ('{"n": 2}', None)]
    results: list[int | None] = []
    with psycopg.connect(conn.info.dsn, autocommit=True) as first, psycopg.connect(
        conn.info.dsn, autocommit=True
    ) as second:
        assert send_chunk(first, rows, commit=False) == 2
        thread = threading.Thread(target=lambda: results.append(send_chunk(second, rows)))
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive(), "the duplicate must wait on the key the first one holds"
        first.execute("COMMIT")
        thread.join(10)
    assert results == [None]
    assert bodies(conn) == [{"n": 1}, {"n": 2}]


def test_a_rolled_back_writer_leaves_the_key_to_the_next(jobs: Client, conn: psycopg.Connection[Any]) -> None:
    rows = [('{"n": 1}', None)]
    with psycopg.connect(conn.info.dsn, autocommit=True) as w:
        assert send_chunk(w, rows, commit=False) == 1
        w.execute("ROLLBACK")
        assert send_chunk(w, rows) == 1
    assert bodies(conn) == [{"n": 1}]


@pytest.mark.parametrize(
    ("rows", "error", "message"),
    [
        ([("1", None), ("2", "[1]")], InvalidParameter,
         "attributes[1] is a JSON array: allowed a JSON object or NULL"),
        ([("1", None), ("1", None), (None, None)], InvalidParameter,
         "body[2] = NULL is invalid: allowed any JSON value (use JSON null, not SQL NULL)"),
        ([('"' + "x" * 1100 + '"', None)], MessageTooLarge,
         "body[0] and attributes[0] are 1100 bytes: allowed up to max_message_size = 1024 bytes of queue 'jobs'"),
    ],
)
def test_a_bad_row_refuses_the_chunk_and_changes_nothing(
    jobs: Client, conn: psycopg.Connection[Any], rows: list[tuple[str | None, str | None]],
    error: type[Exception], message: str,
) -> None:
    with psycopg.connect(conn.info.dsn, autocommit=True) as w, pytest.raises(error) as err:
        send_chunk(w, rows)  # type: ignore[arg-type]
    assert str(err.value) == message
    assert bodies(conn) == []
    assert conn.execute("SELECT count(*) FROM queue_pg.bulk_writes").fetchone() == (0,)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (("jobs", "", 0, 0), "write_id = '' is invalid: allowed text of 1 to 200 characters"),
        (("jobs", "w", -1, 0), "part = -1 is out of range: allowed 0 to 2147483647 (a partition number)"),
        (("jobs", "w", 0, -2), "chunk = -2 is out of range: allowed 0 to 2147483647 (a chunk number within the partition)"),
    ],
)
def test_a_bad_key_is_refused(jobs: Client, conn: psycopg.Connection[Any], key: tuple[str, str, int, int], message: str) -> None:
    with pytest.raises(InvalidParameter) as err, translate():
        conn.execute("SELECT queue_pg.stage(%s, %s, %s, %s)", key)
    assert str(err.value) == message


def test_a_producer_with_a_send_grant_stages_and_sends(
    jobs: Client, conn: psycopg.Connection[Any], make_role: MakeRole  # noqa: F811
) -> None:
    producer = make_role("bulk", PRODUCER)
    with producer.connect() as w, pytest.raises(AccessDenied):
        send_chunk(w, [("1", None)])
    jobs.grant("jobs", producer.name, "send")
    with producer.connect() as w:
        assert send_chunk(w, [("1", None), ('{"a": 2}', '{"type": "x"}')]) == 2
        # the staging table is the owner's: the producer may fill it, not read, empty or drop it
        for sql in ("SELECT * FROM pg_temp.queue_pg_staging", "TRUNCATE pg_temp.queue_pg_staging",
                    "DROP TABLE pg_temp.queue_pg_staging"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                w.execute(sql)
        # the key is the writer's own: the owner writing the same key is another key
    with psycopg.connect(conn.info.dsn, autocommit=True) as w:
        assert send_chunk(w, [("3", None)]) == 1
    assert bodies(conn) == [1, {"a": 2}, 3]


def test_a_relation_planted_under_the_staging_name_is_refused(
    jobs: Client, conn: psycopg.Connection[Any], make_role: MakeRole  # noqa: F811
) -> None:
    producer = make_role("planter", PRODUCER)
    jobs.grant("jobs", producer.name, "send")
    with producer.connect() as w:
        w.execute("CREATE TEMP VIEW queue_pg_staging AS SELECT '1'::jsonb AS body, NULL::jsonb AS attributes")
        for call in ("SELECT queue_pg.stage('jobs', 'w', 0, 0)",
                     "SELECT queue_pg.send_staged('jobs', 'w', 0, 0)"):
            with pytest.raises(InvalidParameter, match="is not the staging table of queue_pg"), translate():
                w.execute(call)
    assert bodies(conn) == []


def test_the_sweep_forgets_keys_older_than_the_history_retention(
    jobs: Client, conn: psycopg.Connection[Any]
) -> None:
    jobs.alter_queue("jobs", history_retention=3600)
    with psycopg.connect(conn.info.dsn, autocommit=True) as w:
        for chunk in range(3):
            send_chunk(w, [("1", None)], ("jobs", "w", 0, chunk))
    conn.execute("UPDATE queue_pg.bulk_writes SET written_at = written_at - interval '2 hours' WHERE chunk < 2")
    jobs.sweep()
    assert conn.execute("SELECT chunk FROM queue_pg.bulk_writes").fetchall() == [(2,)]


def test_a_bulk_send_honours_routes_like_send(jobs: Client, conn: psycopg.Connection[Any]) -> None:
    """Rows whose type has a route land in its target, in staging order, counted and woken
    there; the key stays the source queue's, so a re-send still sends nothing."""
    jobs.create_queue("jobs-slow")
    jobs.create_queue("jobs-bulky")
    jobs.add_route("jobs", "slow", "jobs-slow")
    jobs.add_route("jobs", "bulky", "jobs-bulky")
    types = ["fast", "slow", None, "slow", "bulky", "other"]
    rows = [(f'{{"i": {i}}}', None if t is None else f'{{"type": "{t}"}}') for i, t in enumerate(types)]
    with psycopg.connect(conn.info.dsn, autocommit=True) as w:
        assert send_chunk(w, rows) == 6
        assert send_chunk(w, rows) is None
    landed = conn.execute(
        "SELECT q.name, array_agg((m.body ->> 'i')::int ORDER BY m.id) FROM queue_pg.messages m"
        " JOIN queue_pg.queues q ON q.id = m.queue_id GROUP BY q.name ORDER BY q.name").fetchall()
    assert landed == [("jobs", [0, 2, 5]), ("jobs-bulky", [4]), ("jobs-slow", [1, 3])]
    sent = {r[0]: r[1] for r in conn.execute("SELECT queue, sent FROM queue_pg.queue_stats")}
    assert sent == {"jobs": 3, "jobs-slow": 2, "jobs-bulky": 1}
    assert conn.execute("SELECT messages FROM queue_pg.bulk_writes").fetchall() == [(6,)]
    # the same as send_batch routes them
    jobs.send_batch("jobs", [{"i": i} for i in range(6)],
                    attributes=[{} if t is None else {"type": t} for t in types])
    again = conn.execute(
        "SELECT q.name, count(*) FROM queue_pg.messages m JOIN queue_pg.queues q ON q.id = m.queue_id"
        " GROUP BY q.name ORDER BY q.name").fetchall()
    assert again == [("jobs", 6), ("jobs-bulky", 2), ("jobs-slow", 4)]


def test_staged_dedup_ids_follow_send_batch_rules(jobs: Client, conn: psycopg.Connection[Any]) -> None:
    """Dedup ids through the bulk path: a duplicate within the chunk, one sent before within the
    window (by send), and a retried chunk (same key) each send nothing; the count is the fresh."""
    jobs.send("jobs", {"i": "before"}, dedup_id="d-1")
    rows = [(f'{{"i": {i}}}', None, f"d-{i % 4}", None) for i in range(8)]  # d-0..d-3, each twice
    with psycopg.connect(conn.info.dsn, autocommit=True) as w:
        assert send_chunk(w, rows) == 3  # d-0, d-2, d-3: d-1 was sent before, the rest repeat
        assert send_chunk(w, rows) is None  # the retried chunk: the key is written
        assert send_chunk(w, rows, ("jobs", "w", 0, 1)) == 0  # a new key, every id in the window
        assert w.execute("SELECT messages FROM queue_pg.bulk_writes ORDER BY chunk").fetchall() == [(3,), (0,)]
        # the same rule as send_batch: an id of 129 characters is refused, named by its place
        with pytest.raises(InvalidParameter, match=r"dedup_id\[1\] = 'xxx.*allowed 1 to 128 characters"):
            send_chunk(w, [('{"i": 9}', None, None, None), ('{"i": 10}', None, "x" * 129, None)],
                       ("jobs", "w", 0, 2))
        w.execute("ROLLBACK")
    assert bodies(conn) == [{"i": "before"}, {"i": 0}, {"i": 2}, {"i": 3}]
    assert jobs.send_batch("jobs", [{"i": "again"}], dedup_ids=["d-3"]) == [
        conn.execute("SELECT id FROM queue_pg.messages WHERE body = '{\"i\": 3}'").fetchone()[0]]  # type: ignore[index]


def test_staged_groups_reach_a_fifo_queue_in_order(client: Client, conn: psycopg.Connection[Any]) -> None:
    client.create_queue("ordered", fifo=True)
    key = ("ordered", "w", 0, 0)
    with psycopg.connect(conn.info.dsn, autocommit=True) as w:
        with pytest.raises(GroupRequired, match=r"group\[2\] = NULL is invalid: queue 'ordered' is a FIFO queue"):
            send_chunk(w, [('{"i": 0}', None, None, "a"), ('{"i": 1}', None, None, "b"),
                           ('{"i": 2}', None, None, None)], key)
        w.execute("ROLLBACK")
        rows = [(f'{{"i": {i}}}', None, None, "ab"[i % 2]) for i in range(6)]
        assert send_chunk(w, rows, key) == 6
    got = conn.execute("SELECT group_id, body->>'i', visible_at < 'infinity' FROM queue_pg.messages"
                       " ORDER BY id").fetchall()
    assert got == [("ab"[i % 2], str(i), i < 2) for i in range(6)]  # one head per group
    # a receive takes each group's messages with its head, in the group's order (as SQS)
    got = [m.body["i"] for m in client.receive("ordered", max_messages=10, visibility_timeout=30)]
    assert sorted(got) == list(range(6))
    assert [i for i in got if i % 2 == 0] == [0, 2, 4] and [i for i in got if i % 2] == [1, 3, 5]
