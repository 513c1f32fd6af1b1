"""The fast claim path: where a receive's scan starts (the claim floor) and receive(delete=…).

The floor is an optimisation that must never lose a message: each test below puts a visible
message under the floor the way production does (a sending transaction that commits late, a
receive that rolls back, a session whose clock runs ahead) and checks it is still received.
"""

from __future__ import annotations

import time

import psycopg
import pytest

import queue_pg
from queue_pg import errors


def _floor(conn: psycopg.Connection, queue: str) -> object:
    row = conn.execute(
        "SELECT queue_pg._from_micros(pg_sequence_last_value(format('queue_pg.claim_floor_%%s', id)::regclass))"
        " FROM queue_pg.queues WHERE name = %s",
        [queue],
    ).fetchone()
    assert row is not None
    return row[0]


def test_floor_follows_the_receives(client: queue_pg.Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", [1, 2, 3])
    late = client.send("jobs", 4)
    assert _floor(conn, "jobs") is None
    got = client.receive("jobs", 3)
    sent_at = conn.execute("SELECT enqueued_at FROM queue_pg.messages WHERE id = %s", [got[0].id])
    assert _floor(conn, "jobs") == sent_at.fetchone()[0]  # type: ignore[index]
    assert [m.id for m in client.receive("jobs", 3)] == [late]


def test_late_commit_below_the_floor_is_received(client: queue_pg.Client, clean: str) -> None:
    client.create_queue("jobs")
    with psycopg.connect(clean) as app:  # an application transaction that commits late
        client.send("jobs", "early", conn=app)
        later = client.send_batch("jobs", ["a", "b", "c"])
        assert [m.id for m in client.receive("jobs", 1)] == [later[0]]  # floor passes "early"
        app.commit()
    # a receive wanting more than the floor range holds looks below it at once
    bodies = sorted(m.body for m in client.receive("jobs", 10))
    assert bodies == ["b", "c", "early"]


def test_straggler_found_within_a_second_despite_a_backlog(client: queue_pg.Client, clean: str) -> None:
    client.create_queue("jobs")
    with psycopg.connect(clean) as app:
        early = client.send("jobs", "early", conn=app)
        client.send_batch("jobs", list(range(50)))
        assert client.receive("jobs", 1)[0].body == 0
        app.commit()
    # the floor range still fills a receive of one: the straggler waits for the rescan
    assert client.receive("jobs", 1)[0].body == 1
    time.sleep(1.1)
    assert client.receive("jobs", 1)[0].id == early


def test_rolled_back_receive_leaves_its_messages_receivable(client: queue_pg.Client, clean: str) -> None:
    client.create_queue("jobs")
    ids = client.send_batch("jobs", ["a", "b", "c", "d"])
    with psycopg.connect(clean) as tx:
        assert len(client.receive("jobs", 2, conn=tx)) == 2  # the floor moves (a sequence)...
        tx.rollback()  # ... and stays where it is when the receive is undone
    assert sorted(m.id for m in client.receive("jobs", 10)) == ids


def test_a_clock_ahead_cannot_hide_messages_from_others(client: queue_pg.Client, clean: str) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", ["a", "b"])
    with psycopg.connect(clean, autocommit=True) as ahead:
        ahead.execute("SET queue_pg.time_offset = '1 hour'")
        leased = client.receive("jobs", 1, visibility_timeout=60, conn=ahead)
        client.send("jobs", "c", delay=600)  # visible in the future session's now only
        got = client.receive("jobs", 2, conn=ahead)  # "b" and "c": the floor is 10 minutes ahead
        assert sorted(m.body for m in got) == ["b", "c"]
        assert leased
    client.send("jobs", "d")  # visible now, far below the floor
    assert [m.body for m in client.receive("jobs", 10)] == ["d"]


def test_concurrent_receives_with_stragglers_lose_nothing(client: queue_pg.Client, clean: str) -> None:
    """Late commits while 4 threads drain the queue: every message is received exactly once."""
    import threading

    client.create_queue("jobs", visibility_timeout=60)
    seen: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def consume() -> None:
        with queue_pg.Client(clean, sweep_interval=None) as c:
            done: list[str] = []
            while not stop.is_set() or done:
                got = c.receive("jobs", 5, delete=done)
                with lock:
                    seen.extend(m.id for m in got)
                done = [m.receipt for m in got]
                if not got:
                    time.sleep(0.01)

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    sent: list[int] = []
    for i in range(30):
        with psycopg.connect(clean) as app:
            sent.append(client.send("jobs", i, conn=app))
            sent.extend(client.send_batch("jobs", [i] * 5))  # committed before the first
            time.sleep(0.005)
            app.commit()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with lock:
            if len(seen) >= len(sent):
                break
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(10)
    assert sorted(seen) == sorted(sent)
    assert client.stats("jobs").visible == 0


def test_receive_deletes_the_previous_batch_first(client: queue_pg.Client) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", list(range(6)))
    first = client.receive("jobs", 3)
    second = client.receive("jobs", 3, delete=[m.receipt for m in first])
    assert [m.body for m in second] == [3, 4, 5]
    assert client.stats("jobs").in_flight == 3
    assert client.receive("jobs", 3, delete=[m.receipt for m in second]) == []
    stats = client.stats("jobs")
    assert (stats.visible, stats.in_flight) == (0, 0)


def test_receive_delete_skips_and_counts_stale_receipts(client: queue_pg.Client) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", ["a", "b"])
    old = client.receive("jobs", 2, visibility_timeout=0)  # both lapse at once
    fresh = client.receive("jobs", 1)  # one is received again: its old receipt is stale
    # the stale one is skipped and counted; the lapsed one nobody took since is still ours
    assert client.receive("jobs", 1, delete=[m.receipt for m in old]) == []
    stats = client.stats("jobs")
    assert (stats.stale_receipts, stats.visible, stats.in_flight) == (1, 0, 1)
    assert client.delete("jobs", fresh[0].receipt)


def test_receive_delete_bad_input_changes_nothing(client: queue_pg.Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs")
    client.send_batch("jobs", ["a", "b", "c"])
    got = client.receive("jobs", 2)
    forged = got[0].receipt[:-1] + ("0" if got[0].receipt[-1] != "0" else "1")
    with pytest.raises(errors.InvalidReceipt):
        client.receive("jobs", 1, delete=[got[1].receipt, forged])
    with pytest.raises(errors.InvalidParameter, match="delete has duplicate entry"):
        client.receive("jobs", 1, delete=[got[1].receipt, got[1].receipt])
    with pytest.raises(errors.InvalidParameter, match=r"len\(delete\) = 1001"):
        client.receive("jobs", 1, delete=[f"x{i}" for i in range(1001)])
    stats = client.stats("jobs")
    assert (stats.visible, stats.in_flight) == (1, 2)  # no delete happened, no receive either
    assert client.delete("jobs", got[1].receipt)


def test_long_poll_deletes_once(client: queue_pg.Client, conn: psycopg.Connection) -> None:
    client.create_queue("jobs")
    client.send("jobs", "a")
    got = client.receive("jobs", 1)
    began = time.monotonic()
    assert client.receive("jobs", 1, wait=0.5, delete=[got[0].receipt]) == []
    assert time.monotonic() - began >= 0.45
    assert conn.execute("SELECT count(*) FROM queue_pg.message_history WHERE outcome = 'deleted'").fetchone() == (1,)


def test_sql_receive_with_delete(sql) -> None:
    sql("SELECT queue_pg.create_queue('jobs')")
    sql("SELECT queue_pg.send_batch('jobs', array['1','2']::jsonb[])")
    receipt = sql("SELECT receipt FROM queue_pg.receive('jobs')")[0][0]
    rows = sql("SELECT body FROM queue_pg.receive('jobs', 1, \"delete\" => %s::text[])", [receipt])
    assert rows == [(2,)]
    assert sql("SELECT visible, in_flight FROM queue_pg.stats('jobs')") == [(0, 1)]


async def test_async_receive_with_delete(clean: str) -> None:
    async with queue_pg.AsyncClient(clean, sweep_interval=None) as c:
        await c.create_queue("jobs")
        await c.send_batch("jobs", [1, 2])
        first = await c.receive("jobs", 1)
        second = await c.receive("jobs", 1, delete=[first[0].receipt])
        assert [m.body for m in second] == [2]
        assert (await c.stats("jobs")).in_flight == 1


def test_debounced_sends_still_wake_a_long_poll(
    client: queue_pg.Client, clean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bursts of sends on the client's own connections skip most NOTIFYs (debounce); a waiting
    consumer must still be woken. The poll's re-check is put out of reach, so a message whose
    NOTIFY was lost waits for the end of the consumer's 5 s poll: with the five bursts 1.5 s
    apart at most, one of them waits 3.5 s or more (2.7 s measured with every NOTIFY dropped),
    where a woken poll takes each within 0.2 s (0.7 s at worst) on a loaded 2-core machine. The
    lateness is taken when the poll returns (the deletes after it are not the poll's)."""
    import threading

    from queue_pg import longpoll

    monkeypatch.setattr(longpoll, "RECHECK_INTERVAL", 30.0)
    client.create_queue("jobs")
    late: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        with queue_pg.Client(clean, sweep_interval=None) as c:
            while not stop.is_set():
                got = c.receive("jobs", 10, wait=5)
                now = time.time()
                late.extend(now - m.body for m in got)
                for m in got:
                    c.delete("jobs", m.receipt)

    t = threading.Thread(target=consume)
    t.start()
    try:
        for _ in range(5):
            time.sleep(0.37)  # the consumer is waiting on LISTEN again
            for _ in range(10):
                client.send("jobs", time.time())
        deadline = time.monotonic() + 30  # ends as soon as all 50 are in
        while len(late) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        arrived = late[:]
    finally:
        stop.set()
        client.send("jobs", time.time())  # wakes the consumer's poll, so it sees the stop
        t.join(30)
    assert len(arrived) == 50
    assert max(arrived) < 2.0, sorted(arrived)[-5:]


def test_sql_send_notifies_unless_debounced(conn: psycopg.Connection, clean: str) -> None:
    conn.execute("SELECT queue_pg.create_queue('jobs')")
    channel = conn.execute("SELECT queue_pg.channel('jobs')").fetchone()[0]  # type: ignore[index]
    with psycopg.connect(clean, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        conn.execute("SELECT queue_pg.send('jobs', '1', debounce => true)")  # first: notifies
        assert len(list(listener.notifies(timeout=0.5, stop_after=1))) == 1
        # a notify went out just now (same statement): the debounced send is silent...
        conn.execute(
            "SELECT setval(format('queue_pg.notified_%s', id)::regclass, queue_pg._micros(clock_timestamp())),"
            " queue_pg.send('jobs', '3', debounce => true) FROM queue_pg.queues WHERE name = 'jobs'"
        )
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
        # ... and one that is not debounced is not
        conn.execute(
            "SELECT setval(format('queue_pg.notified_%s', id)::regclass, queue_pg._micros(clock_timestamp())),"
            " queue_pg.send('jobs', '4', debounce => false) FROM queue_pg.queues WHERE name = 'jobs'"
        )
        assert len(list(listener.notifies(timeout=0.5, stop_after=1))) == 1
