"""What a member of the group roles with a grant on one FIFO queue can do to others: FIFO and
fair queues add no entry point, but send takes a group, and a group is a row lock and a row."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from queue_pg import AccessDenied, Client, InvalidParameter
from queue_pg.errors import translate
from tests.test_access import CONSUMER, PRODUCER, MakeRole, make_role  # noqa: F401

MINE, THEIRS = "fmine", "ftheirs"


@pytest.fixture
def roles(clean: str, make_role: MakeRole) -> Any:  # noqa: F811
    with Client(clean, sweep_interval=None) as admin:
        admin.create_queue(MINE, fifo=True)
        admin.create_queue(THEIRS, fifo=True)
        producer = make_role("producer", PRODUCER)
        consumer = make_role("consumer", CONSUMER)
        admin.grant(MINE, producer.name, "send")
        admin.grant(MINE, consumer.name, "receive")
        yield admin, producer, consumer


def run(role: Any, query: str, *params: object) -> list[Any]:
    with role.connect() as c, translate():
        cur = c.execute(query, params or None)
        return cur.fetchall() if cur.description else []


def test_a_producer_reaches_no_other_queues_groups(roles: Any) -> None:
    admin, producer, _ = roles
    admin.send_batch(THEIRS, ["t1", "t2"], group="g")
    with pytest.raises(AccessDenied):
        run(producer, """SELECT queue_pg.send('ftheirs', '1', "group" => 'g')""")
    run(producer, """SELECT queue_pg.send('fmine', '"m1"', "group" => 'g')""")
    run(producer, """SELECT queue_pg.send_batch('fmine', array['"m2"', '"m3"']::jsonb[],
                                                "group" => array['g', 'g'])""")
    # same group name, other queue: each queue's group in its own order
    assert [m.body for m in admin.receive(THEIRS, 10)] == ["t1", "t2"]
    assert [m.body for m in admin.receive(MINE, 10)] == ["m1", "m2", "m3"]


@pytest.mark.parametrize("query", [
    "SELECT * FROM queue_pg.fifo_groups",
    "SELECT * FROM queue_pg.fifo_groups FOR UPDATE",
    "DELETE FROM queue_pg.fifo_groups",
    "SELECT queue_pg._fifo_advance(1, 'g', 1)",
    "SELECT queue_pg._fifo_enter(1, array[1]::bigint[])",
    "SELECT * FROM queue_pg.alter_queue('fmine', fair => true)",
    "SELECT * FROM queue_pg.alter_queue('ftheirs', fair => true)",
    "SELECT * FROM queue_pg.create_queue('new', fifo => true)",
])
def test_group_state_and_settings_are_closed(roles: Any, query: str) -> None:
    _, producer, consumer = roles
    for role in (producer, consumer):
        with pytest.raises(AccessDenied):
            run(role, query)


def test_group_names_are_bounded(roles: Any) -> None:
    _, producer, _ = roles
    with pytest.raises(InvalidParameter, match="allowed 1 to 128 characters"):
        run(producer, """SELECT queue_pg.send('fmine', '1', "group" => repeat('x', 129))""")


def test_an_open_send_holds_back_its_own_group_only(roles: Any) -> None:
    """A producer's transaction that sent into group a holds a's row; the consumer still takes
    and deletes other groups' heads, and the other queue is untouched."""
    admin, producer, consumer = roles
    admin.send(MINE, "b1", group="b")
    admin.send(THEIRS, "t1", group="a")
    with producer.connect() as p:
        p.autocommit = False
        p.execute("""SELECT queue_pg.send('fmine', '"a1"', "group" => 'a')""")
        with consumer.connect(options="-c lock_timeout=2s") as c:
            [row] = c.execute("SELECT receipt, body FROM queue_pg.receive('fmine', 10)").fetchall()
            assert row[1] == "b1"
            assert c.execute("SELECT queue_pg.delete_message('fmine', %s)", [row[0]]).fetchone() \
                == (True,)
        [t] = admin.receive(THEIRS, 10)
        assert admin.delete(THEIRS, t.receipt)
        p.rollback()
    assert admin.receive(MINE, 10) == []


def test_a_stale_receipt_does_not_move_a_group_on(roles: Any) -> None:
    admin, _, consumer = roles
    admin.send_batch(MINE, ["a1", "a2"], group="a")
    with consumer.connect() as c:
        [(old,)] = c.execute("SELECT receipt FROM queue_pg.receive('fmine', 1, 0)").fetchall()
        [(new,)] = c.execute("SELECT receipt FROM queue_pg.receive('fmine', 1, 30)").fetchall()
        with pytest.raises(psycopg.Error):
            c.execute("SELECT queue_pg.delete_message('fmine', %s)", [old])
        assert admin.receive(MINE, 10) == []  # a1 is still out; a2 still waits
        assert c.execute("SELECT queue_pg.delete_message('fmine', %s)", [new]).fetchone() \
            == (True,)
    assert [m.body for m in admin.receive(MINE, 10)] == ["a2"]
