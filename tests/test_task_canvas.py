"""Chains, groups and chords (queue_pg.jobs.canvas, sql/api/54_task_steps.sql) on a real server:
the next step runs with the previous result when it succeeded and not when it failed; a chord's
callback runs once with every result, however many workers finish its members at once; all of
it enqueued in the caller's transaction."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import queue_pg
from queue_pg import chain, chord, group
from queue_pg.errors import InvalidParameter
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.canvas import ChordResult
from queue_pg.jobs.tasks import Registry
from queue_pg.jobs.worker import Worker
from tests.test_access import CONSUMER, PRODUCER, MakeRole, make_role  # noqa: F401
from tests.test_worker import wait_until

REG = Registry()
Q = "flow"


def note(key: str, value: Any) -> None:
    """What a run did, in table flow_runs of the test's database (set by the fixture)."""
    with psycopg.connect(DSN[0], autocommit=True) as c:
        c.execute("INSERT INTO flow_runs (key, value) VALUES (%s, %s)",
                  [key, psycopg.types.json.Jsonb(value)])


DSN: list[str] = [""]


@queue_pg.task(queue=Q, name="flow.add", registry=REG, store_result=True)
def add(a: int, b: int) -> int:
    return a + b


@queue_pg.task(queue=Q, name="flow.mul", registry=REG, store_result=True)
def mul(x: int, by: int) -> int:
    return x * by


@queue_pg.task(queue=Q, name="flow.record", registry=REG)
def record(key: str, value: Any) -> None:
    note(key, value)


@queue_pg.task(queue=Q, name="flow.gate", registry=REG, retries=0,
               backoff=Backoff(base=0.05, cap=0.05))
def gate(key: str, x: int) -> int:
    """Fails until flow_runs holds ('open', key)."""
    with psycopg.connect(DSN[0], autocommit=True) as c:
        if not c.execute("SELECT 1 FROM flow_runs WHERE key = 'open' AND value = to_jsonb(%s::text)",
                         [key]).fetchone():
            raise RuntimeError(f"gate {key} closed")
    return x


def runs(dsn: str, key: str) -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return [r[0] for r in c.execute("SELECT value FROM flow_runs WHERE key = %s ORDER BY n",
                                        [key]).fetchall()]


def chords(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as check:
        return check.execute("SELECT * FROM queue_pg.chords ORDER BY id").fetchall()


@pytest.fixture
def flow_db(clean: str) -> Iterator[str]:
    DSN[0] = clean
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS flow_runs")
        c.execute("CREATE TABLE flow_runs (n bigserial PRIMARY KEY, key text, value jsonb)")
    with queue_pg.Client(clean, sweep_interval=None) as c:
        c.create_queue(f"{Q}-dlq")
        c.create_queue(Q, dead_letter_queue=f"{Q}-dlq", max_receive_count=10)
    REG.set_client(None)
    yield clean
    REG.set_client(None)


class Workers:
    """``n`` threaded workers on clients of their own, serving the flow queue."""

    def __init__(self, dsn: str, n: int = 1, concurrency: int = 4) -> None:
        self.clients = [queue_pg.Client(dsn, sweep_interval=None) for _ in range(n)]
        self.workers = [Worker(c, [Q], REG, concurrency=concurrency, wait=0.2)
                        for c in self.clients]
        self.threads = [threading.Thread(target=w.run, daemon=True) for w in self.workers]

    def __enter__(self) -> Workers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for w in self.workers:
            w.stop()
        for t in self.threads:
            t.join(30)
        for c in self.clients:
            c.close()


def test_a_chain_passes_each_result_to_the_next_step(flow_db: str) -> None:
    with queue_pg.Client(flow_db, sweep_interval=None) as c, Workers(flow_db):
        first = chain(add.s(1, 2), mul.s(10), record.s("chained")).apply_async(client=c)
        assert first.get(timeout=30, client=c) == 3
        assert wait_until("the last step", lambda: runs(flow_db, "chained")) == [30]
        # each step ran once: three finished messages in the history, one of each type

        def history() -> list[tuple[Any, ...]]:
            with psycopg.connect(flow_db, autocommit=True) as conn:
                return conn.execute("SELECT type, outcome FROM queue_pg.message_history"
                                    " WHERE queue = %s ORDER BY message_id", [Q]).fetchall()

        types = wait_until("three settled", lambda: len(history()) == 3 and history())
        assert types == [("flow.add", "deleted"), ("flow.mul", "deleted"),
                         ("flow.record", "deleted")]


def test_the_pipe_spelling_and_arguments_are_checked_now(flow_db: str) -> None:
    assert repr(chain(add.s(1, 2)) | mul.s(3)) == "flow.add.s(1, 2) | flow.mul.s(3)"
    with pytest.raises(TypeError, match="must take one more argument"):
        chain(add.s(1, 2), add.s(1, 2))  # add(1, 2, result): too many
    with pytest.raises(TypeError, match="must take one more argument"):
        chord([add.s(1, 2)], mul.s())  # mul(results): by is missing
    with pytest.raises(TypeError, match="not JSON"):
        chain(add.s(1, 2), mul.s(by=object()))
    with pytest.raises(TypeError, match="signatures"):
        group(add)  # type: ignore[arg-type]


def test_a_failed_step_stops_the_chain_and_says_so_and_a_redrive_goes_on(
    flow_db: str
) -> None:
    with queue_pg.Client(flow_db, sweep_interval=None) as c, Workers(flow_db):
        first = chain(gate.s("g", 6), mul.s(7), record.s("after-gate")).apply_async(client=c)
        [dead] = wait_until("dead-lettered", lambda: c.peek(f"{Q}-dlq", 10))
        assert dead.id == int(first)
        reason = (dead.attributes or {})["dead_letter_reason"]
        assert reason.startswith("chain stopped: flow.mul, flow.record not run"), reason
        assert "gate g closed" in reason
        assert not c.peek(Q, 10)  # nothing of the rest was sent
        assert runs(flow_db, "after-gate") == []
        note("open", "g")
        assert c.redrive_message(f"{Q}-dlq", dead.id)
        assert wait_until("the rest of the chain",
                          lambda: runs(flow_db, "after-gate")) == [6 * 7]


def test_a_chain_is_enqueued_in_the_callers_transaction(flow_db: str) -> None:
    before = chords(flow_db)
    with psycopg.connect(flow_db) as conn, queue_pg.Client(flow_db, sweep_interval=None) as c:
        chain(add.s(1, 1), record.s("rolled back")).apply_async(conn=conn)
        conn.rollback()
        assert c.peek(Q, 10) == []
        chord([add.s(1, 1), add.s(2, 2)], record.s("rolled back")).apply_async(conn=conn)
        group(add.s(1, 1), add.s(2, 2)).apply_async(conn=conn)
        assert c.peek(Q, 10) == []  # not committed yet
        conn.rollback()
        assert chords(flow_db) == before
        ids = group(add.s(1, 1), add.s(2, 2)).apply_async(conn=conn)
        conn.commit()
        assert sorted(m.id for m in c.peek(Q, 10)) == sorted(ids)


def test_a_group_runs_in_parallel_and_gives_every_result(flow_db: str) -> None:
    with queue_pg.Client(flow_db, sweep_interval=None) as c, Workers(flow_db, concurrency=4):
        results = group(add.s(i, i) for i in range(8)).apply_async(client=c)
        assert results.get(timeout=30, client=c) == [2 * i for i in range(8)]


def test_a_chord_runs_its_callback_once_with_the_results_in_order(flow_db: str) -> None:
    with queue_pg.Client(flow_db, sweep_interval=None) as c, Workers(flow_db, n=3,
                                                                      concurrency=4):
        made = chord(group(mul.s(i, 3) for i in range(30)), record.s("sum")).apply_async(
            client=c)
        assert isinstance(made, ChordResult) and len(made) == 30
        assert wait_until("the callback", lambda: runs(flow_db, "sum"), timeout=60) == [
            [3 * i for i in range(30)]]
        def settled() -> bool:
            with psycopg.connect(flow_db, autocommit=True) as conn:
                return conn.execute("SELECT count(*) FROM queue_pg.message_history"
                                    " WHERE queue = %s", [Q]).fetchone() == (31,)

        wait_until("the callback settled", settled)
        with psycopg.connect(flow_db, autocommit=True) as conn:
            history = conn.execute(
                "SELECT type, count(*) FROM queue_pg.message_history WHERE queue = %s"
                " GROUP BY type ORDER BY type", [Q]).fetchall()
            left = conn.execute("SELECT count(*) FROM queue_pg.chords").fetchone()
        assert history == [("flow.mul", 30), ("flow.record", 1)]
        assert left == (0,)  # the chord's rows went with its callback
    assert runs(flow_db, "sum") == [[3 * i for i in range(30)]]  # and no second run later


@pytest.mark.parametrize("round_", range(3))
def test_members_finishing_at_the_same_moment_send_the_callback_once(
    flow_db: str, round_: int
) -> None:
    """Each member is settled by a thread of its own, all released by one barrier: exactly one
    of them sends the callback."""
    n = 12
    with queue_pg.Client(flow_db, sweep_interval=None, max_size=n + 2) as c:
        made = chord([add.s(i, 0) for i in range(n)], record.s("race")).apply_async(client=c)
        msgs = c.receive(Q, n, visibility_timeout=60)
        assert sorted(m.id for m in msgs) == sorted(made)
        barrier = threading.Barrier(n)
        errors: list[BaseException] = []

        def finish(m: queue_pg.Message) -> None:
            try:
                with psycopg.connect(flow_db, autocommit=True) as conn:
                    barrier.wait(10)
                    assert m.receipt is not None
                    conn.execute("SELECT queue_pg.complete_step(%s, %s, %s::jsonb)",
                                 [Q, m.receipt, str(m.body["args"][0])])
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=finish, args=(m,)) for m in msgs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        callbacks = c.peek(Q, 10)
        assert len(callbacks) == 1
        assert callbacks[0].body == {"task": "flow.record", "args": ["race", list(range(n))],
                                     "kwargs": {}}
        assert (callbacks[0].attributes or {})["type"] == "flow.record"


def test_a_body_naming_a_chord_counts_for_nothing(flow_db: str) -> None:
    """A producer that writes a chord's id into a message of its own does not move the chord:
    members are known by their messages."""
    with queue_pg.Client(flow_db, sweep_interval=None) as c:
        made = chord([add.s(1, 1), add.s(2, 2)], record.s("forged")).apply_async(client=c)
        forged = c.send(Q, {"task": "flow.add", "args": [0, 0], "kwargs": {},
                            "chord": made.chord_id})
        got = {m.id: m for m in c.receive(Q, 10, visibility_timeout=60)}
        assert set(got) == {*made, forged}
        c.complete_step(Q, got[forged].receipt or "", 0)
        c.complete_step(Q, got[made[0]].receipt or "", 2)
        with psycopg.connect(flow_db, autocommit=True) as conn:
            assert conn.execute("SELECT pending FROM queue_pg.chords WHERE id = %s",
                                [made.chord_id]).fetchone() == (1,)
        assert c.peek(Q, 10) == []  # no callback yet (the other member is leased)
        # a second settle of the same member (a stale receipt) counts for nothing either
        assert not c.complete_step(Q, got[made[0]].receipt or "", 2)
        c.complete_step(Q, got[made[1]].receipt or "", 4)
        [cb] = c.peek(Q, 10)
        assert cb.body["args"] == ["forged", [2, 4]]


def test_bad_chords_change_nothing(flow_db: str) -> None:
    call: Callable[..., Any]
    before = chords(flow_db)
    with queue_pg.Client(flow_db, sweep_interval=None) as c:
        call = c.send_chord
        for members, cq, cb in [
            ([], Q, {"task": "x"}),
            ([{"queue": Q, "body": {"task": "x"}}], Q, {"args": []}),
            ([{"queue": Q, "body": "not an object"}], Q, {"task": "x"}),
            ([{"queue": Q, "body": {"task": "x"}}, {"body": {"task": "x"}}], Q, {"task": "x"}),
        ]:
            with pytest.raises(InvalidParameter):
                call(members, cq, cb)
        with pytest.raises(queue_pg.QueueNotFound):
            call([{"queue": Q, "body": {"task": "x"}}], "nowhere", {"task": "x"})
        assert c.peek(Q, 10) == []
    assert chords(flow_db) == before


def test_chords_and_steps_need_the_rights_of_a_send(
    flow_db: str, make_role: MakeRole  # noqa: F811
) -> None:
    """A producer may start a chord only with `send` on every queue it touches (the callback's
    too); settling a step needs `receive`, and the role that settles it sends the next step."""
    with queue_pg.Client(flow_db, sweep_interval=None) as admin:
        admin.create_queue("other")
        producer = make_role("chord_producer", PRODUCER)
        admin.grant(Q, producer.name, "send")
        before = chords(flow_db)
        with producer.client() as c:
            with pytest.raises(queue_pg.AccessDenied):
                c.send_chord([{"queue": Q, "body": {"task": "flow.add"}}], "other",
                             {"task": "flow.record"})
            with pytest.raises(queue_pg.AccessDenied):
                c.send_chord([{"queue": "other", "body": {"task": "flow.add"}}], Q,
                             {"task": "flow.record"})
            assert chords(flow_db) == before
            chain(add.s(1, 2), record.s("x")).apply_async(client=c)
        assert admin.peek("other", 10) == []
        [m] = admin.receive(Q, 1, visibility_timeout=60)
        consumer = make_role("chord_consumer", CONSUMER, PRODUCER)
        admin.grant(Q, consumer.name, "receive")  # but no send on the next step's queue
        with consumer.client() as c, pytest.raises(queue_pg.AccessDenied):
            c.complete_step(Q, m.receipt or "", 3)
        with producer.client() as c, pytest.raises(queue_pg.AccessDenied):
            c.complete_step(Q, m.receipt or "", 3)
        # refused: the step is still there, leased, and nothing was sent
        assert admin.stats(Q).in_flight == 1 and admin.stats(Q).visible == 0
        admin.grant(Q, consumer.name, "send")
        with consumer.client() as c:
            assert c.complete_step(Q, m.receipt or "", 3)
        [nxt] = admin.peek(Q, 10)
        assert nxt.body == {"task": "flow.record", "args": ["x", 3], "kwargs": {}}
