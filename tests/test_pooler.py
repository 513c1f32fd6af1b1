"""The client, workers and SQS role pool behind PgBouncer: direct, session mode, transaction mode.

Each test starts a PgBouncer of its own (/usr/sbin/pgbouncer, Debian 12's 1.18, or the binary
``$QUEUE_PG_PGBOUNCER`` names, with ``max_prepared_statements = 100`` from 1.21 on; a free port, a
temporary folder, trust authentication) in front of the test server, in transaction mode with a pool of
two server sessions so clients share them, and stops it whatever happens. After each test's operations a probe opens
fresh clients on the same pool and finds no state left on any server session: no role, no
setting, no LISTEN, no advisory lock, no prepared statement (docs/operations.md, "Behind a
connection pooler").
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from queue_pg import Client
from tests.test_access import PRODUCER, MakeRole, make_role  # noqa: F401

pytestmark = pytest.mark.pooler

PGBOUNCER = Path(os.environ.get("QUEUE_PG_PGBOUNCER") or "/usr/sbin/pgbouncer")
ROOT = Path(__file__).resolve().parent.parent
GRACE = 2.0  # queue_pg._consumer_grace()
MODES = ["direct", "session", "transaction"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Pooled:
    """The test database reached through the pooler (``dsn``: with the client's
    ``queue_pg_pooler`` option; ``plain``: as libpq takes it) and directly (``direct``)."""

    mode: str
    dsn: str
    plain: str
    direct: str

    def client(self, **kwargs: Any) -> Client:
        return Client(self.dsn, sweep_interval=None, **kwargs)

    def connect(self) -> psycopg.Connection[Any]:
        """A plain connection through the pooler, preparing nothing (as the client's)."""
        return psycopg.connect(self.plain, autocommit=True, prepare_threshold=None)


def _prepared_statements_line() -> str:
    """``max_prepared_statements = 100`` for a PgBouncer that has it (1.21 and later)."""
    out = subprocess.run([str(PGBOUNCER), "--version"], capture_output=True, text=True,
                         check=True).stdout
    major, minor = (int(x) for x in out.split()[1].split(".")[:2])
    return "max_prepared_statements = 100" if (major, minor) >= (1, 21) else ""


@contextlib.contextmanager
def pgbouncer(server_dsn: str, mode: str) -> Iterator[int]:
    """A PgBouncer in ``mode`` in front of the server of ``server_dsn``; its port."""
    if not PGBOUNCER.exists():
        pytest.skip(f"no {PGBOUNCER}")
    params = conninfo.conninfo_to_dict(server_dsn)
    folder = Path(tempfile.mkdtemp(prefix="queue_pg_pgbouncer_"))
    folder.chmod(0o755)
    port = _free_port()
    (folder / "users.txt").write_text('"postgres" ""\n')
    (folder / "pgbouncer.ini").write_text(f"""
[databases]
* = host={params.get("host", "127.0.0.1")} port={params.get("port", 5432)}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = {mode}
default_pool_size = {2 if mode == "transaction" else 30}
max_client_conn = 200
query_wait_timeout = 30
ignore_startup_parameters = extra_float_digits
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
{_prepared_statements_line()}
""")
    as_user = []
    if os.geteuid() == 0:  # it refuses to run as root: as the server's system user
        as_user = ["-u", "postgres"]
        for f in (folder, *folder.iterdir()):
            shutil.chown(f, "postgres")
    out = (folder / "stdout.log").open("wb")
    proc = subprocess.Popen([str(PGBOUNCER), *as_user, str(folder / "pgbouncer.ini")],
                            stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            assert proc.poll() is None, (folder / "stdout.log").read_text()
            assert time.monotonic() < deadline, "pgbouncer did not listen"
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        out.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=MODES)
def pooled(request: pytest.FixtureRequest, clean: str) -> Iterator[Pooled]:
    mode = request.param
    if mode == "direct":
        yield Pooled(mode, clean, clean, clean)
        return
    with pgbouncer(clean, mode) as port:
        params = conninfo.conninfo_to_dict(clean)
        params.update(host="127.0.0.1", port=str(port))
        plain = conninfo.make_conninfo(**params)  # type: ignore[arg-type]
        pooled = Pooled(mode, f"{plain} queue_pg_pooler={mode}", plain, clean)
        yield pooled
        probe(pooled)


def probe(pooled: Pooled) -> None:
    """Fresh clients on the pool (more than it has server sessions, each statement its own
    transaction) find nothing any earlier client left on a server session."""
    leaks = []
    conns = [pooled.connect() for _ in range(4)]
    try:
        for _ in range(3):
            for c in conns:
                row = c.execute(
                    "SELECT current_setting('role'), current_user::text,"
                    " coalesce(current_setting('queue_pg.consumer', true), ''),"
                    " coalesce(current_setting('queue_pg.consumer_grace', true), ''),"
                    " coalesce(current_setting('queue_pg.time_offset', true), ''),"
                    " (SELECT count(*) FROM pg_listening_channels()),"
                    " (SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()"
                    "   AND locktype = 'advisory'),"
                    " (SELECT count(*) FROM pg_prepared_statements)").fetchone()
                if row != ("none", "postgres", "", "", "", 0, 0, 0):
                    leaks.append(row)
    finally:
        for c in conns:
            c.close()
    assert not leaks, leaks


def test_client_calls_from_many_threads_run_their_own_statements(pooled: Pooled) -> None:
    """8 threads, each on its queue, send, receive, delete and read stats 20 times (past
    psycopg's prepare threshold of 5): each gets its own queue's answers, no error."""
    with pooled.client(max_size=8) as client:
        queues = [f"q{chr(ord('A') + i)}" for i in range(8)]
        for q in queues:
            client.create_queue(q, visibility_timeout=30)
        errors: list[BaseException] = []

        def work(q: str) -> None:
            try:
                for i in range(20):
                    client.send(q, {"q": q, "i": i})
                    (m,) = client.receive(q, 1)
                    assert m.body == {"q": q, "i": i}, (q, m.body)
                    assert client.delete(q, m.receipt)
                    stats = client.stats(q)
                    assert stats.queue == q and stats.visible == 0, (q, stats)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(q,)) for q in queues]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        for q in queues:
            stats = client.stats(q)
            assert (stats.queue, stats.visible, stats.in_flight) == (q, 0, 0)


def test_a_transactional_enqueue_goes_with_the_callers_transaction(pooled: Pooled) -> None:
    from queue_pg.install import current_revision

    assert current_revision(pooled.dsn) is not None  # the DSN's queue_pg option is not libpq's
    with pooled.client() as client:
        client.create_queue("tx")
        with pooled.connect() as conn:
            for commit in (False, True):
                conn.execute("BEGIN")
                client.send("tx", {"commit": commit}, conn=conn)
                conn.execute("COMMIT" if commit else "ROLLBACK")
        assert [m.body for m in client.peek("tx", 10)] == [{"commit": True}]


def test_a_long_poll_wakes_on_notify_with_a_listen_dsn(
    pooled: Pooled, caplog: pytest.LogCaptureFixture
) -> None:
    """Behind a transaction pooler the long poll listens on the listen DSN (direct) and wakes
    on the send's NOTIFY, well before its once-a-second look; without one it says so and
    still finds the message by looking."""
    listen = pooled.direct if pooled.mode == "transaction" else None
    with pooled.client(listen_dsn=listen) as client, \
            Client(pooled.direct, sweep_interval=None) as sender:
        client.create_queue("lp")
        client.receive("lp", 1, wait=0.05)  # the listener's connection made
        took = []
        for i in range(3):
            got: list[float] = []

            def poll(got: list[float]) -> None:
                (m,) = client.receive("lp", 1, wait=10)
                got.append(time.monotonic())
                client.delete("lp", m.receipt)

            t = threading.Thread(target=poll, args=(got,))
            t.start()
            time.sleep(0.5 + 0.3 * i)  # the poll waits; sends land at different points
            sent = time.monotonic()
            sender.send("lp", {"i": i})
            t.join(15)
            assert got
            took.append(got[0] - sent)
        assert sorted(took)[1] < 0.5, took  # a poll looking once a second would take ~0.5 s
        if pooled.mode != "transaction":
            return
        with caplog.at_level(logging.WARNING, "queue_pg"), pooled.client() as client:
            client.create_queue("lp2")
            late = threading.Timer(0.3, lambda: sender.send("lp2", 1))
            late.start()
            (m,) = client.receive("lp2", 1, wait=10)
            late.join()
        assert m.body == 1
        assert any("without a listen DSN" in r.getMessage() for r in caplog.records)


def test_a_killed_workers_leases_end_after_the_grace(pooled: Pooled, tmp_path: Path) -> None:
    """A worker process (the pooler mode from QUEUE_PG_POOLER) is killed with SIGKILL in the
    middle of a job with a 600 s lease: its lease ends within seconds of its last beat."""
    import worker_app  # type: ignore[import-not-found]

    with psycopg.connect(pooled.direct, autocommit=True) as c:
        c.execute(worker_app.RUNS_DDL)
        c.execute("TRUNCATE worker_runs")
    with Client(pooled.direct, sweep_interval=None) as owner:
        owner.create_queue("wq", visibility_timeout=600)
        env = {**os.environ, "QUEUE_PG_DSN": pooled.plain, "QUEUE_PG_POOLER":
               "none" if pooled.mode == "direct" else pooled.mode,
               "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
        log = tmp_path / "worker.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "queue_pg.jobs.worker_cli", "worker_app", "--queue", "wq"],
                env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            worker_app.slow.send(("k", 60.0), client=owner)
            deadline = time.monotonic() + 30
            while not _started(pooled.direct):
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            with psycopg.connect(pooled.direct, autocommit=True) as c:
                session = c.execute("SELECT session FROM queue_pg.consumers").fetchone()
            assert session == ((pooled.mode != "transaction"),), log.read_text()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
            killed = time.monotonic()
            while True:  # the test's own reaps, as the other workers' would be
                owner.reap_consumers()
                if owner.stats("wq").visible == 1:
                    break
                assert time.monotonic() - killed < 4 * GRACE + 10, log.read_text()
                time.sleep(0.2)
            took = time.monotonic() - killed
            assert took < 4 * GRACE + 10  # not the 600 s lease
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert "crash detection is OFF" not in log.read_text()


def _started(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT 1 FROM worker_runs WHERE event = 'start'").fetchone() is not None


def test_periodic_schedules_are_kept_and_fired(pooled: Pooled) -> None:
    with pooled.client() as client:
        client.create_queue("per")
        info = client.set_schedule("tick", "per", "* * * * *", {"t": 1})
        assert info is not None
        for _ in range(8):  # past the prepare threshold
            assert [s.schedule for s in client.schedules("per")] == ["tick"]
            client.fire_schedules(["per"])
        assert client.drop_schedule("tick", "per")


def test_the_sqs_role_pool_leaves_no_role_behind(pooled: Pooled, make_role: MakeRole) -> None:  # noqa: F811
    """The SQS endpoint's pool lends connections as a request's role (SET LOCAL ROLE): through
    any pooler each statement runs as that role, and nothing stays for the next client."""
    import asyncio

    from queue_pg.sqs.app import REQUEST_KEY, RolePool
    from tests.test_sqs import loan_key

    role = make_role("sqsrole", PRODUCER)
    key = loan_key(pooled.direct, role.name)

    async def run() -> None:
        pool = RolePool(pooled.plain, max_size=4, prepare=pooled.mode != "transaction")
        await pool.open()
        try:
            async def as_role() -> list[str]:
                REQUEST_KEY.set(key)
                seen = []
                for _ in range(6):
                    async with pool.connection() as conn:
                        for _ in range(3):
                            row = await (await conn.execute("SELECT current_user::text")).fetchone()
                            assert row is not None
                            seen.append(str(row[0]))
                            await conn.commit()
                return seen

            results = await asyncio.gather(*(asyncio.create_task(as_role()) for _ in range(4)))
            assert {u for r in results for u in r} == {role.name}
        finally:
            await pool.close()

    asyncio.run(run())
