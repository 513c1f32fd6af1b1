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
from tests.test_access import CONSUMER, MakeRole, Role, as_user, make_role  # noqa: F401

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
    """A member of queue_pg_consumer with a grant on one queue: its reaps look only at its own
    consumers and those of its queue, so they end no lease of another queue's consumer, live or
    lost (the owner's reap does); adopting a lost consumer of another role gives it an id of its
    own (the lost one's leases still end)."""
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
        assert h.execute("SELECT queue_pg.reap_consumers()").fetchone() == (0,)
        assert owner.execute("SELECT count(*) FROM queue_pg.consumers WHERE lost_at IS NOT NULL"
                             ).fetchone() == (0,)  # not its business
        assert client.reap_consumers() == 0  # the owner's marks it
        mine = h.execute("SELECT queue_pg.register_consumer(NULL, %s)", (lost_id,)).fetchone()
        assert mine is not None and mine[0] not in (None, lost_id, live_id)
        time.sleep(GRACE + 0.2)
        # a session cannot shorten the grace below a second
        h.execute("SET queue_pg.consumer_grace = '0'")
        assert h.execute("SELECT queue_pg.reap_consumers()").fetchone() == (0,)
        assert client.stats("theirs").in_flight == 2
    assert client.reap_consumers() == 1
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
        # a session whose let-go lock another took gets no id (not one whose lock it lacks)
        reg.execute("SELECT pg_advisory_unlock(%s, %s)", (SPACE, me))
        squatter.execute("SELECT pg_advisory_lock(%s, %s)", (SPACE, me))
        assert client.register_consumer(reg) is None
        squatter.execute("SELECT pg_advisory_unlock(%s, %s)", (SPACE, me))
        assert client.register_consumer(reg) == me
    # no row more: this session's, the lost one's, the squatter's own
    assert owner.execute("SELECT count(*) FROM queue_pg.consumers").fetchone() == (3,)
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


def test_rows_held_by_another_transaction_and_squatted_locks_hide_no_lost_consumer(
    client: Client, owner: psycopg.Connection[Any], clean: str, make_role: MakeRole  # noqa: F811
) -> None:
    """A limited role registers 40 sessions that end, then keeps their rows locked in an open
    transaction (a first receive naming each updates its row), and holds the advisory lock of a
    lost consumer of another role: a reap still finds the victim's session gone and ends its
    lease after the grace, as it would with nothing held (the held rows cost it no place in its
    batch of 32, the squatted lock no say over a session the server knows is gone)."""
    client.create_queue("mine", visibility_timeout=600)
    client.create_queue("theirs", visibility_timeout=600)
    hostile = make_role("hostile", CONSUMER)
    client.grant("mine", hostile.name, "receive")
    ids = []
    for _ in range(40):
        with hostile.connect() as h:
            [(cid,)] = h.execute("SELECT queue_pg.register_consumer()").fetchall()
            ids.append(cid)
    victim_reg = session(clean)
    victim = client.register_consumer(victim_reg)
    assert victim > max(ids)  # ordered after every held row
    client.send("theirs", "v")
    (m,) = client.receive("theirs", 1, consumer=victim)
    with hostile.connect() as holder, hostile.connect() as squatter:
        holder.execute("BEGIN")
        for cid in ids:
            holder.execute("SELECT * FROM queue_pg.receive('mine', 1, 600, consumer => %s)", (cid,))
        end(victim_reg, owner)
        squatter.execute("SELECT pg_advisory_lock(%s, %s)", (SPACE, victim))
        assert sum(reap_until(client, GRACE + 1.0)) == 1
        (back,) = client.receive("theirs", 1)
        assert back.id == m.id and back.receive_count == 2
        assert owner.execute("SELECT count(*) FROM queue_pg.consumers WHERE id = %s",
                             (victim,)).fetchone() == (0,)
        holder.execute("ROLLBACK")
    # the rows let go, the 40 are reaped like any lost consumer
    reap_until(client, GRACE + 1.0)
    assert owner.execute("SELECT count(*) FROM queue_pg.consumers").fetchone() == (0,)


def test_a_reap_reads_the_sessions_afresh_even_inside_an_old_transaction(
    client: Client, owner: psycopg.Connection[Any], clean: str, make_role: MakeRole  # noqa: F811
) -> None:
    """A transaction keeps its first read of pg_stat_activity: a limited role that read it, then
    reaped in the same transaction after a consumer of its queue registered, would have found
    that live consumer gone and ended its lease. Each reap reads the sessions afresh."""
    client.create_queue("mine", visibility_timeout=600)
    client.send("mine", "v")
    hostile = make_role("hostile", CONSUMER)
    client.grant("mine", hostile.name, "receive")
    with hostile.connect() as h:
        h.execute("BEGIN")
        h.execute("SELECT count(*) FROM pg_stat_activity")
        victim_reg = session(clean)
        victim = client.register_consumer(victim_reg)
        client.receive("mine", 1, consumer=victim)
        assert h.execute("SELECT queue_pg.reap_consumers()").fetchone() == (0,)
        h.execute("SELECT pg_sleep(%s)", (GRACE + 0.3,))
        assert h.execute("SELECT queue_pg.reap_consumers()").fetchone() == (0,)
        h.execute("COMMIT")
    assert owner.execute("SELECT lost_at FROM queue_pg.consumers WHERE id = %s",
                         (victim,)).fetchone() == (None,)
    assert client.stats("mine").in_flight == 1
    assert client.receive("mine", 1, consumer=victim) == []  # still registered
    victim_reg.close()


def test_an_adoption_waits_for_no_reap_kept_open(
    client: Client, owner: psycopg.Connection[Any], clean: str, make_role: MakeRole  # noqa: F811
) -> None:
    """A limited role whose reap (in a transaction it keeps open) holds the row of a lost
    consumer of its queue: that consumer's worker, back within the grace, does not hang on its
    adoption; it gets an id of its own at once."""
    client.create_queue("mine", visibility_timeout=600)
    hostile = make_role("hostile", CONSUMER)
    client.grant("mine", hostile.name, "receive")
    reg = session(clean)
    me = client.register_consumer(reg)
    client.receive("mine", 1, consumer=me)  # in the hostile's scope: a consumer of its queue
    end(reg, owner)
    with hostile.connect() as h, session(clean) as back:
        h.execute("BEGIN")
        h.execute("SELECT queue_pg.reap_consumers()")  # marks it, and holds the row
        back.execute("SET lock_timeout = '2s'")
        again = client.register_consumer(back, adopt=me)
        assert again not in (None, me)
        h.execute("ROLLBACK")


def test_a_limited_reap_takes_only_consumers_all_of_whose_queues_it_may_receive_from(
    client: Client, owner: psycopg.Connection[Any], clean: str, make_role: MakeRole  # noqa: F811
) -> None:
    """Role a may receive from q1; role b from q1 and q2. A lost consumer of b that received from
    both is not a's to reap (a reap ends its leases on every queue it used, and one kept open
    would hold them); one that never received is. The owner's sweep reaps what no limited role
    does."""
    client.create_queue("q1", visibility_timeout=600)
    client.create_queue("q2", visibility_timeout=600)
    a = make_role("a", CONSUMER)
    b = make_role("b", CONSUMER)
    client.grant("q1", a.name, "receive")
    for q in ("q1", "q2"):
        client.grant(q, b.name, "receive")
    client.send("q2", "job")
    both = b.connect()
    [(both_id,)] = both.execute("SELECT queue_pg.register_consumer()").fetchall()
    both.execute("SELECT * FROM queue_pg.receive('q1', 1, 600, consumer => %s)", (both_id,))
    assert both.execute("SELECT count(*) FROM queue_pg.receive('q2', 1, 600, consumer => %s)",
                        (both_id,)).fetchone() == (1,)
    idle = b.connect()
    [(idle_id,)] = idle.execute("SELECT queue_pg.register_consumer()").fetchall()
    assert idle_id is not None
    end(both, owner)
    end(idle, owner)
    with a.connect() as h:
        for _ in range(2):
            assert h.execute("SELECT queue_pg.reap_consumers()").fetchone() == (0,)
            time.sleep(GRACE + 0.2)
        left = owner.execute("SELECT id, lost_at IS NULL FROM queue_pg.consumers ORDER BY id"
                             ).fetchall()
        assert left == [(both_id, True)]  # the idle one reaped, the other untouched
    assert client.stats("q2").in_flight == 1
    with psycopg.connect(clean, autocommit=True) as o:
        o.execute("SELECT queue_pg.sweep()")  # marks
        time.sleep(GRACE + 0.2)
        o.execute("SELECT queue_pg.sweep()")  # ends
    assert client.stats("q2").visible == 1
    assert owner.execute("SELECT count(*) FROM queue_pg.consumers").fetchone() == (0,)


def test_a_live_consumer_is_known_by_its_backend_whatever_the_clock_did(
    client: Client, owner: psycopg.Connection[Any], clean: str
) -> None:
    """A session is its backend's pid and start time, not "started before it registered": a
    registration stamped before its backend's start (the clock stepped back in between) is still
    that live session's, for its reaps and its own registration."""
    client.create_queue("q", visibility_timeout=600)
    client.send("q", "x")
    reg = session(clean)
    me = client.register_consumer(reg)
    client.receive("q", 1, consumer=me)
    owner.execute("UPDATE queue_pg.consumers SET registered_at = registered_at - interval '1 hour'"
                  " WHERE id = %s", (me,))
    assert sum(reap_until(client, GRACE + 0.6)) == 0
    assert owner.execute("SELECT lost_at FROM queue_pg.consumers WHERE id = %s",
                         (me,)).fetchone() == (None,)
    assert client.register_consumer(reg) == me
    assert client.stats("q").in_flight == 1
    reg.close()


def test_a_role_that_leaves_many_lost_consumers_delays_no_other_roles(
    client: Client, owner: psycopg.Connection[Any], clean: str, make_role: MakeRole  # noqa: F811
) -> None:
    """A reap handles 32 lost consumers, each role's first before any role's second: 100 a
    limited role left behind (sessions opened, registered and closed) do not keep the first reap
    from finding another role's consumer that died after them."""
    hostile = make_role("hostile", CONSUMER)
    for _ in range(100):
        with hostile.connect() as h:
            h.execute("SELECT queue_pg.register_consumer()")
    victim_reg = session(clean)
    victim = client.register_consumer(victim_reg)
    end(victim_reg, owner)
    client.reap_consumers()
    lost = owner.execute("SELECT lost_at IS NOT NULL FROM queue_pg.consumers WHERE id = %s",
                         (victim,)).fetchone()
    assert lost == (True,)
    assert owner.execute("SELECT count(*) FROM queue_pg.consumers WHERE lost_at IS NOT NULL"
                         ).fetchone() == (32,)


def test_an_owner_that_cannot_read_other_sessions_start_asks_their_lock(
    make_role: MakeRole, scratch: str  # noqa: F811
) -> None:
    """Installed by a role that may not read other roles' backend_start: the reap cannot tell a
    consumer's session from a later one with its pid, and tries its lock. A live consumer of
    another role keeps its lease; once its backend is gone its lease ends after the grace."""
    from psycopg import sql as psql

    from queue_pg.install import migrate

    own = make_role("owner")
    dbname = str(psycopg.conninfo.conninfo_to_dict(scratch)["dbname"])
    with psycopg.connect(scratch, autocommit=True) as su:
        su.execute(psql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            psql.Identifier(dbname), psql.Identifier(own.name)))
        own_dsn = as_user(scratch, own.name)
        migrate(own_dsn)
        name = make_role("worker", CONSUMER).name
        worker = Role(name, as_user(scratch, name))
        with Client(own_dsn, sweep_interval=None) as c:
            c.create_queue("jobs", visibility_timeout=600)
            c.send("jobs", "x")
            c.grant("jobs", name, "receive")
            reg = worker.connect()
            [(me,)] = reg.execute("SELECT queue_pg.register_consumer()").fetchall()
            reg.execute("SELECT * FROM queue_pg.receive('jobs', 1, 600, consumer => %s)", (me,))
            with psycopg.connect(own_dsn, autocommit=True) as o:
                seen = o.execute("SELECT backend_start FROM pg_stat_activity WHERE pid = %s",
                                 (reg.info.backend_pid,)).fetchone()
            assert seen == (None,)  # the owner cannot read it
            assert sum(reap_until(c, GRACE + 0.6)) == 0
            # its own session neither registers twice nor reaps itself
            assert reg.execute("SELECT queue_pg.register_consumer()").fetchone() == (me,)
            for _ in range(3):
                assert reg.execute("SELECT queue_pg.reap_consumers()").fetchone() == (0,)
                time.sleep(GRACE / 2)
            # a reap held open locks no live consumer's row: its first receive on a queue
            # (which writes that row) goes through
            c.create_queue("more")
            c.grant("more", name, "receive")
            with worker.connect() as other:
                other.execute("BEGIN")
                other.execute("SELECT queue_pg.reap_consumers()")
                reg.execute("SET lock_timeout = '2s'")
                reg.execute("SELECT * FROM queue_pg.receive('more', 1, 600, consumer => %s)", (me,))
                other.execute("ROLLBACK")
            assert c.stats("jobs").in_flight == 1
            assert su.execute("SELECT count(*), bool_and(lost_at IS NULL) FROM queue_pg.consumers"
                              ).fetchone() == (1, True)
            end(reg, su)
            assert sum(reap_until(c, GRACE + 1.0)) == 1
            assert c.stats("jobs").visible == 1
