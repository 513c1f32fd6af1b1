"""How both workers settle finished jobs in batches (queue_pg.jobs.acks), against a real server and
real processes: a lapsed lease is still reported for its own job, the flush deletes the tail,
a crash between finish and delete runs the job again, and worker processes racing on one queue
delete each message exactly once (counted from the history)."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_worker import ROOT, App, Q, app, wait_until  # noqa: F401  (app: the fixture)

import queue_pg
from queue_pg.jobs import worker_loop
from queue_pg.jobs.aio_worker import AsyncWorker
from queue_pg.jobs.worker import Worker
from queue_pg.jobs.worker_loop import WorkerStats

KINDS = ["threads", "asyncio"]


@contextmanager
def running(kind: str, dsn: str, queue: str, handler: Callable[[Any], None],
            **options: Any) -> Iterator[WorkerStats]:
    """A Worker (threads) or an AsyncWorker (asyncio, the handler in a thread) running
    ``handler`` on ``queue`` until the block ends; yields its counters."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    if kind == "threads":
        client = queue_pg.Client(dsn, sweep_interval=None)
        worker = Worker(client, queue, handler, **options)
        thread = threading.Thread(target=worker.run, kwargs={"signals": ()}, daemon=True)
        thread.start()
        try:
            yield worker.stats
        finally:
            worker.stop()
            thread.join(30)
            client.close()
        assert not thread.is_alive()
        return

    async def main() -> None:
        async with queue_pg.AsyncClient(dsn, sweep_interval=None) as client:
            async def h(job: Any) -> None:
                await asyncio.to_thread(handler, job)

            w = AsyncWorker(client, queue, h, **options)
            box["worker"], box["loop"] = w, asyncio.get_running_loop()
            ready.set()
            await w.run(signals=())

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield box["worker"].stats
    finally:
        box["loop"].call_soon_threadsafe(box["worker"].stop)
        thread.join(30)
    assert not thread.is_alive()


def outcomes(dsn: str) -> dict[int, list[str]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute("SELECT message_id, outcome FROM queue_pg.message_history").fetchall()
    out: dict[int, list[str]] = collections.defaultdict(list)
    for mid, outcome in rows:
        out[mid].append(outcome)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_a_lapsed_lease_is_reported_for_its_own_job_and_the_others_are_deleted(
    kind: str, client: queue_pg.Client, clean: str, caplog: pytest.LogCaptureFixture
) -> None:
    client.create_queue("st", visibility_timeout=0.5)
    ids = [client.send("st", {"n": i}) for i in range(3)]
    taken: list[Any] = []

    def handler(job: Any) -> None:
        if job.id == ids[0]:  # no heartbeat in time: the lease lapses, another consumer takes it
            taken.extend(wait_until("the lease lapses", lambda: client.receive(
                "st", 1, visibility_timeout=30)))

    with caplog.at_level(logging.WARNING, "queue_pg.worker"), running(
            kind, clean, "st", handler, concurrency=4, visibility_timeout=0.5,
            heartbeat_interval=60, wait=1) as stats:
        wait_until("all three settled", lambda: stats.succeeded + stats.lost == 3)
    assert (stats.succeeded, stats.lost) == (2, 1)
    assert [m.id for m in taken] == [ids[0]]
    assert f"message {ids[0]} of st" in caplog.text and "StaleReceipt" in caplog.text
    assert outcomes(clean) == {ids[1]: ["deleted"], ids[2]: ["deleted"]}
    assert client.delete("st", taken[0].receipt)  # the new holder's receipt still works



@pytest.mark.parametrize("kind", KINDS)
def test_a_handler_that_gave_its_receipt_away_is_reported_lost_when_another_took_it(
    kind: str, client: queue_pg.Client, clean: str, caplog: pytest.LogCaptureFixture
) -> None:
    # the handler ends its own lease and another consumer receives the message before the
    # handler returns normally: the worker's delete is refused for that job alone, and the new
    # holder's lease is untouched
    client.create_queue("away", visibility_timeout=30)
    ids = [client.send("away", {"n": 0})]
    taken: list[Any] = []

    def handler(job: Any) -> None:
        if job.id == ids[0]:
            client.change_visibility("away", job.receipt, 0)
            taken.extend(wait_until("another consumer takes it", lambda: client.receive(
                "away", 1, visibility_timeout=30)))
            ids.append(client.send("away", {"n": 1}))  # a job the worker settles as usual

    with caplog.at_level(logging.WARNING, "queue_pg.worker"), running(
            kind, clean, "away", handler, concurrency=1, wait=1) as stats:
        wait_until("both settled", lambda: stats.succeeded + stats.lost == 2)
    assert (stats.succeeded, stats.lost) == (1, 1)
    assert [m.id for m in taken] == [ids[0]]
    assert f"message {ids[0]} of away" in caplog.text and "StaleReceipt" in caplog.text
    assert outcomes(clean) == {ids[1]: ["deleted"]}
    assert client.delete("away", taken[0].receipt)  # the new holder's receipt still works

@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_flush_deletes_a_job_that_finished_during_a_long_poll(
    kind: str, client: queue_pg.Client, clean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one long poll of 20 s: the job ends during it, and the flush deletes it without waiting
    # for the poll to return
    monkeypatch.setattr(worker_loop, "POLL_SLICE", 30.0)
    client.create_queue("tail")
    finished = threading.Event()

    def handler(job: Any) -> None:
        finished.wait(30)

    with running(kind, clean, "tail", handler, concurrency=2, wait=20) as stats:
        mid = client.send("tail", {"n": 1})
        wait_until("the job started", lambda: stats.received == 1)
        # the job ends only once the worker's next receive has begun
        with psycopg.connect(clean, autocommit=True) as watch:
            since = watch.execute("SELECT clock_timestamp()").fetchone()[0]
            wait_until("the next receive", lambda: watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
                " AND query_start > %s AND (query LIKE '%%queue_pg._receive%%'"
                " OR query LIKE '%%queue_pg.channel%%')", [since]).fetchone()[0])
        finished.set()  # ends while the worker waits in that long poll
        wait_until("the job deleted", lambda: outcomes(clean).get(mid) == ["deleted"],
                   timeout=10)
        # counted once delete_batch has returned: a moment after its commit is visible
        wait_until("the job counted", lambda: stats.succeeded == 1, timeout=5)


CHILD = """
import os, signal, sys
import queue_pg
from queue_pg.jobs import acks

add = acks.Acks.add

def add_then_die(self, job):  # finished, its delete only planned: the process dies here
    add(self, job)
    open(sys.argv[2], "a").write(f"{job.id}\\n")
    os.kill(os.getpid(), signal.SIGKILL)

acks.Acks.add = add_then_die
client = queue_pg.Client(sys.argv[1], sweep_interval=None)
queue_pg.Worker(client, "crash", lambda job: None, visibility_timeout=1, wait=1).run()
"""


def test_kill_9_between_finish_and_delete_runs_the_job_again(
    client: queue_pg.Client, clean: str, tmp_path: Path
) -> None:
    client.create_queue("crash")
    mid = client.send("crash", {"n": 1})
    marker = tmp_path / "finished"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run([sys.executable, "-c", CHILD, clean, str(marker)], env=env,
                           cwd=ROOT, timeout=60, capture_output=True)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    assert marker.read_text() == f"{mid}\n"
    assert outcomes(clean) == {}  # not deleted: still leased by the dead worker
    again: list[tuple[int, int]] = []
    with running("threads", clean, "crash", lambda job: again.append(
            (job.id, job.receive_count)), wait=1) as stats:
        wait_until("the job ran again", lambda: stats.succeeded == 1)
    assert again == [(mid, 2)]
    assert outcomes(clean) == {mid: ["deleted"]}


@pytest.mark.slow
def test_racing_worker_processes_delete_each_message_exactly_once(app: App) -> None:  # noqa: F811
    n = 600
    keys = [f"k{i}" for i in range(n)]
    app.client.create_queue(Q, visibility_timeout=2)
    for k in keys:
        app.send("noop", k)
    procs = [app.spawn("--processes", "2", concurrency=8) for _ in range(2)]
    wait_until("a third done", lambda: len(app.runs("done")) >= n // 3, timeout=60)
    os.killpg(procs[0].pid, signal.SIGKILL)  # mid-batch: its finished jobs' deletes are lost
    procs[0].popen.wait(10)
    wait_until("every message deleted",
               lambda: len(outcomes(app.dsn)) == n, timeout=120)
    history = outcomes(app.dsn)
    assert all(v == ["deleted"] for v in history.values()), {
        k: v for k, v in history.items() if v != ["deleted"]}
    done = {r["key"] for r in app.runs("done")}
    assert done == set(keys)  # none lost; a killed process's jobs ran again elsewhere
    with psycopg.connect(app.dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM queue_pg.messages").fetchone()
    assert row is not None and row[0] == 0



@pytest.mark.parametrize("kind", KINDS)
def test_a_settle_cut_off_by_the_server_is_retried_and_deletes_each_job_once(
    kind: str, client: queue_pg.Client, clean: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each handler ends by having the server terminate every connection of the worker (by its
    application_name): the flush that follows fails on a dead connection and is tried again on
    a new one. From the history: each job
    deleted once, received once (its lease held: it never ran again)."""
    client.create_queue("cut", visibility_timeout=30)
    ids = [client.send("cut", {"n": i}) for i in range(4)]
    name = f"qp-cut-{kind}-{os.getpid()}"
    runs: collections.Counter[int] = collections.Counter()
    killed: list[int] = []

    def handler(job: Any) -> None:
        runs[job.id] += 1
        with psycopg.connect(clean, autocommit=True) as c:  # the job is done; now the cut
            row = c.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                            " WHERE application_name = %s", [name]).fetchone()
        assert row is not None
        killed.append(row[0])

    dsn = psycopg.conninfo.make_conninfo(clean, application_name=name)
    with caplog.at_level(logging.WARNING, "queue_pg"), running(
            kind, dsn, "cut", handler, concurrency=1, wait=1) as stats:
        wait_until("every job settled", lambda: stats.succeeded == len(ids), timeout=60)
    assert all(k > 0 for k in killed) and len(killed) == len(ids)
    # each cut made the next calls of the worker fail (the flush's delete_batch, the receive);
    # each was tried again on a new connection
    assert caplog.text.count("lost the database (AdminShutdown") >= len(ids), caplog.text
    assert dict(runs) == {i: 1 for i in ids}
    assert (stats.lost, stats.retried) == (0, 0)
    with psycopg.connect(clean, autocommit=True) as c:
        rows = c.execute("SELECT message_id, outcome, receive_count, lease_expiries"
                         " FROM queue_pg.message_history WHERE queue = 'cut'").fetchall()
    assert sorted(rows) == [(i, "deleted", 1, 0) for i in ids]
