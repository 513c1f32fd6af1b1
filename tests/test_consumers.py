"""Consumers that can be seen to die: a registered session's leases end soon after it does.

Real sessions throughout: a consumer's connection is closed or its backend terminated, and the
reaps run on other connections; the grace period is the server's (2 s by default).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from queue_pg import Client, ConsumerNotFound, InvalidParameter
from tests.test_access import CONSUMER, MakeRole, make_role  # noqa: F401

GRACE = 2.0  # queue_pg._consumer_grace() by default


@pytest.fixture
def owner(clean: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(clean, autocommit=True) as c:
        yield c


def session(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


def end(conn: psycopg.Connection[Any], owner: psycopg.Connection[Any]) -> None:
    """End a consumer's session the way a crash does (its backend goes away), and wait until
    the server has let go of its locks."""
    pid = conn.info.backend_pid
    owner.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 10
    while owner.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    conn.close()


def reap_until(client: Client, seconds: float) -> list[int]:
    """Reap every 0.2 s for ``seconds``; what each reap ended."""
    return [n for _, n in reaps(client, seconds)]


def reaps(client: Client, seconds: float) -> list[tuple[float, int]]:
    """Reap every 0.2 s for ``seconds``: (seconds since the start when it returned, leases it
    ended) of each reap."""
    out = []
    start = time.monotonic()
    while time.monotonic() < start + seconds:
        ended = client.reap_consumers()
        out.append((time.monotonic() - start, ended))
        time.sleep(0.2)
    return out


def test_a_lost_consumers_leases_end_after_the_grace_and_no_sooner(
    client: Client, owner: psycopg.Connection[Any], clean: str
) -> None:
    client.create_queue("q", visibility_timeout=600)
    client.send_batch("q", ["a", "b", "c", "d"])
    reg = session(clean)
    me = client.register_consumer(reg, name="w1")
    assert me is not None
    mine = client.receive("q", 2, consumer=me)
    anonymous = client.receive("q", 1)  # names no consumer: lapses as before
    assert len(mine) == 2 and len(anonymous) == 1
    assert client.reap_consumers() == 0  # alive: nothing to do
    end(reg, owner)
    done = reaps(client, GRACE + 1.0)
    assert sum(n for _, n in done) == 2
    # the first reap that found it gone only marked it; the leases ended GRACE later
    assert next(at for at, n in done if n) >= GRACE - 0.05, done
    stats = client.stats("q")
    assert (stats.visible, stats.in_flight) == (3, 1)
    again = client.receive("q", 3)
    assert sorted(m.id for m in again if m.receive_count == 2) == sorted(m.id for m in mine)
    # the consumer is forgotten: naming it again is refused and changes nothing
    with pytest.raises(ConsumerNotFound, match=f"consumer = {me} is not registered"):
        client.receive("q", 1, consumer=me)
    assert owner.execute("SELECT count(*) FROM queue_pg.consumers").fetchone() == (0,)


def test_a_live_consumer_keeps_long_leases_and_a_retry_keeps_its_backoff(
    client: Client, owner: psycopg.Connection[Any], clean: str
) -> None:
    client.create_queue("q", visibility_timeout=600)
    client.send_batch("q", ["slow", "retry"])
    with session(clean) as reg:
        me = client.register_consumer(reg)
        slow, retry = client.receive("q", 2, consumer=me)
        client.change_visibility("q", retry.receipt, 300, release=True)  # a retry's backoff
        assert sum(reap_until(client, GRACE + 0.6)) == 0
        assert client.stats("q").in_flight == 2
        end(reg, owner)
    assert sum(reap_until(client, GRACE + 1.0)) == 1  # the lease, not the backoff
    (back,) = client.receive("q", 2)
    assert back.id == slow.id


def test_a_session_is_one_consumer_and_adopts_its_id_back_within_the_grace(
    client: Client, owner: psycopg.Connection[Any], clean: str
) -> None:
    client.create_queue("q", visibility_timeout=600)
    client.send("q", "x")
    reg = session(clean)
    me = client.register_consumer(reg)
    assert client.register_consumer(reg, name="again") == me  # no second lock
    held = owner.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
        (reg.info.backend_pid,)).fetchone()
    assert held == (1,)
    (m,) = client.receive("q", 1, consumer=me)
    end(reg, owner)
    assert client.reap_consumers() == 0  # marks it lost
    with session(clean) as back:
        assert client.register_consumer(back, adopt=me) == me
        assert sum(reap_until(client, GRACE + 0.6)) == 0
        assert client.stats("q").in_flight == 1
        client.delete("q", m.receipt)  # the receipt still holds


def test_bad_input_is_refused_and_changes_nothing(
    client: Client, owner: psycopg.Connection[Any], clean: str
) -> None:
    client.create_queue("q")
    client.send("q", "x")
    with pytest.raises(ConsumerNotFound):
        client.receive("q", 1, consumer=12345)
    with pytest.raises(InvalidParameter, match="name is 201 characters long"), session(clean) as reg:
        client.register_consumer(reg, name="n" * 201)
    assert client.stats("q").visible == 1
    assert owner.execute("SELECT count(*) FROM queue_pg.consumers").fetchone() == (0,)


def test_a_limited_role_reaps_only_the_dead_and_cannot_adopt_another_roles_consumer(
    client: Client, owner: psycopg.Connection[Any], clean: str, make_role: MakeRole  # noqa: F811
) -> None:
    """A member of queue_pg_consumer with a grant on one queue: its reaps end no lease of a
    live consumer of another queue, and adopting a lost consumer of another role gives it an id
    of its own (the lost one's leases still end)."""
    client.create_queue("mine", visibility_timeout=600)
    client.create_queue("theirs", visibility_timeout=600)
    hostile = make_role("hostile", CONSUMER)
    client.grant("mine", hostile.name, "receive")
    client.send("theirs", "t1")
    client.send("theirs", "t2")
    live = session(clean)
    lost = session(clean)
    live_id = client.register_consumer(live)
    lost_id = client.register_consumer(lost)
    client.receive("theirs", 1, consumer=live_id)
    client.receive("theirs", 1, consumer=lost_id)
    end(lost, owner)
    with hostile.connect() as h:
        assert h.execute("SELECT queue_pg.reap_consumers()").fetchone() == (0,)  # marks
        mine = h.execute("SELECT queue_pg.register_consumer(NULL, %s)", (lost_id,)).fetchone()
        assert mine is not None and mine[0] not in (None, lost_id, live_id)
        time.sleep(GRACE + 0.2)
        # a session cannot shorten the grace below a second
        h.execute("SET queue_pg.consumer_grace = '0'")
        assert h.execute("SELECT queue_pg.reap_consumers()").fetchone() == (1,)
    assert client.stats("theirs").in_flight == 1  # the live one's lease stands
    live.close()


def test_dedicated_connections_of_a_borrowed_pool_and_an_engine(clean: str) -> None:
    """A worker's registration connection comes from the client's source but never from (or
    back to) its pool: the lock must end with the session, not live on in a pool."""
    from psycopg_pool import ConnectionPool

    from queue_pg.install import make_engine

    with ConnectionPool(clean, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool, \
            Client(pool, sweep_interval=None) as c, c._dedicated() as conn:
        with pool.connection() as pooled:  # the pool's one connection is still free
            assert pooled.info.backend_pid != conn.info.backend_pid
        assert c.register_consumer(conn) is not None
    engine = make_engine(clean)
    try:
        with Client(engine, sweep_interval=None) as c, c._dedicated() as conn:
            pid = conn.info.backend_pid
            assert conn.autocommit and c.register_consumer(conn) is not None
        with psycopg.connect(clean, autocommit=True) as o:
            deadline = time.monotonic() + 5
            while o.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                assert time.monotonic() < deadline, "the engine's detached connection lives on"
                time.sleep(0.02)
    finally:
        engine.dispose()


def test_a_consumer_records_each_queue_it_received_from_once(
    client: Client, owner: psycopg.Connection[Any], clean: str
) -> None:
    """A reap looks for a lost consumer's leases on the queues it received from only, so those
    are recorded: each once, at its first receive there (an empty one too)."""
    for q in ("a", "b", "c"):
        client.create_queue(q, visibility_timeout=600)
    client.send("b", "x")
    with session(clean) as reg:
        me = client.register_consumer(reg)
        for q in ("a", "b", "a", "b", "a"):
            client.receive(q, 1, consumer=me)
        ids = owner.execute("SELECT queue_ids FROM queue_pg.consumers WHERE id = %s", (me,)).fetchone()
        names = owner.execute(
            "SELECT array_agg(name ORDER BY array_position(%s::int[], id)) FROM queue_pg.queues"
            " WHERE id = ANY (%s)", (ids[0] if ids else None, ids[0] if ids else None)).fetchone()
        assert names == (["a", "b"],)


SPACE = 1903587664  # queue_pg._consumer_space()


def test_a_session_that_lets_its_lock_go_registers_as_itself_and_never_as_a_lost_consumer(
    client: Client, owner: psycopg.Connection[Any], clean: str
) -> None:
    """The session's own registration is found by its backend, not by the locks it holds: one
    that unlocks its id and registers again gets its id (and lock) back, not a row more; one
    that took a lost consumer's lock gets an id of its own."""
    reg = session(clean)
    me = client.register_consumer(reg)
    for _ in range(3):
        reg.execute("SELECT pg_advisory_unlock(%s, %s)", (SPACE, me))
        assert client.register_consumer(reg) == me
    assert owner.execute("SELECT count(*) FROM queue_pg.consumers").fetchone() == (1,)
    held = owner.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s AND granted",
        (reg.info.backend_pid,)).fetchone()
    assert held == (1,)
    lost = session(clean)
    lost_id = client.register_consumer(lost)
    end(lost, owner)
    with session(clean) as squatter:
        squatter.execute("SELECT pg_advisory_lock(%s, %s)", (SPACE, lost_id))
        own = client.register_consumer(squatter)
        assert own not in (None, lost_id, me)
    reg.close()


def test_another_roles_consumer_cannot_be_named_and_a_held_consumer_row_stops_no_reap(
    client: Client, owner: psycopg.Connection[Any], clean: str, make_role: MakeRole  # noqa: F811
) -> None:
    """A receive naming another role's consumer is refused like an unknown one (it would update
    that consumer's row, and an open transaction would hold it against the consumer's own
    receives). A session that keeps its own consumer row locked stops no reap."""
    client.create_queue("mine", visibility_timeout=600)
    client.send_batch("mine", ["a", "b"])
    hostile = make_role("hostile", CONSUMER)
    client.grant("mine", hostile.name, "receive")
    victim_reg = session(clean)
    victim = client.register_consumer(victim_reg)
    with hostile.connect() as h:
        with pytest.raises(psycopg.Error) as err:
            h.execute("SELECT * FROM queue_pg.receive('mine', 1, 600, consumer => %s)", (victim,))
        assert err.value.sqlstate == "QP050"
        assert f"not registered by role '{hostile.name}'" in str(err.value)
        assert client.stats("mine").visible == 2
        [(mine,)] = h.execute("SELECT queue_pg.register_consumer()").fetchall()
        h.execute("SELECT pg_advisory_unlock(%s, %s)", (SPACE, mine))
        h.execute("BEGIN")
        h.execute("SELECT * FROM queue_pg.receive('mine', 1, 600, consumer => %s)", (mine,))
        owner.execute("SET lock_timeout = '2s'")
        try:
            assert owner.execute("SELECT queue_pg.reap_consumers()").fetchone() == (0,)
        finally:
            owner.execute("RESET lock_timeout")
        h.execute("ROLLBACK")
    assert client.receive("mine", 1, consumer=victim)  # the victim's receives go on
    victim_reg.close()
