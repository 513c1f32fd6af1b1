"""Chords whose callback can never run are swept (queue_pg._forget_chords, run by every sweep):
a member whose message is gone before it succeeded (purged, expired, deleted, its queue
dropped) makes its chord dead, and the sweep deletes it; a chord that can still complete (its
members' messages all somewhere, a dead-lettered one included) is never touched, however the
sweep and its members' completions interleave. A role with a grant on one queue sweeps only its
own queues' chords and learns nothing of the others."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest

import queue_pg
from tests.test_access import CONSUMER, PRODUCER, MakeRole, make_role  # noqa: F401
from tests.test_worker import wait_until

Q = "cs"


def chord_ids(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return [r[0] for r in c.execute("SELECT id FROM queue_pg.chords ORDER BY id")]


def member_rows(dsn: str, chord: int) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM queue_pg.chord_members WHERE chord_id = %s",
                        [chord]).fetchone()
    assert row is not None
    return int(row[0])


def start(c: queue_pg.Client, n: int, queue: str = Q, callback_queue: str = Q,
          label: str = "cb") -> tuple[int, list[int]]:
    """A chord of ``n`` members on ``queue``, its callback to ``callback_queue``."""
    return c.send_chord([{"queue": queue, "body": {"task": "t.member", "args": [i]}}
                         for i in range(n)], callback_queue, {"task": "t.callback",
                                                              "args": [label]})


def callbacks(c: queue_pg.Client, queue: str = Q) -> list[queue_pg.Message]:
    return [m for m in c.peek(queue, 100) if m.body.get("task") == "t.callback"]


def settle_all(c: queue_pg.Client, ids: list[int], queue: str = Q) -> list[bool]:
    """Receive the messages ``ids`` of ``queue`` and complete each (complete_step)."""
    got = {m.id: m for m in c.receive(queue, 10, visibility_timeout=60) if m.id in ids}
    assert set(got) == set(ids), (got, ids)
    return [c.complete_step(queue, got[i].receipt or "", i) for i in ids]


@pytest.fixture
def db(clean: str) -> str:
    with queue_pg.Client(clean, sweep_interval=None) as c:
        c.create_queue(f"{Q}-dlq")
        c.create_queue(Q, dead_letter_queue=f"{Q}-dlq", max_receive_count=10)
    return clean


@pytest.mark.parametrize("how", ["purge", "delete", "drop", "expire"])
def test_a_chord_with_a_member_gone_is_swept_and_one_that_can_complete_is_not(
    db: str, how: str
) -> None:
    with queue_pg.Client(db, sweep_interval=None) as c:
        c.create_queue("gone", message_ttl=1 if how == "expire" else None)
        # dead: one member on a queue that loses it, two on Q
        dead, dead_ids = c.send_chord(
            [{"queue": "gone", "body": {"task": "t.member", "args": [0]}}]
            + [{"queue": Q, "body": {"task": "t.member", "args": [i]}} for i in (1, 2)], Q,
            {"task": "t.callback", "args": ["dead"]})
        # alive: one member dead-lettered (it can be redriven), one leased, one waiting
        alive, alive_ids = start(c, 3, label="alive")
        got = {m.id: m for m in c.receive(Q, 10, visibility_timeout=60)}
        assert c.dead_letter(Q, got[alive_ids[0]].receipt or "", "failed for good")
        c.change_visibility(Q, got[alive_ids[2]].receipt or "", 0)
        assert c.sweep() == 0 and chord_ids(db) == [dead, alive]  # nothing gone yet
        if how == "purge":
            assert c.purge("gone") == 1
        elif how == "delete":
            [m] = c.receive("gone", 1, visibility_timeout=60)
            assert c.delete("gone", m.receipt or "")
        elif how == "drop":
            c.drop_queue("gone")
        if how == "expire":
            wait_until("the member expired and its chord swept",
                       lambda: c.sweep() >= 0 and chord_ids(db) == [alive], timeout=30)
        else:
            c.sweep()
        assert chord_ids(db) == [alive] and member_rows(db, dead) == 0
        assert member_rows(db, alive) == 3
        # the dead chord's other members complete as plain jobs; no callback ever
        assert c.complete_step(Q, got[dead_ids[1]].receipt or "", 1)
        assert c.complete_step(Q, got[dead_ids[2]].receipt or "", 2)
        assert callbacks(c) == []
        # the living chord completes: its dead-lettered member redriven, then all three
        assert c.redrive(f"{Q}-dlq") == 1
        c.sweep()
        assert chord_ids(db) == [alive]
        assert c.complete_step(Q, got[alive_ids[1]].receipt or "", alive_ids[1])
        assert callbacks(c) == []
        assert settle_all(c, [alive_ids[0], alive_ids[2]]) == [True, True]
        [cb] = callbacks(c)
        assert cb.body["args"] == ["alive", alive_ids]
        assert chord_ids(db) == []


def test_the_periodic_sweep_logs_the_chords_it_removed(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    hostile = "t.cb\x1b]0;owned\x07\u202e"  # a callback's task name: escaped in the log
    with queue_pg.Client(db, sweep_interval=None) as c:
        chord, _ = c.send_chord([{"queue": Q, "body": {"task": "t.member"}}] * 2, Q,
                                {"task": hostile})
        c.purge(Q)
    caplog.set_level(logging.INFO, logger="queue_pg")
    with queue_pg.Client(db, sweep_interval=0.01) as c:
        c.receive(Q, 1, wait=0)  # a receive sweeps when sweep_interval has passed
        wait_until("the sweep", lambda: not chord_ids(db) or c.receive(Q, 1, wait=0) == [])
        assert chord_ids(db) == []
    [line] = [r.getMessage() for r in caplog.records if "chord" in r.getMessage()]
    assert f"removed 1 chord(s) whose callback can never run: chord {chord}" in line
    assert f"on queue '{Q}', 2 of 2 members left" in line
    assert "\x1b" not in line and "\x07" not in line and "\u202e" not in line
    assert "'t.cb\\x1b]0;owned\\x07\\u202e'" in line


@pytest.mark.parametrize("round_", range(3))
def test_sweeps_racing_the_members_lose_no_callback_and_send_none_twice(
    db: str, round_: int
) -> None:
    """8 chords of 3 members, half of them dead (a member deleted). Every member left is
    completed by a thread of its own while 4 threads sweep in a loop, all released by one
    barrier: each living chord's callback is sent exactly once, no dead one's ever; every
    completion and every sweep succeeds (no deadlock: both lock members before the chord)."""
    n_chords, size, sweepers = 8, 3, 4
    with queue_pg.Client(db, sweep_interval=None, max_size=4) as c:
        made = [start(c, size, label=f"c{k}") for k in range(n_chords)]
        got = {m.id: m for m in c.receive(Q, n_chords * size, visibility_timeout=60)}
        assert len(got) == n_chords * size
        dead = {chord for k, (chord, _) in enumerate(made) if k % 2}
        finishing: list[queue_pg.Message] = []
        for chord, ids in made:
            if chord in dead:  # its first member deleted, not completed: the chord is dead
                assert c.delete(Q, got[ids[0]].receipt or "")
                finishing += [got[i] for i in ids[1:]]
            else:
                finishing += [got[i] for i in ids]
    barrier = threading.Barrier(len(finishing) + sweepers)
    errors: list[BaseException] = []
    completed: list[bool] = []
    done = threading.Event()

    def finish(m: queue_pg.Message) -> None:
        try:
            with psycopg.connect(db, autocommit=True) as conn:
                barrier.wait(30)
                row = conn.execute("SELECT queue_pg.complete_step(%s, %s, %s::jsonb)",
                                   [Q, m.receipt, str(m.id)]).fetchone()
                assert row is not None
                completed.append(row[0])
        except BaseException as exc:
            errors.append(exc)

    def sweep() -> None:
        try:
            with psycopg.connect(db, autocommit=True) as conn:
                barrier.wait(30)
                while not done.is_set():
                    conn.execute("SELECT queue_pg.sweep()")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(m,)) for m in finishing]
    swept = [threading.Thread(target=sweep) for _ in range(sweepers)]
    for t in threads + swept:
        t.start()
    for t in threads:
        t.join(60)
    done.set()
    for t in swept:
        t.join(60)
    assert errors == [] and completed == [True] * len(finishing)
    with queue_pg.Client(db, sweep_interval=None) as c:
        c.sweep()  # a dead chord whose members were all being settled was left for later
        sent: dict[str, int] = {}
        for m in callbacks(c):
            sent[m.body["args"][0]] = sent.get(m.body["args"][0], 0) + 1
            chord = next(ch for ch, ids in made if m.body["args"][1] == ids)
            assert chord not in dead
        assert sent == {f"c{k}": 1 for k in range(n_chords) if k % 2 == 0}
    assert chord_ids(db) == []


def test_a_role_with_one_queue_sweeps_only_its_chords_and_sees_no_other(
    db: str, make_role: MakeRole  # noqa: F811
) -> None:
    with queue_pg.Client(db, sweep_interval=None) as admin:
        admin.create_queue("mine")
        admin.create_queue("theirs")
        ours, _ = start(admin, 2, queue="mine", callback_queue="mine", label="ours")
        other, _ = start(admin, 2, queue="theirs", callback_queue="theirs", label="other")
        # members on its queue, the callback on another's: not its own to sweep
        mixed, _ = start(admin, 2, queue="mine", callback_queue="theirs", label="mixed")
        spread, _ = admin.send_chord(
            [{"queue": q, "body": {"task": "t.member"}} for q in ("mine", "theirs")], "mine",
            {"task": "t.callback", "args": ["spread"]})
        admin.purge("mine")
        admin.purge("theirs")
        every = [ours, other, mixed, spread]
        assert chord_ids(db) == every
        role = make_role("chord_sweeper", CONSUMER, PRODUCER)
        admin.grant("mine", role.name, "receive")
        admin.grant("mine", role.name, "send")
        heard: list[str] = []
        with role.connect() as conn:
            conn.add_notice_handler(lambda d: heard.append(d.message_primary or ""))
            conn.execute("SELECT queue_pg.sweep()")
            for query in ("SELECT * FROM queue_pg.chords",
                          "SELECT * FROM queue_pg.chord_members",
                          "SELECT queue_pg._forget_chords(100)"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(query)
        assert chord_ids(db) == [other, mixed, spread]
        [said] = heard
        assert f"chord {ours} " in said and "'ours'" not in said
        for them in (other, mixed, spread):
            assert f"chord {them} " not in said
        assert "theirs" not in said
        admin.sweep()  # the owner sweeps every queue's
        assert chord_ids(db) == []


def test_a_dropped_callback_queue_does_not_hold_the_last_member(db: str) -> None:
    """The callback queue dropped while the members run: the chord is not swept (its members
    are all there), and its last member is settled all the same; the callback went with its
    queue, which a WARNING says."""
    with queue_pg.Client(db, sweep_interval=None) as c:
        c.create_queue("cbq")
        chord, ids = start(c, 2, callback_queue="cbq")
        c.drop_queue("cbq")
        c.sweep()
        assert chord_ids(db) == [chord]
        got = {m.id: m for m in c.receive(Q, 10, visibility_timeout=60)}
        heard: list[str] = []
        with psycopg.connect(db, autocommit=True) as conn:
            conn.add_notice_handler(lambda d: heard.append(d.message_primary or ""))
            for i in ids:
                row = conn.execute("SELECT queue_pg.complete_step(%s, %s, '1')",
                                   [Q, got[i].receipt]).fetchone()
                assert row == (True,)
        assert heard == [f"chord {chord}: its callback 't.callback' was not sent: its queue"
                         " 'cbq' was dropped"]
        assert chord_ids(db) == [] and c.peek(Q, 10) == []


def test_sweeping_many_dead_chords_is_bounded_by_max_rows(db: str) -> None:
    with queue_pg.Client(db, sweep_interval=None) as c:
        made = [start(c, 1)[0] for _ in range(5)]
        c.purge(Q)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT queue_pg.sweep(2)")
        assert chord_ids(db) == made[2:]
        conn.execute("SELECT queue_pg.sweep(2)")
        conn.execute("SELECT queue_pg.sweep(2)")
    assert chord_ids(db) == []
