"""A backend killed with ``pg_terminate_backend`` in the middle of a call: nothing half-done.

Each call runs in one statement with a ``pg_sleep`` after the queue function (so its writes are
made, not yet committed) on a connection of this test's own; another connection terminates that
backend (only ever the pid of our own connection) while it sleeps. Afterwards the queue is as if
the call had never been made, and the next call works.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import conninfo

from queue_pg import Client

pytestmark = pytest.mark.faults

Q = "termq"


def run_and_terminate(dsn: str, work: Callable[[psycopg.Connection], object]) -> None:
    """Run ``work`` on a fresh connection and terminate its backend once it sleeps."""
    victim = psycopg.connect(dsn, autocommit=True)
    pid = victim.info.backend_pid
    failure: list[BaseException] = []

    def go() -> None:
        try:
            work(victim)
        except BaseException as exc:
            failure.append(exc)

    t = threading.Thread(target=go)
    t.start()
    with psycopg.connect(dsn, autocommit=True) as admin:
        deadline = time.monotonic() + 10
        while True:
            row = admin.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                [pid]).fetchone()
            if row and row[0] == "PgSleep":
                break
            assert time.monotonic() < deadline, "the call never reached its sleep"
            time.sleep(0.01)
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
    t.join(10)
    victim.close()
    assert len(failure) == 1 and isinstance(failure[0], psycopg.OperationalError), failure


def snapshot(conn: psycopg.Connection) -> tuple[object, ...]:
    """Everything a queue call could change."""
    msgs = conn.execute(
        "SELECT id, queue_id, visible_at, receive_count, lease_no, lease_expiries, released,"
        " body, attributes, first_received_at, last_received_at FROM queue_pg.messages ORDER BY id"
    ).fetchall()
    hist = conn.execute("SELECT * FROM queue_pg.message_history ORDER BY message_id").fetchall()
    stats = conn.execute(
        "SELECT queue, visible, in_flight, delayed, dead_lettered, stale_receipts, lease_expiries"
        " FROM queue_pg.queue_stats ORDER BY queue").fetchall()
    return msgs, hist, stats


@pytest.fixture
def setup(client: Client, conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
    client.create_queue("termq-dlq")
    client.create_queue(Q, visibility_timeout=30, dead_letter_queue="termq-dlq",
                        max_receive_count=5)
    conn.execute("CREATE TABLE IF NOT EXISTS term_orders (id serial PRIMARY KEY, note text)")
    conn.execute("TRUNCATE term_orders")
    yield conn
    conn.execute("DROP TABLE term_orders")  # the run's database is shared with other tests


def test_terminated_receive_leases_nothing(setup: psycopg.Connection, client: Client,
                                           clean: str) -> None:
    client.send_batch(Q, [1, 2, 3])
    # one of them was received before and its lease lapsed: the killed receive would redeliver it
    lapsed = client.receive(Q, 1, visibility_timeout=0.05)
    time.sleep(0.1)
    before = snapshot(setup)
    run_and_terminate(clean, lambda c: c.execute(
        "SELECT r.id, pg_sleep(30) FROM queue_pg.receive(%s, 3, visibility_timeout => 60) r", [Q]))
    assert snapshot(setup) == before
    got = client.receive(Q, 3)
    assert sorted(m.receive_count for m in got) == [1, 1, 2]
    assert lapsed[0].id in {m.id for m in got}


def test_rolled_back_receive_does_not_count_a_lease_expiry(
    setup: psycopg.Connection, client: Client, clean: str
) -> None:
    client.send(Q, 1)
    client.receive(Q, 1, visibility_timeout=0.05)
    time.sleep(0.1)
    run_and_terminate(clean, lambda c: c.execute(
        "SELECT r.id, pg_sleep(30) FROM queue_pg.receive(%s, 1) r", [Q]))
    assert client.stats(Q).lease_expiries == 0  # nothing was redelivered yet
    got = client.receive(Q, 1)
    client.delete(Q, got[0].receipt or "")
    history = setup.execute("SELECT lease_expiries FROM queue_pg.message_history").fetchall()
    assert history == [(1,)]
    assert client.stats(Q).lease_expiries == 1


def test_terminated_deletes_delete_nothing(setup: psycopg.Connection, client: Client,
                                           clean: str) -> None:
    client.send_batch(Q, [1, 2, 3])
    got = client.receive(Q, 3)
    before = snapshot(setup)
    run_and_terminate(clean, lambda c: c.execute(
        "SELECT queue_pg.delete_message(%s, %s), pg_sleep(30)", [Q, got[0].receipt]))
    assert snapshot(setup) == before
    run_and_terminate(clean, lambda c: c.execute(
        "SELECT d.*, pg_sleep(30) FROM queue_pg.delete_batch(%s, %s) d",
        [Q, [m.receipt for m in got]]))
    assert snapshot(setup) == before
    run_and_terminate(clean, lambda c: c.execute(
        "SELECT queue_pg.change_visibility(%s, %s, 100), queue_pg.dead_letter(%s, %s, 'x'),"
        " pg_sleep(30)", [Q, got[0].receipt, Q, got[1].receipt]))
    assert snapshot(setup) == before
    # the receipts still hold their leases: the deletes that were cut off can be made now
    assert [r.deleted for r in client.delete_batch(Q, [m.receipt or "" for m in got])] == [True] * 3


def test_terminated_transactional_enqueue_leaves_neither_row_nor_message(
    setup: psycopg.Connection, client: Client, clean: str
) -> None:
    before = snapshot(setup)

    def enqueue(c: psycopg.Connection) -> None:
        with c.transaction():
            c.execute("INSERT INTO term_orders (note) VALUES ('paid')")
            client.send(Q, {"order": 1}, conn=c)
            client.send_batch(Q, [{"order": 2}, {"order": 3}], conn=c)
            c.execute("SELECT pg_sleep(30)")

    run_and_terminate(clean, enqueue)
    assert snapshot(setup) == before
    assert setup.execute("SELECT count(*) FROM term_orders").fetchone() == (0,)
    # and the same transaction, not cut off, commits both
    with psycopg.connect(clean) as c:
        c.execute("INSERT INTO term_orders (note) VALUES ('paid')")
        client.send(Q, {"order": 1}, conn=c)
    assert setup.execute("SELECT count(*) FROM term_orders").fetchone() == (1,)
    assert [m.body for m in client.peek(Q, 10)] == [{"order": 1}]


def test_client_whose_backend_is_terminated_reconnects_and_says_so(
    clean: str, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    client.create_queue(Q)
    name = f"qp_victim_{uuid.uuid4().hex[:8]}"
    with Client(conninfo.make_conninfo(clean, application_name=name), min_size=1, max_size=1,
                sweep_interval=None) as victim:
        failure: list[BaseException] = []

        def long_poll() -> None:
            try:
                victim.receive(Q, wait=15)
            except BaseException as exc:
                failure.append(exc)

        caplog.set_level(logging.INFO, logger="queue_pg.client")
        t = threading.Thread(target=long_poll)
        t.start()
        with psycopg.connect(clean, autocommit=True) as admin:
            deadline = time.monotonic() + 10
            while True:  # our victim's own backend, waiting on LISTEN
                pids = [r[0] for r in admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
                    " AND datname = current_database()", [name])]
                if len(pids) == 1 and admin.execute(
                        "SELECT count(*) FROM pg_listening_channels()").fetchone() is not None:
                    time.sleep(0.3)  # into the wait
                    break
                assert time.monotonic() < deadline
                time.sleep(0.02)
            admin.execute("SELECT pg_terminate_backend(%s)", pids)
        t.join(20)
        assert len(failure) == 1 and isinstance(failure[0], psycopg.OperationalError), failure
        # the pool replaced the connection: the next calls work
        mid = client.send(Q, "after")
        got = victim.receive(Q, wait=5)
        assert [m.id for m in got] == [mid]
        assert victim.delete(Q, got[0].receipt or "") is True
    text = caplog.text
    assert "lost the database" in text and "working again" in text
