"""What a hostile member of the group roles can do with a grant on one queue only.

Each test logs in as an unprivileged LOGIN role (queue_pg_producer and/or queue_pg_consumer,
granted queue "mine" only) and tries one way to reach beyond it: the clock, sizes, the in-flight
limit, locks held in an open transaction, JSON no client can read, and the forms of its input.
The owner (the superuser here) sets the queues up and checks what happened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql as psql
from psycopg.types.json import Jsonb

from queue_pg import (
    AccessDenied,
    Client,
    InvalidParameter,
    InvalidReceipt,
    MessageTooLarge,
    OverLimit,
    QueueError,
)
from queue_pg.errors import translate
from tests.test_access import CONSUMER, PRODUCER, MakeRole, Role, make_role  # noqa: F401

MINE, THEIRS = "mine", "theirs"


@dataclass
class World:
    owner: psycopg.Connection[Any]
    admin: Client
    producer: Role
    consumer: Role

    def run(self, role: Role, query: str, *params: object, **conn_kwargs: Any) -> list[Any]:
        """One statement as `role`, errors translated like the client's."""
        with role.connect(**conn_kwargs) as c, translate():
            cur = c.execute(query, params or None)
            return cur.fetchall() if cur.description else []

    def count(self, query: str, *params: object) -> Any:
        row = self.owner.execute(query, params or None).fetchone()
        assert row is not None
        return row[0]


@pytest.fixture
def world(clean: str, request: pytest.FixtureRequest, conn: psycopg.Connection[Any]) -> Iterator[World]:
    new_role: MakeRole = request.getfixturevalue("make_role")
    with Client(clean, sweep_interval=None) as admin:
        admin.create_queue(MINE)
        admin.create_queue(THEIRS)
        producer = new_role("producer", PRODUCER)
        consumer = new_role("consumer", CONSUMER)
        admin.grant(MINE, producer.name, "send")
        admin.grant(MINE, consumer.name, "receive")
        yield World(conn, admin, producer, consumer)


def queue_id(w: World, name: str) -> int:
    return int(w.count("SELECT id FROM queue_pg.queues WHERE name = %s", name))


# --- 1. the clock ----------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", ["5 days", "-1 hour", "0", "11 minutes"])
def test_a_limited_role_may_not_move_the_clock(world: World, offset: str) -> None:
    world.admin.send(THEIRS, "fresh", ttl=3600)
    world.admin.send(MINE, "m")
    setting = {"options": f"-c queue_pg.time_offset={offset.replace(' ', '')}"}
    for role, query in [
        (world.producer, "SELECT queue_pg.send('mine', '1')"),
        (world.producer, "SELECT queue_pg.sweep()"),
        (world.consumer, "SELECT * FROM queue_pg.receive('mine', 1, 600)"),
        (world.consumer, "SELECT queue_pg.now()"),
        (world.consumer, "SELECT * FROM queue_pg.queue_stats"),
    ]:
        with pytest.raises(InvalidParameter, match=r"queue_pg\.time_offset"):
            world.run(role, query, **setting)
    assert world.count("SELECT count(*) FROM queue_pg.messages") == 2
    assert world.count("SELECT count(*) FROM queue_pg.messages WHERE receive_count > 0") == 0


def test_role_and_database_default_offsets_are_refused_too(world: World) -> None:
    """ALTER ROLE ... SET (by the role itself where the server lets it, else by an admin), and
    ALTER DATABASE ... SET."""
    role = psql.SQL("ROLE {}").format(psql.Identifier(world.consumer.name))
    db = psql.SQL("DATABASE {}").format(psql.Identifier(world.owner.info.dbname))
    set_offset = psql.SQL("ALTER {} SET queue_pg.time_offset = '1 day'")
    try:
        with world.consumer.connect() as c:
            c.execute(set_offset.format(role))
    except psycopg.errors.InsufficientPrivilege:  # PostgreSQL 15 and later: SET privilege needed
        world.owner.execute(set_offset.format(role))
    for target, query in [(role, "SELECT * FROM queue_pg.receive('mine')"),
                          (db, "SELECT queue_pg.send('mine', '1')")]:
        if target is db:
            world.owner.execute(set_offset.format(db))
        try:
            with pytest.raises(InvalidParameter, match=r"queue_pg\.time_offset"):
                world.run(world.producer if target is db else world.consumer, query)
        finally:
            world.owner.execute(psql.SQL("ALTER {} RESET queue_pg.time_offset").format(target))
    assert world.run(world.consumer, "SELECT count(*) FROM queue_pg.receive('mine')") == [(0,)]


def test_maintenance_follows_the_real_clock_whatever_the_owners_offset(world: World) -> None:
    for offset in ("30 days", "-30 days", "1000 days"):
        world.owner.execute("SELECT set_config('queue_pg.time_offset', %s, false)", [offset])
        world.owner.execute("SELECT queue_pg.sweep()")
    world.owner.execute("RESET queue_pg.time_offset")
    days = [r[0] for r in world.owner.execute(
        "SELECT (regexp_match(c.relname, '(\\d{8})$'))[1]::date - (now() AT TIME ZONE 'UTC')::date"
        " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'queue_pg.message_history'::regclass AND c.relname ~ '\\d{8}$'")]
    assert days and all(-8 <= d <= 2 for d in days), days
    assert 0 in days


def test_claim_marks_never_stay_in_the_future(world: World) -> None:
    """A receive on a clock years ahead leaves the rescan mark at the real time, and a mark
    already in the future (from an earlier release) heals: a straggler below the floor is found
    within about a second although the floor range keeps every receive full."""
    qid = queue_id(world, MINE)
    # more messages than receives can take in the loop's few seconds on a fast machine, so the
    # straggler is found by the once-a-second rescan, never by the floor range running out
    for start in (0, 10000):
        world.admin.send_batch(MINE, list(range(start, start + 10000)))
    world.owner.execute("SET queue_pg.time_offset = '10 years'")
    world.owner.execute("SELECT * FROM queue_pg.receive('mine', 1, 0)")
    world.owner.execute("RESET queue_pg.time_offset")
    ahead = world.count(f"SELECT pg_sequence_last_value('queue_pg.claim_rescan_{qid}')"
                        " - queue_pg._micros(clock_timestamp())")
    assert ahead <= 0
    world.owner.execute(f"SELECT setval('queue_pg.claim_rescan_{qid}',"
                        " queue_pg._micros(now() + interval '10 years'))")
    with world.consumer.connect() as c:
        receive = "SELECT id FROM queue_pg.receive('mine', 1, 600)"
        c.execute(receive)
        straggler = world.count("UPDATE queue_pg.messages SET visible_at = now() - interval '1 hour'"
                                " WHERE id = (SELECT max(id) FROM queue_pg.messages) RETURNING id")
        got: list[int] = []
        deadline = time.monotonic() + 3
        while straggler not in got and time.monotonic() < deadline:
            got += [r[0] for r in c.execute(receive)]
    assert straggler in got and len(got) < 19900


# --- maintenance and locks -------------------------------------------------------------------------


def test_a_limited_sweep_in_an_open_transaction_blocks_nobody(world: World) -> None:
    world.owner.execute("SELECT queue_pg.sweep()")
    ahead = [r[0] for r in world.owner.execute(
        "SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'queue_pg.message_history'::regclass"
        "   AND c.relname ~ '\\d{8}$'"
        "   AND c.relname > 'message_history_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')")]
    for part in ahead:  # days the next sweep makes
        world.owner.execute(f"DROP TABLE {part}")
    world.admin.send(MINE, "m")
    [(receipt,)] = world.run(world.consumer, "SELECT receipt FROM queue_pg.receive('mine', 1, 600)")
    with psycopg.connect(world.producer.dsn) as sweeper:
        sweeper.execute("SELECT queue_pg.sweep()")  # and the transaction stays open
        with world.consumer.connect() as other:
            other.execute("SET lock_timeout = '2s'")
            assert other.execute("SELECT queue_pg.delete_message('mine', %s)", [receipt]).fetchone() == (True,)
        started = time.monotonic()
        world.owner.execute("SELECT queue_pg.sweep()")  # partition upkeep gives up, never waits
        assert time.monotonic() - started < 1
        sweeper.rollback()
    world.owner.execute("SELECT queue_pg.sweep()")
    for part in ahead:
        assert world.count("SELECT to_regclass(%s) IS NOT NULL", part)
    assert world.count("SELECT count(*) FROM queue_pg.message_history WHERE outcome = 'deleted'") == 1


def test_a_limited_sweep_in_an_open_transaction_holds_rows_of_its_own_queues_only(
    world: World,
) -> None:
    """What a sweep deletes or updates stays locked until its transaction ends. A limited
    role's sweep touches only the queues it has a grant on, and leaves rollups and tuning (one
    holder at a time, for every queue) to sweeps of a role that manages every queue."""
    world.admin.create_queue("dd", dedup_window=1)
    world.admin.grant("dd", world.owner.info.user, "send")
    world.admin.send("dd", "first", dedup_id="order-42")
    world.admin.send(THEIRS, "short", ttl=0.2)
    world.admin.send(MINE, "short", ttl=0.2)
    world.owner.execute("SET queue_pg.tune_interval = '1s'")
    world.owner.execute("SELECT queue_pg.sweep()")
    tuned = world.count("SELECT at FROM queue_pg.tuning_runs")
    time.sleep(1.2)  # the messages expired, the dedup id is forgotten, a tuning step is due
    with psycopg.connect(world.producer.dsn) as sweeper:
        assert sweeper.execute("SELECT queue_pg.sweep()").fetchone() == (1,)  # mine only
        with psycopg.connect(world.owner.info.dsn, autocommit=True) as other:
            other.execute("SET lock_timeout = '2s'")
            other.execute("SET queue_pg.tune_interval = '1s'")
            assert other.execute("SELECT queue_pg.sweep()").fetchone() == (1,)  # theirs
            assert world.count("SELECT at FROM queue_pg.tuning_runs") > tuned
            again = other.execute("SELECT queue_pg.send('dd', '\"again\"', dedup_id => 'order-42')")
            assert again.fetchone() is not None
        sweeper.rollback()
    assert world.count("SELECT count(*) FROM queue_pg.messages WHERE queue_id = %s",
                       queue_id(world, "dd")) == 2


def test_the_old_views_counter_reader_reads_only_queues_the_role_sees(world: World) -> None:
    """_stat_counter (kept for the queue_stats view a downgrade makes again) is callable by every
    group: another queue's counters and an unknown id read NULL, not a figure or an error."""
    q = "SELECT queue_pg._stat_counter(%s, %s)"
    for kind in ("stale_receipts", "lease_expiries"):
        assert world.run(world.consumer, q, kind, queue_id(world, THEIRS)) == [(None,)]
        assert world.run(world.consumer, q, kind, 999_999) == [(None,)]
        assert world.run(world.consumer, q, kind, queue_id(world, MINE)) == [(0,)]


def test_holding_the_old_sweep_lock_key_stops_no_sweep(world: World) -> None:
    world.admin.send(MINE, "short", ttl=0.2)
    time.sleep(0.3)
    with world.consumer.connect() as squatter:
        squatter.execute("SELECT pg_advisory_lock(hashtext('queue_pg.sweep'))")
        assert world.run(world.producer, "SELECT queue_pg.sweep()") == [(1,)]


def test_drop_queue_waits_for_a_send_in_progress(world: World) -> None:
    dropped = threading.Event()
    with psycopg.connect(world.producer.dsn) as sender:
        sender.execute("SELECT queue_pg.send('mine', '1')")

        def drop() -> None:
            world.admin.drop_queue(MINE)
            dropped.set()

        t = threading.Thread(target=drop)
        t.start()
        assert not dropped.wait(0.5)  # waits for the sender's transaction
        sender.commit()
        t.join(5)
    assert dropped.is_set()
    assert world.count("SELECT count(*) FROM queue_pg.messages m"
                       " WHERE NOT EXISTS (SELECT 1 FROM queue_pg.queues q WHERE q.id = m.queue_id)") == 0


def test_a_long_poll_on_a_limited_queue_holds_no_lock_while_it_waits(world: World) -> None:
    world.admin.alter_queue(MINE, in_flight_limit=1)
    world.admin.send_batch(MINE, [1, 2])
    [(receipt,)] = world.run(world.consumer, "SELECT receipt FROM queue_pg.receive('mine', 1, 600)")
    polled: list[Any] = []

    def poll() -> None:
        polled.extend(world.run(world.consumer, "SELECT body FROM queue_pg.receive('mine', 1, 600, wait => 4)"))

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.5)  # the poll is waiting: the limit is reached
    with world.consumer.connect() as other:
        other.execute("SET lock_timeout = '1s'")
        started = time.monotonic()
        assert other.execute("SELECT queue_pg.delete_message('mine', %s)", [receipt]).fetchone() == (True,)
        assert time.monotonic() - started < 1
    t.join(6)
    assert polled == [(2,)]


def test_a_long_poll_that_deletes_on_a_limited_queue_answers_at_once(world: World) -> None:
    """Its deletes keep the in-flight counter locked until it commits: it must not wait."""
    world.admin.alter_queue(MINE, in_flight_limit=2)
    world.admin.send_batch(MINE, [1, 2])
    [(first,), (second,)] = world.run(world.consumer, "SELECT receipt FROM queue_pg.receive('mine', 2, 600)")
    started = time.monotonic()
    rows = world.run(world.consumer, "SELECT * FROM queue_pg.receive('mine', 1, 600, wait => 3, \"delete\" => %s)",
                     [first])
    assert rows == [] and time.monotonic() - started < 1.5
    assert world.run(world.consumer, "SELECT queue_pg.delete_message('mine', %s)", second) == [(True,)]


# --- sizes and what a client can read --------------------------------------------------------------


def test_attributes_count_toward_the_size(world: World) -> None:
    big = Jsonb({"k": "x" * 2_000_000})
    for query, params in [
        ("SELECT queue_pg.send('mine', '1', attributes => %s)", [big]),
        ("SELECT queue_pg.send_batch('mine', array['1']::jsonb[], attributes => array[%s]::jsonb[])", [big]),
    ]:
        with pytest.raises(MessageTooLarge, match="bytes: allowed up to"):
            world.run(world.producer, query, *params)
    world.admin.send(MINE, "x" * 600_000)
    [(receipt,)] = world.run(world.consumer, "SELECT receipt FROM queue_pg.receive('mine', 1, 600)")
    with pytest.raises(MessageTooLarge):  # the merged result counts
        world.run(world.consumer, "SELECT queue_pg.update_message('mine', %s, attributes => %s)",
                  receipt, Jsonb({"k": "y" * 500_000}))
    assert world.count("SELECT count(*) FROM queue_pg.messages WHERE attributes IS NOT NULL") == 0


def test_a_compressed_value_is_measured_as_json_text(world: World) -> None:
    with world.producer.connect() as c:
        c.execute("CREATE TEMP TABLE t AS SELECT to_jsonb(repeat('x', 2000000)) AS b")
        with pytest.raises(MessageTooLarge), translate():
            c.execute("SELECT queue_pg.send('mine', b) FROM t")
    assert world.count("SELECT count(*) FROM queue_pg.messages") == 0


def test_dead_letter_reason_and_history_type_are_bounded(world: World) -> None:
    world.admin.create_queue("dlq")
    world.admin.alter_queue(MINE, dead_letter_queue="dlq", max_receive_count=5)
    world.admin.send(MINE, 1, attributes={"type": "t" * 10_000})
    [(receipt,)] = world.run(world.consumer, "SELECT receipt FROM queue_pg.receive('mine', 1, 600)")
    # a reason of 1 MiB is cut to 1 KiB, never a cause to refuse the move (the message would
    # have nowhere to go)
    assert world.run(world.consumer, "SELECT queue_pg.dead_letter('mine', %s, %s)", receipt,
                     "r" * 1_048_576) == [(True,)]
    reason = world.count("SELECT attributes->>'dead_letter_reason' FROM queue_pg.messages")
    assert len(reason.encode()) <= 1024 and reason.endswith("… [truncated, 1048576 bytes]")
    assert world.count("SELECT length(type) FROM queue_pg.message_history") == 100


DEEP = "[" * 101 + "]" * 101


@pytest.mark.parametrize("text", [DEEP, "[" * 3000 + "]" * 3000, '{"a": 1e5000}', "[-1e309]",
                                  '{"k": [' + "9" * 400 + "]}"])
def test_json_no_client_can_read_is_refused(world: World, text: str) -> None:
    for query in ["SELECT queue_pg.send('mine', %s::jsonb)",
                  "SELECT queue_pg.send('mine', '1', attributes => jsonb_build_object('a', %s::jsonb))",
                  "SELECT queue_pg.send_batch('mine', array['1', %s]::jsonb[])"]:
        with pytest.raises(InvalidParameter):
            world.run(world.producer, query, text)
    world.admin.send(MINE, 1)
    [(receipt,)] = world.run(world.consumer, "SELECT receipt FROM queue_pg.receive('mine', 1, 600)")
    with pytest.raises(InvalidParameter):
        world.run(world.consumer, "SELECT queue_pg.update_message('mine', %s, %s::jsonb)", receipt, text)
    assert world.count("SELECT count(*) FROM queue_pg.messages WHERE body <> '1'") == 0


def test_json_at_the_bounds_is_accepted(world: World) -> None:
    for text in ["[" * 100 + "]" * 100, "1.7976931348623157e308", "-1.7976931348623157e308", "1e-400"]:
        world.run(world.producer, "SELECT queue_pg.send('mine', %s::jsonb)", text)


def test_nesting_too_deep_for_the_server_is_a_queue_error(world: World) -> None:
    with pytest.raises(InvalidParameter):
        world.run(world.producer, "SELECT queue_pg.send('mine', %s::jsonb)", "[" * 1_000_000 + "]" * 1_000_000)


# --- limits and settings ---------------------------------------------------------------------------


def test_in_flight_limit_holds_for_leases_taken_up_again(world: World) -> None:
    world.admin.alter_queue(MINE, in_flight_limit=5)
    world.admin.send_batch(MINE, list(range(20)))
    receipts = [r[0] for _ in range(4)
                for r in world.run(world.consumer, "SELECT receipt FROM queue_pg.receive('mine', 5, 0)")]
    assert len(receipts) == 20
    taken = 0
    for i, receipt in enumerate(receipts):
        query = ("SELECT queue_pg.change_visibility('mine', %s, 300)" if i % 2
                 else "SELECT queue_pg.update_message('mine', %s, visibility_timeout => 300)")
        try:
            world.run(world.consumer, query, receipt)
            taken += 1
        except OverLimit:
            pass
    assert taken == 5
    assert world.count("SELECT in_flight FROM queue_pg.queue_stats WHERE queue = 'mine'") == 5


@pytest.mark.parametrize(("delay", "ttl"), [(1, 1), (2, 1), (604800, 3600)])
def test_a_message_that_would_expire_unseen_is_refused(world: World, delay: float, ttl: float) -> None:
    with pytest.raises(InvalidParameter, match="delay"):
        world.run(world.producer, "SELECT queue_pg.send('mine', '1', %s, %s)", delay, ttl)
    with pytest.raises(InvalidParameter, match="delay"):
        world.run(world.producer, "SELECT queue_pg.send_batch('mine', array['1']::jsonb[], %s, %s)", delay, ttl)
    with pytest.raises(InvalidParameter, match="delay"):
        world.admin.create_queue("q2", delay=delay, message_ttl=ttl)
    with pytest.raises(InvalidParameter, match="delay"):
        world.admin.alter_queue(MINE, delay=delay, message_ttl=ttl)
    assert world.count("SELECT count(*) FROM queue_pg.messages") == 0
    world.run(world.producer, "SELECT queue_pg.send('mine', '1', %s, %s)", ttl / 2, ttl)


# --- forms of input --------------------------------------------------------------------------------


def test_the_channel_needs_receive_and_cannot_be_guessed(world: World) -> None:
    with pytest.raises(AccessDenied):
        world.run(world.producer, "SELECT queue_pg.channel('mine')")
    [(channel,)] = world.run(world.consumer, "SELECT queue_pg.channel('mine')")
    assert channel != f"queue_pg_{queue_id(world, MINE)}" and len(channel) <= 63
    with world.consumer.connect() as listener:
        listener.execute(psql.SQL("LISTEN {}").format(psql.Identifier(channel)))
        world.run(world.producer, "SELECT queue_pg.send('mine', '1')")
        assert [n.channel for n in listener.notifies(timeout=2, stop_after=1)] == [channel]


def test_receipts_have_one_text(world: World) -> None:
    world.admin.send(MINE, 1)
    [(receipt,)] = world.run(world.consumer, "SELECT receipt FROM queue_pg.receive('mine', 1, 600)")
    qid, mid, lease, mac = receipt.split(".")
    for variant in (f"0{qid}.{mid}.{lease}.{mac}", f"{qid}.0{mid}.{lease}.{mac}", f"{qid}.{mid}.00{lease}.{mac}"):
        with pytest.raises(InvalidReceipt):
            world.run(world.consumer, "SELECT queue_pg.delete_message('mine', %s)", variant)
        rows = world.run(world.consumer, "SELECT deleted, error FROM queue_pg.delete_batch('mine', %s)",
                         [receipt, variant])
        assert rows == [(True, None), (False, "InvalidReceipt")]
        world.admin.send(MINE, 1)
        [(receipt,)] = world.run(world.consumer, "SELECT receipt FROM queue_pg.receive('mine', 1, 600)")
        qid, mid, lease, mac = receipt.split(".")


@pytest.mark.parametrize("arr", ["'[0:1]={1,2}'::jsonb[]", "'{{1,2},{3,4}}'::jsonb[]", "'[2:3]={1,2}'::jsonb[]"])
def test_batch_arrays_are_plain_lists(world: World, arr: str) -> None:
    with pytest.raises(InvalidParameter, match="one-dimensional array indexed from 1"):
        world.run(world.producer, f"SELECT queue_pg.send_batch('mine', {arr})")
    shape = arr.split("'")[1].split("=")[0] if "=" in arr else ""
    attrs = f"'{shape}={{\"{{}}\",\"{{}}\"}}'::jsonb[]" if shape else "'{{\"{}\",\"{}\"},{\"{}\",\"{}\"}}'::jsonb[]"
    with pytest.raises(InvalidParameter, match="one-dimensional array indexed from 1"):
        world.run(world.producer, f"SELECT queue_pg.send_batch('mine', array['1', '2']::jsonb[], attributes => {attrs})")
    with pytest.raises(InvalidParameter, match="one-dimensional array indexed from 1"):
        world.run(world.consumer, f"SELECT * FROM queue_pg.delete_batch('mine', {arr.replace('jsonb', 'text')})")
    assert world.count("SELECT count(*) FROM queue_pg.messages") == 0


def test_a_long_queue_name_is_not_echoed_whole(world: World) -> None:
    for role, query in [(world.producer, "SELECT queue_pg.send(%s, '1')"),
                        (world.consumer, "SELECT * FROM queue_pg.receive(%s)")]:
        with pytest.raises(QueueError) as info:
            world.run(role, query, "n" * 1_000_000)
        assert len(str(info.value)) < 400


def test_a_limited_role_cannot_set_or_move_schedules_of_queues_it_does_not_manage(
    world: World,
) -> None:
    """Schedules: set and drop need manage; fire fires only what the caller may send to; the
    view shows only the queues it has a grant on. A producer of 'mine' cannot plant a flood on
    'theirs', stall another queue's schedule, or read its body."""
    w = world
    w.admin.set_schedule("theirs-tick", THEIRS, "* * * * *", {"secret": 1})
    w.admin.set_schedule("mine-tick", MINE, "* * * * *", {"ok": 1})
    with pytest.raises(AccessDenied, match="needs privilege manage"):
        w.run(w.producer, "SELECT * FROM queue_pg.set_schedule('flood', %s, '* * * * * *', '{}')",
              THEIRS)
    with pytest.raises(AccessDenied, match="needs privilege manage"):
        w.run(w.producer, "SELECT * FROM queue_pg.set_schedule('mine-tick', %s, '* * * * * *', '{}')",
              MINE)
    with pytest.raises(AccessDenied):
        w.run(w.producer, "SELECT queue_pg.drop_schedule('theirs-tick', %s)", THEIRS)
    w.owner.execute("UPDATE queue_pg.periodic SET next_run = date_trunc('minute', now())")  # one tick due
    fired = w.run(w.producer, "SELECT schedule FROM queue_pg.fire_schedules()")
    assert fired == [("mine-tick",)]
    assert w.run(w.producer, "SELECT schedule FROM queue_pg.schedules") == [("mine-tick",)]
    assert w.count("SELECT count(*) FROM queue_pg.periodic WHERE next_run <= now()") == 1
    with pytest.raises(AccessDenied):
        w.run(w.producer, "SELECT * FROM queue_pg.periodic")


def test_a_schedule_name_is_its_queues_so_no_role_can_take_one_or_find_where_it_is(
    world: World,
) -> None:
    """A role that manages one queue registers a schedule under the name another queue's task
    uses first: that queue's registration still succeeds (its own row), both fire, each to its
    queue. Dropping names the queue: a queue the caller does not manage is refused whether the
    name is there or not, so the answer tells nothing of where a name is."""
    w = world
    w.admin.grant(MINE, w.producer.name, "manage")
    w.run(w.producer, "SELECT * FROM queue_pg.set_schedule('reports.nightly', %s, '* * * * *', '1')",
          MINE)
    info = w.admin.set_schedule("reports.nightly", THEIRS, "* * * * *", {"theirs": 1})
    assert info.created
    w.owner.execute("UPDATE queue_pg.periodic SET next_run = date_trunc('minute', now())")  # one tick due
    fired = sorted((f.schedule, f.queue) for f in w.admin.fire_schedules())
    assert fired == [("reports.nightly", MINE), ("reports.nightly", THEIRS)]
    assert [m.body for m in w.admin.peek(THEIRS)] == [{"theirs": 1}]
    for name in ("reports.nightly", "no-such-schedule"):
        with pytest.raises(AccessDenied, match="needs privilege manage"):
            w.run(w.producer, "SELECT queue_pg.drop_schedule(%s, %s)", name, THEIRS)
    assert w.run(w.producer, "SELECT queue_pg.drop_schedule('no-such-schedule', %s)", MINE) == [(False,)]
    assert w.run(w.producer, "SELECT queue_pg.drop_schedule('reports.nightly', %s)", MINE) == [(True,)]
    assert [(s.schedule, s.queue) for s in w.admin.schedules()] == [("reports.nightly", THEIRS)]
