"""Per-task limits the database enforces across workers, checked against what ran and against
the history: at most N runs of a task at once (without holding back other tasks of its queue),
at most R starts a second on a queue; queues without limits are untouched."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import worker_app

import queue_pg
import queue_pg.errors
from queue_pg.errors import InvalidParameter
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.declare import limited_queue
from queue_pg.jobs.tasks import Registry, Task


def wait_for(what: str, cond: object, timeout: float = 30.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if cond():  # type: ignore[operator]
            return
        done.wait(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def workers(dsn: str, queues: list[str], reg: Registry, n: int, concurrency: int
            ) -> Iterator[list[queue_pg.Worker]]:
    """``n`` workers, each with its own client (its own pool): they share nothing but the
    database."""
    clients = [queue_pg.Client(dsn, sweep_interval=None, max_size=concurrency + 2)
               for _ in range(n)]
    ws = [queue_pg.Worker(c, queues, reg, concurrency=concurrency, wait=1) for c in clients]
    threads = [threading.Thread(target=w.run, kwargs={"signals": ()}) for w in ws]
    for t in threads:
        t.start()
    try:
        yield ws
    finally:
        for w in ws:
            w.stop()
        for t in threads:
            t.join(30)
        for c in clients:
            c.close()


def test_max_running_holds_across_workers_and_other_tasks_pass(
    client: queue_pg.Client, clean: str
) -> None:
    client.create_queue("media")
    reg = Registry()
    reg.set_client(client)
    lock = threading.Lock()
    running, most, done_other = [0], [0], []
    release = threading.Event()

    def slow(i: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            release.wait(30)
        finally:
            with lock:
                running[0] -= 1

    limited = Task(slow, queue="media", name="thumbs", registry=reg, max_running=2)
    other = Task(lambda i: done_other.append(i), queue="media", name="other", registry=reg)
    with workers(clean, ["media"], reg, n=2, concurrency=4):
        wait_for("the limited task's queue", lambda: "media-thumbs" in
                 {q.name for q in client.list_queues()} and client.list_routes("media"))
        for i in range(6):
            limited.enqueue(i)
        for i in range(10):
            other.enqueue(i)
        # every other job runs while the limited ones wait for their turn
        wait_for("the other task's jobs", lambda: len(done_other) == 10)
        wait_for("two limited runs", lambda: running[0] == 2)
        assert client.stats("media-thumbs").visible == 4  # waiting, not taken by a worker
        release.set()
        wait_for("every limited run", lambda: client.stats("media-thumbs").visible == 0
                 and running[0] == 0 and client.stats("media-thumbs").in_flight == 0)
    assert most[0] == 2
    assert limited_queue(limited) == "media-thumbs"
    assert client.get_queue("media-thumbs").in_flight_limit == 2


def options(dsn: str, queue: str) -> dict[str, object]:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT options FROM queue_pg.queues WHERE name = %s", [queue]).fetchone()
    assert row is not None
    return dict(row[0])


def test_rate_limit_caps_starts_per_second_from_the_history(
    client: queue_pg.Client, clean: str
) -> None:
    client.create_queue("rated")
    reg = Registry()
    reg.set_client(client)
    ran: list[int] = []
    t = Task(lambda i: ran.append(i), queue="rated", name="r", registry=reg, rate_limit=5)
    client.create_queue("free")
    client.send_batch("free", [{"n": i} for i in range(5)])
    with workers(clean, ["rated"], reg, n=2, concurrency=4):
        wait_for("the rate", lambda: "rate_limit" in options(clean, "rated"))
        for i in range(20):
            t.enqueue(i)
        wait_for("every job", lambda: len(ran) == 20, timeout=60)
    with psycopg.connect(clean, autocommit=True) as c:
        starts = [r[0].timestamp() for r in c.execute(
            "SELECT last_received_at FROM queue_pg.message_history WHERE queue = 'rated'"
            " ORDER BY last_received_at")]
    assert len(starts) == 20
    # at most R * (t + 1) starts in any t seconds (a bucket of one second's worth)
    for i in range(len(starts)):
        for j in range(i, len(starts)):
            assert j - i + 1 <= 5 * (starts[j] - starts[i] + 1) + 1e-6, (i, j, starts)
    assert starts[-1] - starts[0] >= (20 - 5) / 5 - 0.5
    # a queue without a rate is not touched: all 5 at once
    assert len(client.receive("free", 10)) == 5
    assert client.set_rate_limit("rated", None) is None
    assert "rate_limit" not in options(clean, "rated")
    for bad in (0, -1, float("nan"), 100_001):
        with pytest.raises(InvalidParameter, match=(
                r"per_second = \S+ is out of range: allowed more than 0 up to 100000 starts per second")):
            client.set_rate_limit("rated", bad)
    assert "rate_limit" not in options(clean, "rated")
    assert client.set_rate_limit("rated", 0.0001) == 0.0001  # one start in ~3 hours: allowed


def overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at the same instant)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


@pytest.mark.slow
def test_max_running_holds_from_the_first_enqueue_across_worker_processes(
    client: queue_pg.Client, clean: str, tmp_path: Path
) -> None:
    """Jobs enqueued before any worker ever started are limited too: the first enqueue set the
    limit up. Three worker processes of 4 threads each: at most 2 runs at once, counted from
    what ran (worker_runs) and from the leases in the history."""
    import limits_app
    from test_worker import App

    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(worker_app.RUNS_DDL)
        c.execute("TRUNCATE worker_runs")
    client.create_queue(limits_app.QUEUE)
    target = limited_queue(limits_app.slow)
    n = 10
    for i in range(n):
        limits_app.slow.send([f"k{i}", 0.3], client=client)
    assert client.get_queue(target).in_flight_limit == 2
    assert client.stats(target).visible == n and client.stats(limits_app.QUEUE).visible == 0
    app = App(clean, client, tmp_path)
    try:
        for _ in range(3):
            app.procs.append(spawn(app, "limits_app", limits_app.QUEUE, concurrency=4))
        wait_for("every run", lambda: len(app.runs("done")) == n, timeout=60)
    finally:
        for p in app.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in app.procs:
            p.popen.wait(30)
    starts = {r["key"]: r["at"].timestamp() for r in app.runs("start")}
    ends = {r["key"]: r["at"].timestamp() for r in app.runs("done")}
    assert len(starts) == n
    assert overlap([(starts[k], ends[k]) for k in starts]) == 2
    # a run starts when one ends (the delete that frees the slot wakes the long polls), not at
    # the next poll slice: 5 rounds of 0.3 s, where a second a round took 5 s
    span = max(ends.values()) - min(starts.values())
    assert span < 3.5, sorted((starts[k], ends[k]) for k in starts)
    with psycopg.connect(clean, autocommit=True) as c:
        leases = [(a.timestamp(), b.timestamp()) for a, b in c.execute(
            "SELECT last_received_at, finished_at FROM queue_pg.message_history"
            " WHERE queue = %s AND outcome = 'deleted'", [target])]
    assert len(leases) == n and overlap(leases) <= 2


def spawn(app: Any, module: str, queue: str, concurrency: int) -> Any:
    from test_worker import ROOT, Proc

    log = app.tmp / f"worker-{len(app.procs)}.log"
    env = {**os.environ, "QUEUE_PG_DSN": app.dsn,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "queue_pg.jobs.worker_cli", module, "--queue", queue,
             "--concurrency", str(concurrency)],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(popen, log)


def test_a_producer_without_manage_enqueues_once_the_limit_is_in_place(
    client: queue_pg.Client, clean: str
) -> None:
    """limit_task asks only send of a producer when the limit exists; setting it up asks more."""
    client.create_queue("lp")
    reg = Registry()
    t = Task(lambda: None, queue="lp", name="lp.t", registry=reg, max_running=3)
    role = f"qp_lp_producer_{uuid.uuid4().hex[:8]}"  # roles are the server's: one of our own
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE queue_pg_producer')
    try:
        client.grant("lp", role, "send")
        dsn = psycopg.conninfo.make_conninfo(clean, user=role)
        with queue_pg.Client(dsn, sweep_interval=None) as producer:
            with pytest.raises(queue_pg.errors.AccessDenied, match="manage"):
                t.send(client=producer)  # no limit yet, and no right to set it up
            assert client.stats("lp").visible == 0
            assert client.limit_task("lp", "lp.t", limited_queue(t), 3) is True
            assert client.limit_task("lp", "lp.t", limited_queue(t), 3) is False
            t.send(client=producer)
            t._limit_made = False
            with psycopg.connect(dsn) as conn:  # in the producer's transaction
                t.send(conn=conn)
        assert client.stats(limited_queue(t)).visible == 2
        assert client.stats("lp").visible == 0
    finally:
        with psycopg.connect(clean, autocommit=True) as c:
            c.execute(f'DROP OWNED BY "{role}"')
            c.execute(f'DROP ROLE "{role}"')


def test_a_retry_waiting_out_its_backoff_holds_no_slot(
    client: queue_pg.Client, clean: str
) -> None:
    """max_running=1: the first job fails and waits 30 s for its retry; the second runs now."""
    client.create_queue("bk")
    reg = Registry()
    reg.set_client(client)
    ran: list[str] = []

    def flaky(key: str) -> None:
        ran.append(key)
        if key == "a":
            raise RuntimeError("first attempt fails")

    t = Task(flaky, queue="bk", name="bk.flaky", registry=reg, max_running=1,
             backoff=Backoff(base=30, cap=30, jitter=0))
    with workers(clean, ["bk"], reg, n=1, concurrency=2):
        wait_for("the limit", lambda: client.list_routes("bk"))
        t.enqueue("a")
        wait_for("a's first attempt", lambda: ran == ["a"])
        t.enqueue("b")
        wait_for("b, while a waits out its backoff", lambda: ran == ["a", "b"], timeout=10)
    stats = client.stats(limited_queue(t))
    assert (stats.visible, stats.in_flight) == (0, 1)  # a: waiting out its backoff


def test_in_flight_limit_does_not_count_a_released_backoff(
    client: queue_pg.Client, clean: str
) -> None:
    client.create_queue("ifl", in_flight_limit=1)
    client.send_batch("ifl", [{"n": 1}, {"n": 2}])
    [m] = client.receive("ifl", 5)
    with pytest.raises(queue_pg.errors.OverLimit):
        client.receive("ifl", 1, wait=0)
    client.change_visibility("ifl", m.receipt, 60, release=True)  # a planned retry's backoff
    [m2] = client.receive("ifl", 5, wait=0)
    with pytest.raises(queue_pg.errors.OverLimit):
        client.receive("ifl", 1, wait=0)
    with pytest.raises(queue_pg.errors.StaleReceipt):  # the release spent the old receipt
        client.delete("ifl", m.receipt)
    with pytest.raises(queue_pg.errors.OverLimit):  # and it frees no slot
        client.receive("ifl", 1, wait=0)
    assert client.delete("ifl", m2.receipt)
    assert client.receive("ifl", 1, wait=0) == []
