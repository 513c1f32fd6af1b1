"""Boundaries between queues and between roles, tried by a hostile member of the group roles.

Each test logs in as an unprivileged LOGIN role with a grant on one queue (or a manager of one
dead-letter queue) and tries to reach past it: keep more messages than the in-flight limit,
move messages into a queue it may not send to, stop history upkeep for every queue, hold up
other roles' receives with an open transaction, or read other queues' names and settings.
The owner (the superuser here) sets the queues up and checks what happened. Also: DDL
(drop_queue) and maintenance (sweep, tune) running together never deadlock.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

from queue_pg import AccessDenied, Client, InvalidParameter, OverLimit, StaleReceipt
from queue_pg.errors import translate
from tests import test_hostile_roles as hostile_roles
from tests.test_access import ADMIN, CONSUMER, PRODUCER, MakeRole, Role, make_role  # noqa: F401

MINE, THEIRS = "mine", "theirs"


@dataclass
class World:
    owner: psycopg.Connection[Any]
    admin: Client
    new_role: MakeRole

    run = hostile_roles.World.run  # one statement as a role, errors translated
    count = hostile_roles.World.count  # one value, read by the owner

    def role(self, label: str, *grants: tuple[str, str], groups: tuple[str, ...] = ()) -> Role:
        """A LOGIN role with `grants` [(queue, privilege)], in the groups they need."""
        need = set(groups) | {PRODUCER if p == "send" else CONSUMER for _, p in grants if p != "manage"}
        role = self.new_role(label, *(sorted(need) or [CONSUMER]))
        for queue, privilege in grants:
            self.admin.grant(queue, role.name, privilege)
        return role


@pytest.fixture
def world(clean: str, request: pytest.FixtureRequest, conn: psycopg.Connection[Any]) -> Iterator[World]:
    with Client(clean, sweep_interval=None) as admin:
        admin.create_queue(MINE)
        admin.create_queue(THEIRS)
        yield World(conn, admin, request.getfixturevalue("make_role"))


# --- in-flight limit: a release ends the receipt ------------------------------------------------


def _hoard(world: World, role: Role, queue: str, rounds: int) -> list[str]:
    """Receive what the limit allows, release each with a backoff, again; every receipt got."""
    got: list[str] = []
    with role.connect() as c, translate():
        for _ in range(rounds):
            try:
                rows = c.execute("SELECT receipt FROM queue_pg.receive(%s, 2, 600)", [queue]).fetchall()
            except psycopg.Error as e:  # OverLimit: other consumers hold the slots now
                if e.sqlstate != "QP008":
                    raise
                time.sleep(0.01)
                continue
            for (receipt,) in rows:
                c.execute("SELECT queue_pg.change_visibility(%s, %s, 50, release => true)", [queue, receipt])
                got.append(receipt)
    return got


def _settle_all(world: World, role: Role, queue: str, receipts: list[str]) -> int:
    """How many of `receipts` still delete their message."""
    deleted = 0
    with role.connect() as c, translate():
        for receipt in receipts:
            try:
                row = c.execute("SELECT queue_pg.delete_message(%s, %s)", [queue, receipt]).fetchone()
                deleted += bool(row and row[0])
            except psycopg.Error as e:  # StaleReceipt
                if e.sqlstate != "QP005":
                    raise
    return deleted


def test_a_release_gives_up_the_receipt_so_the_in_flight_limit_holds(world: World) -> None:
    world.admin.alter_queue(MINE, in_flight_limit=2)
    world.admin.send_batch(MINE, list(range(40)))
    consumers = [world.role(f"c{i}", (MINE, "receive")) for i in range(4)]
    hoards: list[list[str]] = [[] for _ in consumers]
    errors: list[BaseException] = []

    def hoard(i: int) -> None:
        try:
            hoards[i] = _hoard(world, consumers[i], MINE, 8)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=hoard, args=(i,)) for i in range(len(consumers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sum(map(len, hoards)) >= 8
    # a released lease holds no slot, and its receipt deletes nothing any more
    assert world.count("SELECT count(*) FROM queue_pg.in_flight_messages WHERE queue = 'mine'") == 0
    assert sum(_settle_all(world, c, MINE, h) for c, h in zip(consumers, hoards, strict=True)) == 0
    assert world.count("SELECT count(*) FROM queue_pg.messages") == 40
    with pytest.raises(StaleReceipt):
        world.run(consumers[0], "SELECT queue_pg.update_message('mine', %s, '1')", hoards[0][-1])


def test_a_release_gives_up_the_receipt_so_max_running_holds(world: World) -> None:
    world.admin.limit_task(MINE, "job", "mine-job", 2)
    consumer = world.role("worker", ("mine-job", "receive"))
    world.admin.send_batch(MINE, list(range(10)), attributes=[{"type": "job"}] * 10)
    receipts = _hoard(world, consumer, "mine-job", 4)
    assert len(receipts) == 8
    assert _settle_all(world, consumer, "mine-job", receipts) == 0


def test_a_release_to_visible_keeps_the_receipt(world: World) -> None:
    """timeout 0 makes the message visible at once: its receipt stays good until someone else
    receives it (SQS, Azure), which holds nothing beyond the limit."""
    consumer = world.role("c", (MINE, "receive"))
    world.admin.send(MINE, 1)
    [(receipt,)] = world.run(consumer, "SELECT receipt FROM queue_pg.receive('mine', 1, 600)")
    world.run(consumer, "SELECT queue_pg.change_visibility('mine', %s, 0)", receipt)
    assert world.run(consumer, "SELECT queue_pg.delete_message('mine', %s)", receipt) == [(True,)]


# --- redrive writes only where the caller may send -----------------------------------------------


def _dead_letters(world: World) -> None:
    """Queues src and other dead-letter into dlq; one message of each lands there."""
    world.admin.create_queue("dlq")
    for q in ("src", "other"):
        world.admin.create_queue(q, dead_letter_queue="dlq", max_receive_count=1)
        world.admin.send(q, {"from": q})
        assert len(world.admin.receive(q, visibility_timeout=0)) == 1
        assert world.admin.receive(q) == []  # the second receive moves it
    assert world.count("SELECT count(*) FROM queue_pg.messages m JOIN queue_pg.queues q"
                       " ON q.id = m.queue_id WHERE q.name = 'dlq'") == 2


def _where(world: World) -> dict[str, str]:
    return dict(world.owner.execute(
        "SELECT m.body ->> 'from', q.name FROM queue_pg.messages m JOIN queue_pg.queues q ON q.id = m.queue_id"
    ).fetchall())


def test_redrive_moves_no_message_into_a_queue_the_caller_may_not_send_to(world: World) -> None:
    _dead_letters(world)
    manager = world.role("dlq_manager", ("dlq", "manage"), ("dlq", "receive"), ("other", "send"))
    # the manager rewrites the dead letter from src, then asks to move everything back
    rows = world.run(manager, "SELECT receipt, body FROM queue_pg.receive('dlq', 10, 0)")
    for receipt, body in rows:
        if body["from"] == "src":
            world.run(manager, "SELECT queue_pg.update_message('dlq', %s, '{\"from\": \"src\", \"evil\": 1}')",
                      receipt)
    assert world.run(manager, "SELECT queue_pg.redrive('dlq')") == [(1,)]
    assert _where(world) == {"src": "dlq", "other": "other"}
    with pytest.raises(AccessDenied, match="send"):
        world.run(manager, "SELECT queue_pg.redrive('dlq', 'src')")
    with pytest.raises(AccessDenied, match="send"):
        world.run(manager, "SELECT queue_pg.start_redrive('dlq', 'src')")
    assert _where(world) == {"src": "dlq", "other": "other"}


def test_a_redrive_task_moves_only_what_its_starter_may_send_and_any_sweep_keeps_to_that(
    world: World,
) -> None:
    _dead_letters(world)
    manager = world.role("dlq_manager", ("dlq", "manage"), ("other", "send"))
    [(task,)] = world.run(manager, "SELECT queue_pg.start_redrive('dlq', rate => 100)")
    for _ in range(3):  # whoever advances it (the owner's sweep here) acts for its starter
        world.owner.execute("SELECT queue_pg.sweep()")
        world.run(manager, "SELECT queue_pg.redrive_step()")
    assert _where(world) == {"src": "dlq", "other": "other"}
    [(status, moved)] = world.owner.execute(
        "SELECT status, moved FROM queue_pg.redrive_tasks WHERE id = %s", [task]).fetchall()
    assert (status, moved) == ("completed", 1)
    # an admin's task moves both
    world.admin.send("other", {"from": "again"})
    world.admin.start_redrive("dlq")
    assert _where(world)["src"] == "src"


# --- history retention: one queue's setting cannot keep every queue's history ---------------------


def test_a_manager_cannot_make_every_queues_history_stay(world: World) -> None:
    manager = world.role("manager", (MINE, "manage"))
    hundred_years = 3153600000
    with pytest.raises(InvalidParameter, match=r"history_retention = 3153600000 is out of range: allowed 3600 to 2592000"):
        world.run(manager, "SELECT * FROM queue_pg.alter_queue('mine', history_retention => %s)", hundred_years)
    world.run(manager, "SELECT * FROM queue_pg.alter_queue('mine', history_retention => 2592000)")
    world.run(manager, "SELECT * FROM queue_pg.alter_queue('mine', visibility_timeout => 60)")
    world.admin.alter_queue(THEIRS, history_retention=hundred_years)  # an admin decides for all
    world.run(manager, "SELECT * FROM queue_pg.alter_queue('mine', history_retention => 2592000)")
    assert world.count("SELECT history_retention FROM queue_pg.queues WHERE name = 'mine'") == 2592000


# --- a receive kept open in a transaction holds up no other role ---------------------------------


@pytest.mark.parametrize(("how", "wait"), [("sql", 0), ("sql", 2), ("client", 2)])
def test_a_receive_kept_open_holds_up_no_other_roles_receive(world: World, how: str, wait: float) -> None:
    """Nobody can count the claims of a transaction still open, so while one holds the queue's
    in-flight count the others answer "full" (a long poll: nothing, at its end) without waiting
    for it; their deletes go on."""
    world.admin.alter_queue(MINE, in_flight_limit=10)
    world.admin.send_batch(MINE, list(range(5)))
    a = world.role("a", (MINE, "receive"))
    b = world.role("b", (MINE, "receive"))
    [(early,)] = world.run(b, "SELECT receipt FROM queue_pg.receive('mine', 1, 600)")
    rows: list[Any] = []
    with a.connect() as held:
        held.execute("BEGIN")
        assert len(held.execute("SELECT * FROM queue_pg.receive('mine', 1, 600)").fetchall()) == 1
        with b.connect() as c:
            c.execute("SET statement_timeout = '20s'")
            started = time.monotonic()
            with translate():
                deleted = c.execute("SELECT queue_pg.delete_message('mine', %s)", [early]).fetchone()
            try:
                if how == "client":  # a long poll on LISTEN, one attempt at a time
                    with b.client() as bc:
                        rows = bc.receive(MINE, visibility_timeout=600, wait=wait)
                else:
                    with translate():
                        rows = c.execute("SELECT * FROM queue_pg.receive('mine', 1, 600, wait => %s)",
                                         [wait]).fetchall()
            except OverLimit as e:
                assert wait == 0 and "held by a transaction still open" in str(e)
            took = time.monotonic() - started
        held.execute("ROLLBACK")
    assert rows == [] and deleted == (True,)
    assert took < wait + 4, took  # measured: about 1 s (short poll), never near the 20 s
    # once it ends, receives go on, and the count is right
    assert len(world.run(b, "SELECT * FROM queue_pg.receive('mine', 10, 600)")) == 4
    with pytest.raises(OverLimit):
        _full(world, b)


def _full(world: World, role: Role) -> None:
    """Ten in flight: one more is refused."""
    world.admin.send_batch(MINE, list(range(10)))
    assert len(world.run(role, "SELECT * FROM queue_pg.receive('mine', 10, 600)")) == 6
    world.run(role, "SELECT * FROM queue_pg.receive('mine', 1, 600)")


# --- listing: a role sees the queues it has a grant on ---------------------------------------------


def test_a_role_lists_and_reads_only_the_queues_it_has_a_grant_on(world: World) -> None:
    world.admin.create_queue("shared")
    producer = world.role("p", (MINE, "send"))
    consumer = world.role("c", ("shared", "receive"))
    admin = world.new_role("adm", ADMIN)
    assert [r[0] for r in world.run(producer, "SELECT name FROM queue_pg.list_queues()")] == [MINE]
    assert [r[0] for r in world.run(consumer, "SELECT name FROM queue_pg.list_queues()")] == ["shared"]
    assert [r[0] for r in world.run(admin, "SELECT name FROM queue_pg.list_queues()")] == [MINE, "shared", THEIRS]
    for query in ("SELECT * FROM queue_pg.get_queue('theirs')",
                  "SELECT * FROM queue_pg.redrive_allow('theirs')"):
        with pytest.raises(AccessDenied, match="theirs"):
            world.run(producer, query)
    assert world.run(producer, "SELECT name FROM queue_pg.get_queue('mine')") == [(MINE,)]
    for view, column in (("queue_stats", "queue"), ("in_flight_messages", "queue"),
                         ("dead_letters", "dead_letter_queue"), ("tuning_log", "queue"),
                         ("schedules", "queue")):
        names = {r[0] for r in world.run(producer, f"SELECT {column} FROM queue_pg.{view}")}
        assert names <= {MINE}, (view, names)
    # a queue that does not exist and one without a grant say different things to a limited
    # role, as they do for every other call: the name alone is not a secret
    with pytest.raises(AccessDenied):
        world.run(consumer, "SELECT * FROM queue_pg.get_queue('theirs')")


# --- DDL and maintenance: one lock order ------------------------------------------------------------


def test_drop_queue_never_deadlocks_with_sweep_and_tune(world: World, clean: str) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []
    rounds = {"drop": 0, "sweep": 0, "tune": 0}

    def loop(kind: str, body: Any) -> None:
        try:
            with psycopg.connect(clean, autocommit=True) as c:
                while not stop.is_set():
                    body(c)
                    rounds[kind] += 1
        except BaseException as e:  # reported below
            errors.append(e)
            stop.set()

    def drop(c: psycopg.Connection[Any]) -> None:
        name = f"d{rounds['drop'] % 3}"
        c.execute("SELECT queue_pg.create_queue(%s)", [name])
        c.execute("SELECT queue_pg.alter_tuning(%s, auto_tune => true)", [name])
        c.execute("SELECT queue_pg.send(%s, '1')", [name])
        [(receipt,)] = c.execute("SELECT receipt FROM queue_pg.receive(%s, 1, 0)", [name]).fetchall()
        c.execute("SELECT * FROM queue_pg.receive(%s, 1, 600)", [name])
        with contextlib.suppress(psycopg.Error):  # a stale receipt: counted in its counter
            c.execute("SELECT queue_pg.delete_message(%s, %s)", [name, receipt])
        c.execute("SELECT queue_pg.drop_queue(%s)", [name])

    def sweep(c: psycopg.Connection[Any]) -> None:
        with c.transaction():  # each sweep takes a fresh sample
            c.execute("DELETE FROM queue_pg.queue_samples")
            c.execute("UPDATE queue_pg.tuning_runs SET at = NULL")
            c.execute("SELECT queue_pg.sweep()")

    def tune(c: psycopg.Connection[Any]) -> None:
        c.execute("SELECT * FROM queue_pg.tune()")
        c.execute("SELECT * FROM queue_pg.queue_stats")

    threads = [threading.Thread(target=loop, args=(k, f)) for k, f in
               (("drop", drop), ("sweep", sweep), ("sweep", sweep), ("tune", tune))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not stop.is_set():
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert rounds["drop"] > 10 and rounds["sweep"] > 10 and rounds["tune"] > 10, rounds


def _waiting(owner: psycopg.Connection[Any], pid: int) -> bool:
    return bool(owner.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                              [pid]).fetchone()[0])


def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, f"waited 20 s for {what}"
        time.sleep(0.02)


def _drop_waiting(world: World, queue: str, dropped: list[BaseException | None]) -> threading.Thread:
    """drop_queue(queue) on a connection of its own, in a thread, once it waits for a lock
    (its outcome in `dropped`: None or the error)."""

    def drop() -> None:
        try:
            with psycopg.connect(world.owner.info.dsn, autocommit=True) as d:
                d.execute("SELECT queue_pg.drop_queue(%s)", [queue])
            dropped.append(None)
        except BaseException as e:  # reported by the caller
            dropped.append(e)

    dropper = threading.Thread(target=drop)
    dropper.start()
    _until(lambda: world.owner.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT queue_pg.drop_queue%%'"
        " AND wait_event_type = 'Lock'").fetchone()[0] == 1, "the drop to wait for the reader")
    return dropper


def test_stats_reader_never_waits_for_a_drop_behind_an_alter(world: World) -> None:
    """A reader whose snapshot predates an alter of the queue, while a drop of it waits for that
    reader's transaction (it read the queue's counters earlier): FOR KEY SHARE SKIP LOCKED waits
    for the drop on the newer row version, and the two deadlock. The reader must skip the busy
    row instead and report the queue from its sample."""
    reader = world.role("reader", (MINE, "receive"))
    gate = psycopg.connect(world.owner.info.dsn)  # holds the grants table still mid-read
    dropped: list[BaseException | None] = []
    with psycopg.connect(world.owner.info.dsn) as r:
        pid = r.info.backend_pid
        # the counters read earlier in the transaction (held to its end: the drop waits for
        # them), as the owner: no grant is read yet
        r.execute("SELECT pg_sequence_last_value(format('queue_pg.sent_%%s', id)::regclass)"
                  " FROM queue_pg.queues WHERE name = %s", [MINE])
        r.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(reader.name)))
        gate.execute("SET lock_timeout = '10s'")
        gate.execute("LOCK TABLE queue_pg.grants IN ACCESS EXCLUSIVE MODE")
        stats: list[Any] = []

        def read_stats() -> None:
            try:
                stats.append(r.execute("SELECT queue, approximate FROM queue_pg.queue_stats").fetchall())
            except BaseException as e:  # reported below
                stats.append(e)

        read = threading.Thread(target=read_stats)
        read.start()  # its snapshot is taken; its check of the grants waits for the gate
        _until(lambda: _waiting(world.owner, pid), "the reader to wait at the gate")
        world.owner.execute("SELECT queue_pg.alter_queue(%s, visibility_timeout => 99)", [MINE])
        dropper = _drop_waiting(world, MINE, dropped)
        gate.commit()  # the reader goes on: it meets the queue's row, newer than its snapshot
        read.join(30)
        assert not read.is_alive()
        r.commit()
    dropper.join(30)
    gate.close()
    assert dropped == [None], dropped  # no deadlock victim on either side
    assert stats[0] == [(MINE, True)]  # its row busy: the figures from its sample, approximate
    assert world.count("SELECT count(*) FROM queue_pg.queues WHERE name = %s", MINE) == 0


def test_no_function_takes_key_share_with_skip_locked(conn: psycopg.Connection[Any]) -> None:
    """The test above, for every function: FOR KEY SHARE does not skip a row whose newer version
    is locked (it waits), so SKIP LOCKED with it promises what it does not keep."""
    rows = conn.execute(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'queue_pg' AND p.prosrc ~* 'for\\s+key\\s+share\\s+skip\\s+locked'").fetchall()
    assert rows == []


def test_stats_reader_left_open_blocks_no_alter(world: World) -> None:
    """A role that reads queue_stats (or stats) and leaves its transaction open holds no row of
    the queues it read: their manager's alter_queue goes through at once. drop_queue waits for
    that transaction (PostgreSQL keeps a sequence's lock to the end of the transaction that read
    it), and a read meanwhile reports the queue from its sample instead of waiting: no circle."""
    reader = world.role("reader", (MINE, "receive"))
    world.admin.send(MINE, "a job")
    dropped: list[BaseException | None] = []
    with psycopg.connect(reader.dsn) as r:
        assert r.execute("SELECT queue, visible FROM queue_pg.queue_stats").fetchall() == [(MINE, 1)]
        assert r.execute("SELECT visible FROM queue_pg.stats(%s)", [MINE]).fetchall() == [(1,)]
        world.owner.execute("SET lock_timeout = '3s'")
        world.owner.execute("SELECT queue_pg.alter_queue(%s, visibility_timeout => 99)", [MINE])
        world.owner.execute("RESET lock_timeout")
        dropper = _drop_waiting(world, MINE, dropped)
        assert r.execute("SELECT queue, approximate FROM queue_pg.queue_stats").fetchall() == [(MINE, True)]
    dropper.join(30)
    assert dropped == [None], dropped


def test_sweep_left_open_by_a_limited_role_blocks_no_other_queue(world: World) -> None:
    """A sweep samples the queues in its scope and holds their rows to its transaction's end; a
    role granted one queue that sweeps inside a transaction it leaves open must not stall the
    managers of the others: its sweep samples (and holds) only the queues it may read."""
    worker = world.role("worker", (MINE, "receive"))
    mine, theirs = (world.count("SELECT id FROM queue_pg.queues WHERE name = %s", q) for q in (MINE, THEIRS))
    with psycopg.connect(worker.dsn) as w:
        w.execute("SELECT queue_pg.sweep()")
        world.owner.execute("SET lock_timeout = '3s'")
        world.owner.execute("SELECT queue_pg.alter_queue(%s, visibility_timeout => 99)", [THEIRS])
        world.owner.execute("RESET lock_timeout")
    assert world.count("SELECT array_agg(DISTINCT queue_id) FROM queue_pg.queue_samples") == [mine]
    world.owner.execute("SELECT queue_pg.sweep()")  # the owner's: every queue without a recent one
    assert world.count("SELECT array_agg(DISTINCT queue_id ORDER BY queue_id) FROM queue_pg.queue_samples") \
        == sorted([mine, theirs])
    assert world.count("SELECT count(*) FROM queue_pg.queue_samples WHERE queue_id = %s", mine) == 1
