"""Deduplication and redrive tasks in the hands of a hostile member of the group roles with a
grant on queue "mine" only (the world of tests/test_hostile_roles.py): what it can claim, grow,
lock, speed up or stop beyond its queue."""

from __future__ import annotations

import psycopg
import pytest

from queue_pg import AccessDenied, InvalidParameter, RedriveTaskNotFound
from tests.test_access import make_role  # noqa: F401
from tests.test_hostile_roles import MINE, THEIRS, World, queue_id, world  # noqa: F401


@pytest.fixture
def w(request: pytest.FixtureRequest) -> World:
    """The world of tests/test_hostile_roles.py."""
    found: World = request.getfixturevalue("world")
    return found


def _dead_letters(w: World, dlq: str, source: str, n: int) -> None:
    w.owner.execute(
        "INSERT INTO queue_pg.messages (queue_id, source_queue_id, visible_at, enqueued_at, body)"
        " SELECT %s, %s, now() - interval '1 s', now(), to_jsonb(i) FROM generate_series(1, %s) i",
        [queue_id(w, dlq), queue_id(w, source), n])
    w.owner.commit()


def test_dedup_ids_of_a_queue_without_a_send_grant_cannot_be_claimed(w: World) -> None:
    first = w.admin.send(THEIRS, "real", dedup_id="k")
    for query in ("SELECT queue_pg.send('theirs', '1', dedup_id => 'k')",
                  "SELECT queue_pg.send('theirs', '1', dedup_id => 'other')",
                  "SELECT queue_pg.send_batch('theirs', array['1']::jsonb[], dedup_ids => array['x'])"):
        with pytest.raises(AccessDenied):
            w.run(w.producer, query)
    assert w.count("SELECT count(*) FROM queue_pg.dedup") == 1
    assert w.admin.send(THEIRS, "again", dedup_id="other") != first
    # on its own queue the producer's ids are the queue's (as in SQS): they dedup its sends only
    [(mine,)] = w.run(w.producer, "SELECT queue_pg.send('mine', '1', dedup_id => 'k')")
    assert mine != first


def test_a_producer_cannot_grow_ids_past_their_bound_or_change_the_window(w: World) -> None:
    with pytest.raises(InvalidParameter, match="allowed 1 to 128 characters"):
        w.run(w.producer, "SELECT queue_pg.send('mine', '1', dedup_id => repeat('x', 100000))")
    with pytest.raises(AccessDenied):
        w.run(w.producer, "SELECT * FROM queue_pg.alter_queue('mine', dedup_window => 604800)")
    with pytest.raises(AccessDenied):
        w.run(w.producer, "SELECT * FROM queue_pg.alter_queue('theirs', content_dedup => true)")
    assert w.count("SELECT count(*) FROM queue_pg.dedup") == 0


def test_an_open_transaction_holding_an_id_stops_nobody_elses_sends_or_the_sweep(w: World) -> None:
    w.admin.alter_queue(MINE, dedup_window=1)
    w.admin.send(MINE, "old", dedup_id="stale")
    w.owner.execute("SELECT queue_pg.send('mine', '1', dedup_id => 'x')")  # expires later
    with w.producer.connect() as c:
        c.autocommit = False
        c.execute("SELECT queue_pg.send('mine', '1', dedup_id => 'held')")
        c.execute("SELECT queue_pg.send('mine', '1', dedup_id => 'x')")  # a duplicate
        with psycopg.connect(w.owner.info.dsn, autocommit=True,
                             options="-c lock_timeout=20s") as other:
            other.execute("SELECT queue_pg.send('mine', '2', dedup_id => 'free')")
            other.execute("SELECT queue_pg.send('theirs', '2', dedup_id => 'held')")
            other.execute("SET queue_pg.time_offset = '1 hour'")
            other.execute("SELECT queue_pg.sweep()")  # skips what the transaction holds
        c.rollback()
    keys = {r[0] for r in w.owner.execute("SELECT dedup_id FROM queue_pg.dedup").fetchall()}
    assert "stale" not in keys


def test_redrive_tasks_reach_only_the_queues_a_role_manages(w: World) -> None:
    w.admin.create_queue("src")
    w.admin.grant(MINE, w.producer.name, "manage")
    _dead_letters(w, MINE, "src", 50)
    _dead_letters(w, THEIRS, "src", 50)
    for query in ("SELECT queue_pg.start_redrive('theirs')",
                  "SELECT queue_pg.start_redrive('mine', \"to\" => 'theirs')",
                  "SELECT * FROM queue_pg.list_redrives('theirs')"):
        with pytest.raises(AccessDenied):
            w.run(w.producer, query)
    theirs = w.admin.start_redrive(THEIRS, rate=1)
    with pytest.raises(AccessDenied):
        w.run(w.producer, "SELECT * FROM queue_pg.cancel_redrive(%s)", theirs)
    with pytest.raises(RedriveTaskNotFound):
        w.run(w.producer, "SELECT * FROM queue_pg.cancel_redrive(-1)")
    [(mine,)] = w.run(w.producer, "SELECT queue_pg.start_redrive('mine', rate => 2)")
    assert [r[0] for r in w.run(w.producer, "SELECT id FROM queue_pg.list_redrives()")] == [mine]
    # its steps move its own task only, and a moved clock is refused, not a faster rate
    w.run(w.producer, "SELECT queue_pg.redrive_step()")
    with pytest.raises(InvalidParameter, match=r"queue_pg\.time_offset"):
        w.run(w.producer, "SELECT queue_pg.redrive_step()",
                  options="-c queue_pg.time_offset=1day")
    moved = dict(w.owner.execute("SELECT id, moved FROM queue_pg.redrive_tasks").fetchall())
    assert moved[theirs] == 1 and moved[mine] <= 2 * 30  # nobody sped either up
    # the consumer, with no grant at all on theirs, sees and moves nothing there
    assert w.run(w.consumer, "SELECT count(*) FROM queue_pg.list_redrives()") == [(0,)]
    assert w.run(w.consumer, "SELECT queue_pg.redrive_step()") == [(0,)]


def test_starting_and_cancelling_in_a_loop_keeps_the_last_hundred_tasks(w: World) -> None:
    w.admin.grant(MINE, w.producer.name, "manage")
    with w.producer.connect() as c:
        for _ in range(130):
            [(task,)] = c.execute("SELECT queue_pg.start_redrive('mine')").fetchall()
            c.execute("SELECT queue_pg.cancel_redrive(%s)", [task])
    assert w.count("SELECT count(*) FROM queue_pg.redrive_tasks") == 100


def test_redrive_step_bounds(w: World) -> None:
    for bad in (0, 1000001):
        with pytest.raises(InvalidParameter, match=f"max_rows = {bad} is out of range"):
            w.run(w.producer, "SELECT queue_pg.redrive_step(%s)", bad)


def test_only_a_manager_sets_who_may_dead_letter_into_a_queue(w: World) -> None:
    for role in (w.producer, w.consumer):
        for queue in (MINE, THEIRS):
            with pytest.raises(AccessDenied):
                w.run(role, f"SELECT queue_pg.set_redrive_allow('{queue}', 'deny_all')")
    # reading it is as open as a queue's settings: to a role with a grant on the queue
    [(policy,)] = w.run(w.consumer, "SELECT queue_pg.redrive_allow('mine')")
    assert policy == {"permission": "allow_all"}
    with pytest.raises(AccessDenied, match="theirs"):
        w.run(w.consumer, "SELECT queue_pg.redrive_allow('theirs')")
    assert w.count("SELECT count(*) FROM queue_pg.queues WHERE options ? 'redrive_allow'") == 0
