"""The postmaster of a relaxed queue's server is killed (SIGKILL) while consumers receive.

The server is this test's own embedded one (never the shared server). A relaxed queue's
receives commit without waiting for the WAL flush, so the crash may undo leases. Afterwards:

- no message is lost: every message sent is still there but those whose delete was
  acknowledged before the crash;
- every receipt handed out before the crash is refused (StaleReceipt), whether its lease
  survived the crash or not.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import psycopg
import pytest

from queue_pg import Client
from queue_pg.embedded import EmbeddedServer
from queue_pg.install import migrate

pytestmark = pytest.mark.faults

N = 3000


def consume(dsn: str, receipts: list[str], deleted: set[int], stop: threading.Event) -> None:
    """Receive 10 at a time; delete every other batch (a durable commit of its own)."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            turn = 0
            while not stop.is_set():
                rows = conn.execute("SELECT id, receipt FROM queue_pg.receive('rq', 10)").fetchall()
                receipts.extend(r[1] for r in rows)
                turn += 1
                if rows and turn % 2:
                    conn.execute("SELECT count(*) FROM queue_pg.delete_batch('rq', %s)",
                                 ([r[1] for r in rows],))
                    deleted.update(r[0] for r in rows)  # acknowledged: the commit returned
    except psycopg.Error:
        pass  # the server went away


def kill_postmaster(server: EmbeddedServer) -> None:
    """SIGKILL to the postmaster; then wait for its backends, which exit on their own once it
    is gone (until then its shared memory is in use), and take away its postmaster.pid and socket lock: a
    killed postmaster nobody reaps stays a zombie that looks alive to a pid check."""
    pid = server.pid
    assert pid is not None
    children = psutil.Process(pid).children(recursive=True)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    for p in children:
        while time.monotonic() < deadline:
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.1)
    (server.data_dir / "postmaster.pid").unlink()
    for lock in server.data_dir.glob(".s.PGSQL.*"):  # its socket and socket lock file, same reason
        lock.unlink()


def test_sigkill_loses_no_message_and_refuses_every_earlier_receipt(own_server: EmbeddedServer) -> None:
    dsn = own_server.dsn
    migrate(dsn)
    with Client(dsn, sweep_interval=None) as c:
        c.create_queue("rq", lease_durability="relaxed", visibility_timeout=600)
        sent = {i for start in range(0, N, 1000) for i in c.send_batch("rq", list(range(start, start + 1000)))}
    receipts: list[str] = []
    deleted: set[int] = set()
    stop = threading.Event()
    threads = [threading.Thread(target=consume, args=(dsn, receipts, deleted, stop)) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.5)  # consumers at work
        kill_postmaster(own_server)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert receipts and len(deleted) < N
    own_server.start()

    with psycopg.connect(own_server.dsn, autocommit=True) as conn:
        left = {r[0] for r in conn.execute(
            "SELECT m.id FROM queue_pg.messages m JOIN queue_pg.queues q ON q.id = m.queue_id"
            " WHERE q.name = 'rq'")}
        assert sent - deleted <= left, "a message was lost"
        # the receipts of messages still there: every one refused as stale
        ids = {int(r.split(".")[1]): r for r in receipts}
        pending = [r for i, r in ids.items() if i in left]
        assert pending
        errors = set()
        for start in range(0, len(pending), 1000):
            errors |= {(d, e) for d, e in conn.execute(
                "SELECT deleted, error FROM queue_pg.delete_batch('rq', %s)", (pending[start:start + 1000],))}
        assert errors == {(False, "StaleReceipt")}
        # and the messages come back to a receive once their leases end (none lost for good)
        conn.execute("SET queue_pg.time_offset = '601 seconds'")
        got = conn.execute("SELECT count(*) FROM queue_pg.receive('rq', 1000)").fetchone()
        assert got is not None and got[0] == min(1000, len(left))
