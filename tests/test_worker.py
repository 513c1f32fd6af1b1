"""The worker runtime against a real server, with real processes and real signals.

Worker processes are ``python -m queue_pg.jobs.worker_cli worker_app`` (tasks in tests/worker_app.py,
which log every start, chunk and finish to the table ``worker_runs``), so what a killed process
did is still visible. Leases are sub-second to keep the suite fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import worker_app
from psycopg.rows import dict_row

import queue_pg
from queue_pg.jobs.aio_worker import AsyncWorker
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.job import MAX_LEASE, AsyncJob, Job, LeaseLost, Reject, TaskTimeout
from queue_pg.jobs.tasks import Registry
from queue_pg.jobs.worker import Worker

ROOT = Path(__file__).resolve().parents[1]
Q = worker_app.QUEUE
T = TypeVar("T")


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``: a worker started with
    ``start_new_session`` and everything it started (spawn children, resource tracker)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # exited meanwhile
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            pids.append(int(entry))
    return pids


def wait_until(what: str, check: Callable[[], T], timeout: float = 30.0) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {self.pid} still running; log:\n{self.logs()}") from None


@dataclass
class App:
    """The test database, a client on it, and worker processes started by the test."""

    dsn: str
    client: queue_pg.Client
    tmp: Path
    procs: list[Proc] = field(default_factory=list)

    def spawn(self, *options: str, concurrency: int = 1) -> Proc:
        log = self.tmp / f"worker-{len(self.procs)}.log"
        env = {**os.environ, "QUEUE_PG_DSN": self.dsn,
               "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "queue_pg.jobs.worker_cli", "worker_app", "--queue", Q,
                 "--concurrency", str(concurrency), *options],
                env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        proc = Proc(popen, log)
        self.procs.append(proc)
        return proc

    def runs(self, event: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row) as c:
            return c.execute(
                "SELECT * FROM worker_runs WHERE (%(e)s::text IS NULL OR event = %(e)s)"
                " AND (%(k)s::text IS NULL OR key = %(k)s) ORDER BY n",
                {"e": event, "k": key},
            ).fetchall()

    def history(self) -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row) as c:
            return c.execute("SELECT * FROM queue_pg.message_history ORDER BY message_id").fetchall()

    def send(self, name: str, *args: Any, **kwargs: Any) -> int:
        t = worker_app.noop.registry.tasks[name]
        return t.send(args, kwargs, client=self.client)


def deleted(app: App) -> None:
    """Wait for the deletes of finished jobs: a worker makes them in batches, a few ms later
    (with its next receive, or its flush; see queue_pg.jobs.acks)."""
    wait_until("finished jobs deleted", lambda: app.client.stats(Q).in_flight == 0)


@pytest.fixture
def app(client: queue_pg.Client, clean: str, tmp_path: Path) -> Iterator[App]:
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute(worker_app.RUNS_DDL)
        c.execute("TRUNCATE worker_runs")
    a = App(clean, client, tmp_path)
    yield a
    for p in a.procs:
        # The whole process group: a supervisor's spawn children (and its resource tracker) must
        # not outlive a failed test, still polling a database that is about to be dropped.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.popen.wait(5)


# --- crashes, heartbeats, retries -----------------------------------------------------------------


def test_sigkill_mid_job_redelivers_to_another_worker_nothing_lost(app: App) -> None:
    app.client.create_queue(Q, visibility_timeout=0.6)
    killed = app.spawn(concurrency=2)
    for k in ("k1", "k2"):
        app.send("slow", k, 1.0)
    wait_until("two jobs started", lambda: len(app.runs("start")) == 2)
    survivor = app.spawn(concurrency=2)
    killed.signal(signal.SIGKILL)
    killed.wait(5)
    for k in ("k3", "k4"):
        app.send("slow", k, 0.2)

    wait_until("all four done", lambda: len(app.runs("done")) == 4, timeout=15)
    done = app.runs("done")
    assert sorted(r["key"] for r in done) == ["k1", "k2", "k3", "k4"]  # each exactly once
    assert {r["pid"] for r in done} == {survivor.pid}
    for k in ("k1", "k2"):
        first, second = app.runs("start", k)
        assert (first["pid"], first["attempt"]) == (killed.pid, 1)
        assert (second["pid"], second["attempt"]) == (survivor.pid, 2)
    deleted(app)
    stats = app.client.stats(Q)
    assert (stats.visible, stats.in_flight, stats.lease_expiries) == (0, 0, 2)


def test_job_three_times_longer_than_its_lease_runs_once(app: App) -> None:
    app.client.create_queue(Q, visibility_timeout=0.4)
    workers = [app.spawn(), app.spawn()]  # the other one would take a lapsed lease at once
    app.send("slow", "long", 1.2)
    wait_until("the job done", lambda: app.runs("done"), timeout=10)
    time.sleep(0.5)  # a redelivery would have started by now
    assert [r["event"] for r in app.runs()] == ["start", "done"]
    stats = app.client.stats(Q)
    assert (stats.lease_expiries, stats.stale_receipts, stats.visible, stats.in_flight) == (0, 0, 0, 0)
    assert [h["outcome"] for h in app.history()] == ["deleted"]
    for w in workers:
        assert "Traceback" not in w.logs()


def test_failing_task_backs_off_then_dead_letters_with_its_error(app: App) -> None:
    app.client.create_queue("wq-dlq")
    app.client.create_queue(Q, visibility_timeout=2, dead_letter_queue="wq-dlq", max_receive_count=3)
    w = app.spawn()
    mid = app.send("fail", "f1")
    dead = wait_until("dead-lettered", lambda: app.client.peek("wq-dlq"), timeout=15)

    starts = app.runs("start")
    assert [r["attempt"] for r in starts] == [1, 2, 3]
    gaps = [(b["at"] - a["at"]).total_seconds() for a, b in itertools.pairwise(starts)]
    # task backoff: base 0.2 doubling, half of it random -> at least 0.1 then 0.2
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2, gaps
    assert gaps[0] < 2 and gaps[1] < 2, gaps  # made visible by the backoff, not by the lease

    assert dead[0].id == mid
    assert dead[0].body == {"task": "fail", "args": ["f1"], "kwargs": {}}  # the sender's, as sent
    error = dead[0].attributes["error"]  # the last attempt's, in the attributes
    assert error["type"] == "builtins.ValueError"
    assert error["message"] == "boom f1"
    assert error["attempt"] == 3
    assert 'raise ValueError(f"boom {key}")' in error["traceback"]
    assert error["worker"].endswith(f":{w.pid}") and error["at"]
    assert dead[0].attributes["type"] == "fail"  # merged, not replaced
    assert "dead_letter_reason" not in dead[0].attributes  # max_receive_count did it
    (h,) = app.history()
    assert (h["outcome"], h["receive_count"], h["type"]) == ("dead_lettered", 3, "fail")
    # the backoffs were planned retries, not lapsed leases
    assert h["lease_expiries"] == 0
    assert app.client.stats(Q).lease_expiries == 0
    assert "fail (message" in w.logs() and "retry in" in w.logs()


@pytest.mark.slow
def test_checkpointed_job_resumes_after_sigkill(app: App) -> None:
    app.client.create_queue(Q, visibility_timeout=0.5)
    a = app.spawn()
    app.send("chunked", "c", 12, 0.1)
    wait_until("four chunks done", lambda: len(app.runs("chunk")) >= 4)
    a.signal(signal.SIGKILL)
    a.wait(5)
    before = [r["data"]["chunk"] for r in app.runs("chunk")]
    assert before == list(range(len(before)))

    b = app.spawn()
    wait_until("the job done", lambda: app.runs("done"), timeout=15)
    runs = app.runs()
    resumed = [r for r in runs if r["pid"] == b.pid]
    assert resumed[0]["event"] == "resume" and resumed[0]["attempt"] == 2
    first = resumed[0]["data"]["first"]
    # from the last checkpoint: the chunk being done when killed is redone at most
    assert first in (before[-1], before[-1] + 1), (first, before)
    assert first >= 3  # not from zero
    after = [r["data"]["chunk"] for r in resumed if r["event"] == "chunk"]
    assert after == list(range(first, 12))
    deleted(app)


def test_unknown_task_and_bad_arguments_are_not_retried(app: App) -> None:
    app.client.create_queue("wq-dlq")
    app.client.create_queue(Q, visibility_timeout=0.5, dead_letter_queue="wq-dlq", max_receive_count=5)
    ids = [
        app.client.send(Q, {"task": "no_such_task", "args": [], "kwargs": {}}),
        app.client.send(Q, {"task": "noop", "args": ["k", "extra"], "kwargs": {}}),
        app.client.send(Q, {"task": "noop", "args": [], "kwargs": {"nope": 1}}),
        app.client.send(Q, {"not": "a task"}),
    ]
    w = app.spawn()
    app.send("noop", "ok")
    wait_until("all settled", lambda: len(app.history()) == 5)
    time.sleep(0.7)  # longer than a lease: a retried message would be received again
    history = {h["message_id"]: h for h in app.history()}
    for i in ids:
        assert history[i]["receive_count"] == 1, history[i]
        assert history[i]["outcome"] == "dead_lettered"
    assert [r["key"] for r in app.runs()] == ["ok"]
    dead = {m.id: m for m in app.client.peek("wq-dlq", 10)}
    assert sorted(dead) == sorted(ids)
    reasons = [dead[i].attributes["dead_letter_reason"] for i in ids]
    assert reasons[0].startswith("unknown task 'no_such_task': this worker knows ")
    assert all(r.startswith("task 'noop': arguments do not fit noop(") for r in reasons[1:3])
    assert reasons[3].startswith("not a task message")
    for i in ids:
        assert dead[i].attributes["error"]["type"] == "queue_pg.jobs.job.Reject"
        assert dead[i].attributes["error"]["message"] == dead[i].attributes["dead_letter_reason"]
    assert dead[ids[0]].body == {"task": "no_such_task", "args": [], "kwargs": {}}
    log = w.logs()
    assert "unknown task 'no_such_task'" in log
    assert log.count("arguments do not fit noop(") == 2
    assert "not a task message" in log
    assert log.count("; dead-lettered") == 4 and "DELETED" not in log
    stats = app.client.stats(Q)
    assert stats.visible + stats.in_flight == 0


# --- stopping -------------------------------------------------------------------------------------


def test_sigterm_finishes_running_job_and_releases_unstarted(app: App) -> None:
    """SIGTERM lands while a receive is in progress (held by a lock on the queues table):
    the job running finishes, the messages that receive returns are released, exit 0.

    The lease is given on the command line: a worker that reads its queue's lease looks it up
    again every few seconds, and that look-up, not a receive, would be what the lock holds."""
    app.client.create_queue(Q, visibility_timeout=5)
    w = app.spawn("--grace-period", "10", "--visibility-timeout", "5", concurrency=2)
    app.send("slow", "running", 1.0)
    wait_until("the job started", lambda: app.runs("start"))
    with psycopg.connect(app.dsn) as locker:
        locker.execute("LOCK TABLE queue_pg.queues IN ACCESS EXCLUSIVE MODE")
        for k in ("u1", "u2", "u3"):  # committed with the lock's release: the receive sees them
            worker_app.noop.send([k], conn=locker)
        with psycopg.connect(app.dsn, autocommit=True) as watch:
            # the receive's claim, or its long poll's channel look-up between two claims:
            # either way the claim that follows the lock's release finds u1..u3
            wait_until("the worker's receive blocked", lambda: watch.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND (query LIKE '%queue_pg._receive%'"
                " OR query LIKE '%queue_pg.channel%')").fetchone())
        w.signal(signal.SIGTERM)
        time.sleep(0.2)
        signalled = time.monotonic()
        locker.commit()
    assert w.wait(10) == 0
    took = time.monotonic() - signalled
    assert took < 3, took
    assert [(r["key"], r["event"]) for r in app.runs()] == [("running", "start"), ("running", "done")]
    stats = app.client.stats(Q)
    assert (stats.visible, stats.in_flight) == (3, 0)  # with a 5 s lease: released, not lapsed
    assert "released 1 received, unstarted message(s)" in w.logs()


def test_idle_worker_stops_at_once_and_second_signal_exits_now(app: App) -> None:
    app.client.create_queue(Q, visibility_timeout=5)
    # The bounds are half of what a stop that waited would take (the 20 s long poll, the 40 s
    # job): a process's exit on a loaded 2-core machine took up to 1.6 s, measured.
    idle = app.spawn("--wait", "20")
    busy = app.spawn("--grace-period", "40")
    wait_until("both ready", lambda: all("ready: wq" in p.logs() for p in (idle, busy)))
    t0 = time.monotonic()
    idle.signal(signal.SIGTERM)
    assert idle.wait(30) == 0
    assert time.monotonic() - t0 < 10  # the long poll (20 s) does not hold the stop

    app.send("slow", "long", 40)
    wait_until("the job started", lambda: app.runs("start"))
    busy.signal(signal.SIGTERM)
    time.sleep(0.2)
    t0 = time.monotonic()
    busy.signal(signal.SIGTERM)
    assert busy.wait(30) == 128 + signal.SIGTERM
    assert time.monotonic() - t0 < 20  # not after the job (40 s) nor the grace (40 s)
    assert app.client.stats(Q).in_flight == 1  # its lease brings it back
    assert not app.runs("done")


@pytest.mark.slow
def test_a_killed_workers_jobs_run_again_in_seconds_not_when_their_leases_lapse(app: App) -> None:
    """Three worker processes of three threads each run nine 4 s jobs under a 60 s lease; one
    is killed with SIGKILL mid-job. The others' reaps end its three leases after the grace
    period, and they run again there within seconds, not a minute; no job of a living worker
    runs twice, and the history has each message deleted once."""
    app.client.create_queue(Q, visibility_timeout=60)
    workers = [app.spawn(concurrency=3) for _ in range(3)]
    wait_until("all ready", lambda: all("ready: wq" in w.logs() for w in workers))
    for i in range(9):
        app.send("slow", f"j{i}", 4.0)
    starts = wait_until("nine jobs started", lambda: len(app.runs("start")) == 9 and app.runs("start"))
    victim = workers[0]
    doomed = sorted(r["key"] for r in starts if r["pid"] == victim.pid)
    assert len(doomed) == 3, starts  # each worker took as many as it has threads
    victim.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait(5)
    again = wait_until("the killed worker's jobs started again", lambda: (
        sorted(r["key"] for r in app.runs("start") if r["pid"] != victim.pid
               and r["key"] in doomed and r["attempt"] == 2) == doomed), timeout=30)
    took = time.monotonic() - killed_at
    assert again and took < 20, took  # the survivors are busy for 4 s; the lease is 60 s
    wait_until("every job done", lambda: len(app.runs("done")) == 9, timeout=30)
    done = app.runs("done")
    assert sorted(r["key"] for r in done) == sorted(f"j{i}" for i in range(9))
    assert victim.pid not in {r["pid"] for r in done}
    runs = app.runs("start")
    assert {r["key"]: sum(1 for x in runs if x["key"] == r["key"]) for r in runs} == {
        f"j{i}": 2 if f"j{i}" in doomed else 1 for i in range(9)}
    wait_until("all deleted", lambda: app.client.stats(Q).in_flight == 0)
    history = app.history()
    assert sorted(h["message_id"] for h in history) == sorted({r["msg_id"] for r in runs})
    assert {h["outcome"] for h in history} == {"deleted"}
    assert sum(h["lease_expiries"] for h in history) == 3  # the ended leases count as lapsed


def test_processes_share_the_work_and_stop_on_sigterm(app: App) -> None:
    app.client.create_queue(Q, visibility_timeout=5)
    sup = app.spawn("--processes", "2", "--grace-period", "10")
    for k in ("p1", "p2"):
        app.send("slow", k, 1.0)
    starts = wait_until("both jobs started", lambda: len(app.runs("start")) == 2 and app.runs("start"))
    assert len({r["pid"] for r in starts}) == 2 and sup.pid not in {r["pid"] for r in starts}
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0
    assert sorted(r["key"] for r in app.runs("done")) == ["p1", "p2"]
    assert app.client.stats(Q).in_flight == 0
    assert "exited with [0, 0]" in sup.logs()
    # nothing of the supervisor's is left: workers, resource tracker
    wait_until("its processes gone", lambda: not group_members(sup.pid), timeout=5)


@pytest.mark.slow
def test_worker_processes_stop_by_themselves_when_the_supervisor_is_killed(app: App) -> None:
    """A supervisor killed with SIGKILL forwards nothing: its workers notice it is gone and
    stop gracefully, finishing the job they run, instead of running unsupervised for ever."""
    app.client.create_queue(Q, visibility_timeout=5)
    sup = app.spawn("--processes", "2", "--grace-period", "10")
    wait_until("both workers ready", lambda: sup.logs().count("ready: wq") == 2)
    app.send("slow", "s1", 1.0)
    (start,) = wait_until("the job started", lambda: app.runs("start"))
    sup.signal(signal.SIGKILL)
    sup.wait(5)
    wait_until("the worker processes gone", lambda: not group_members(sup.pid), timeout=10)
    assert sup.logs().count("is gone; stopping") == 2
    assert [r["key"] for r in app.runs("done")] == ["s1"]  # finished within the grace period
    assert app.runs("done")[0]["pid"] == start["pid"]
    stats = app.client.stats(Q)
    assert (stats.visible, stats.in_flight) == (0, 0)


# --- in-process: cancellation, retries cap, asyncio -----------------------------------------------


def _run_in_thread(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    return t


def test_handler_is_told_when_max_lease_stops_the_heartbeat(client: queue_pg.Client) -> None:
    client.create_queue("cap", visibility_timeout=0.4, max_lease=1)
    seen: dict[str, Any] = {}

    def handler(job: Job) -> None:
        t0 = time.monotonic()
        while not job.cancelled:
            assert time.monotonic() - t0 < 3, "never cancelled"
            time.sleep(0.01)
        seen["after"] = time.monotonic() - t0
        seen["reason"] = job.cancel_reason
        worker.stop()  # so that this worker does not take the released message again
        job.raise_if_cancelled()

    worker = Worker(client, "cap", handler, concurrency=1, wait=0.5)
    t = _run_in_thread(worker)
    mid = client.send("cap", {"n": 1})
    wait_until("cancelled", lambda: "reason" in seen)
    worker.stop()
    t.join(5)
    assert seen["reason"] == MAX_LEASE
    assert 0.45 < seen["after"] < 1.0  # the beat that would pass 1 s is refused
    (m,) = client.receive("cap")  # released at once on LeaseLost, not left to lapse
    assert m.id == mid and m.receive_count == 2
    assert worker.stats.released == 1


def test_task_retries_cap_rejects_and_timeout_cancels(
    client: queue_pg.Client, clean: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On a queue without a dead-letter queue, a rejected message is kept (it comes back after
    the backoff) and logged with its traceback."""
    caplog.set_level(logging.WARNING, "queue_pg.worker")
    reg = Registry()
    calls: list[tuple[str, int, bool]] = []

    @queue_pg.task(queue="t", name="flaky", retries=1, backoff=Backoff(base=0.05), registry=reg,
                   bind=True)
    def flaky(job: Job) -> None:
        calls.append(("flaky", job.receive_count, job.cancelled))
        raise RuntimeError("nope")

    @queue_pg.task(queue="t", name="sleepy", timeout=0.3, registry=reg, bind=True)
    def sleepy(job: Job) -> None:
        try:
            while True:  # never looks at job.cancelled: the soft limit stops it
                time.sleep(0.01)
        except TaskTimeout:
            calls.append(("sleepy", job.receive_count, job.cancelled))
            raise

    client.create_queue("t", visibility_timeout=5)
    with pytest.raises(TypeError):
        flaky.send(["unexpected"], client=client)  # checked when sent, not in the worker
    flaky.send(client=client)
    sleepy.send(client=client)
    worker = Worker(client, "t", reg, concurrency=2, wait=0.5, backoff=Backoff(base=10))
    t = _run_in_thread(worker)
    wait_until("flaky rejected, sleepy timed out",
               lambda: worker.stats.kept == 1 and worker.stats.retried == 2)
    worker.stop()
    t.join(5)
    assert [c for c in calls if c[0] == "flaky"] == [("flaky", 1, False), ("flaky", 2, False)]
    assert [c for c in calls if c[0] == "sleepy"] == [("sleepy", 1, True)]
    with psycopg.connect(clean, autocommit=True, row_factory=dict_row) as c:
        assert c.execute("SELECT * FROM queue_pg.message_history").fetchall() == []  # kept
    (kept,) = [r for r in caplog.records if "KEPT" in r.getMessage()]
    assert kept.levelno == logging.ERROR
    assert "failed 2 times (retries = 1), last: RuntimeError: nope" in kept.getMessage()
    assert "has no dead_letter_queue" in kept.getMessage()
    assert kept.exc_info is not None  # the handler's traceback, once
    stats = client.stats("t")  # both wait out the worker's backoff: kept, not deleted
    assert stats.visible + stats.in_flight == 2
    assert stats.lease_expiries == 0  # flaky's retry was planned (release), not a lapse


async def test_async_worker_runs_heartbeats_and_retries(clean: str) -> None:
    async with queue_pg.AsyncClient(clean, sweep_interval=None) as client:
        await client.create_queue("aq", visibility_timeout=0.3)
        done: list[tuple[Any, int]] = []
        seen: dict[str, Any] = {}

        async def handler(job: AsyncJob) -> None:
            if job.body.get("fail") and job.receive_count == 1:
                raise RuntimeError("first attempt fails")
            if job.body.get("sleep"):
                await asyncio.sleep(job.body["sleep"])
            if job.body.get("fail"):
                seen["body"], seen["attributes"] = job.body, job.message.attributes
            done.append((job.body["n"], job.receive_count))

        worker = AsyncWorker(client, "aq", handler, concurrency=4, wait=0.5,
                             backoff=Backoff(base=0.05))
        run = asyncio.create_task(worker.run())
        await client.send_batch("aq", [{"n": i} for i in range(5)])
        await client.send("aq", {"n": "long", "sleep": 1.0})  # 3x its lease
        await client.send("aq", {"n": "flaky", "fail": True})
        deadline = time.monotonic() + 10
        while len(done) < 7:
            assert time.monotonic() < deadline, done
            await asyncio.sleep(0.02)
        worker.stop()
        await asyncio.wait_for(run, 5)
        assert sorted(str(n) for n, _ in done) == sorted([*map(str, range(5)), "long", "flaky"])
        assert dict((str(n), c) for n, c in done)["long"] == 1  # never redelivered
        assert dict((str(n), c) for n, c in done)["flaky"] == 2
        stats = await client.stats("aq")
        # flaky's backoff is a planned retry (release), not a lapse; the long job's lease was
        # kept by its heartbeat.
        assert (stats.visible, stats.in_flight, stats.lease_expiries) == (0, 0, 0)
        # a raw message: its body stays the sender's, the error goes to its attributes
        assert seen["body"] == {"n": "flaky", "fail": True}
        error = seen["attributes"]["error"]
        assert (error["type"], error["message"], error["attempt"]) == (
            "builtins.RuntimeError", "first attempt fails", 1)
        assert "raise RuntimeError" in error["traceback"]


def test_stop_ends_an_idle_long_poll_promptly(client: queue_pg.Client) -> None:
    """stop() from another thread ends run() within a poll slice, nothing left in flight."""
    client.create_queue("s", visibility_timeout=5)
    worker = Worker(client, "s", lambda job: None, wait=20)
    t = _run_in_thread(worker)
    time.sleep(0.3)
    t0 = time.monotonic()
    worker.stop()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 1.5


def test_checkpoint_after_lease_lost_raises(client: queue_pg.Client) -> None:
    client.create_queue("c", visibility_timeout=0.2)
    client.send("c", {"task": "x"})
    (m,) = client.receive("c")
    time.sleep(0.25)
    client.receive("c")  # someone else has it now
    job = Job(client, m, 0.2)
    with pytest.raises(LeaseLost):
        job.checkpoint({"next": 1})
    assert job.cancelled


async def test_async_worker_cancels_jobs_past_the_grace_period_and_releases(clean: str) -> None:
    async with queue_pg.AsyncClient(clean, sweep_interval=None) as client:
        await client.create_queue("ag", visibility_timeout=5)
        started = asyncio.Event()

        async def handler(job: AsyncJob) -> None:
            started.set()
            await asyncio.sleep(30)

        worker = AsyncWorker(client, "ag", handler, grace_period=0.2, wait=0.5)
        run = asyncio.create_task(worker.run())
        mid = await client.send("ag", {"n": 1})
        await asyncio.wait_for(started.wait(), 5)
        worker.stop()
        await asyncio.wait_for(run, 3)
        (m,) = await client.receive("ag")  # released at once, not after its 5 s lease
        assert m.id == mid and m.receive_count == 2
        assert worker.stats.released == 1


async def test_async_worker_registers_names_itself_in_its_leases_and_goes(clean: str) -> None:
    async with queue_pg.AsyncClient(clean, sweep_interval=None) as client:
        await client.create_queue("ac", visibility_timeout=30)
        started = asyncio.Event()
        release = asyncio.Event()

        async def handler(job: AsyncJob) -> None:
            started.set()
            await release.wait()

        worker = AsyncWorker(client, "ac", handler, wait=0.5)
        run = asyncio.create_task(worker.run())
        await client.send("ac", {"n": 1})
        await asyncio.wait_for(started.wait(), 5)
        async with await psycopg.AsyncConnection.connect(clean, autocommit=True) as o:
            cur = await o.execute(
                "SELECT c.id, c.name, m.consumer_id, pg_backend_pid() <> c.pid"
                " FROM queue_pg.consumers c, queue_pg.messages m")
            ((cid, name, leased_by, other_session),) = await cur.fetchall()
            assert leased_by == cid and other_session and name.endswith(f":{os.getpid()}")
            release.set()
            worker.stop()
            await asyncio.wait_for(run, 5)
            # its session is gone with the stop: the lock is free once the server has ended the
            # backend, which a loaded machine may take a moment after the client closed it
            deadline = time.monotonic() + 10
            while True:
                cur = await o.execute(
                    "SELECT pg_try_advisory_lock(queue_pg._consumer_space(), %s)", (cid,))
                if await cur.fetchone() == (True,):
                    break
                assert time.monotonic() < deadline, "the stopped worker's session holds its lock"
                await asyncio.sleep(0.05)


def test_a_worker_whose_registration_connection_is_cut_adopts_its_id_and_keeps_its_lease(
    client: queue_pg.Client, clean: str
) -> None:
    """The worker's own connection is terminated while a job runs (the process lives): it
    connects again within the grace period, adopts its consumer id, and no reap ends the job's
    lease; the job finishes once and is deleted."""
    client.create_queue("cut", visibility_timeout=60)
    client.send("cut", {"n": 1})
    started = threading.Event()
    finish = threading.Event()
    runs: list[int] = []

    def handler(job: Job) -> None:
        runs.append(job.receive_count)
        started.set()
        finish.wait(20)

    worker = Worker(client, "cut", handler, wait=0.5)
    thread = threading.Thread(target=worker.run, kwargs={"signals": ()})
    thread.start()
    try:
        assert started.wait(10)
        with psycopg.connect(clean, autocommit=True) as o:
            ((cid, pid),) = o.execute("SELECT id, pid FROM queue_pg.consumers").fetchall()
            o.execute("SELECT pg_terminate_backend(%s)", (pid,))
            wait_until("registered again", lambda: o.execute(
                "SELECT pid <> %s AND lost_at IS NULL FROM queue_pg.consumers WHERE id = %s",
                (pid, cid)).fetchone() == (True,), timeout=10)
            time.sleep(3.5)  # past the grace period, with reaps on the new connection
            assert client.reap_consumers() == 0
            assert o.execute("SELECT count(*), max(receive_count), bool_and(consumer_id = %s)"
                             " FROM queue_pg.messages", (cid,)).fetchone() == (1, 1, True)
        assert worker._pulse.consumer == cid
        finish.set()
        wait_until("deleted", lambda: client.stats("cut").in_flight == 0)
    finally:
        finish.set()
        worker.stop()
        thread.join(10)
    assert runs == [1]


def test_a_worker_without_crash_detection_names_no_consumer(client: queue_pg.Client) -> None:
    client.create_queue("nd", visibility_timeout=30)
    client.send("nd", {"n": 1})
    seen: list[Any] = []

    def handler(job: Job) -> None:
        seen.append(job.id)
        worker.stop()

    worker = Worker(client, "nd", handler, wait=0.5, detect_crashes=False)
    worker.run()
    assert seen and client.reap_consumers() == 0
    with psycopg.connect(client._dsn or "", autocommit=True) as o:
        assert o.execute("SELECT count(*) FROM queue_pg.consumers").fetchone() == (0,)


def test_configuration_errors_stop_the_worker(client: queue_pg.Client) -> None:
    with pytest.raises(queue_pg.QueueNotFound):
        Worker(client, "missing", lambda job: None).run()
    client.create_queue("short", visibility_timeout=1, max_lease=2)
    worker = Worker(client, "short", lambda job: None, visibility_timeout=5, wait=0.1)
    with pytest.raises(queue_pg.InvalidParameter, match="max_lease"):
        worker.run()
    # receive's range is SQL's rule, not the worker's: SQL refuses it and the worker stops
    empty = Worker(client, "short", lambda job: None, batch_size=0, wait=0.1)
    with pytest.raises(queue_pg.InvalidParameter, match="max_messages = 0"):
        empty.run()


def test_enqueue_joins_the_callers_transaction(client: queue_pg.Client, clean: str) -> None:
    client.create_queue(Q)
    with psycopg.connect(clean) as conn:
        worker_app.noop.enqueue("rolled back", conn=conn)
        conn.rollback()
        mid = worker_app.noop.enqueue("kept", conn=conn)
        worker_app.noop.enqueue_in(60, "later", conn=conn)
        assert client.stats(Q).visible == 0  # not committed yet
        conn.commit()
    stats = client.stats(Q)
    assert (stats.visible, stats.delayed) == (1, 1)
    (m,) = client.receive(Q)
    assert m.id == mid
    assert m.body == {"task": "noop", "args": ["kept"], "kwargs": {}}
    assert m.attributes == {"type": "noop"}


# --- dead-lettering, error records, checkpoints (the engine calls the worker relies on) -------------


def test_raw_messages_record_errors_in_attributes_and_reject_dead_letters(
    client: queue_pg.Client,
) -> None:
    client.create_queue("r-dlq")
    client.create_queue("r", visibility_timeout=5, dead_letter_queue="r-dlq", max_receive_count=5)
    seen: list[tuple[int, dict[str, Any] | None]] = []

    def handler(job: Job) -> None:
        seen.append((job.receive_count, job.message.attributes))
        if job.body["kind"] == "poison":
            raise Reject("cannot ever parse this")
        if job.receive_count == 1:
            raise KeyError("not yet")

    worker = Worker(client, "r", handler, concurrency=2, wait=0.5, backoff=Backoff(base=0.05))
    t = _run_in_thread(worker)
    client.send("r", {"kind": "flaky"}, attributes={"type": "raw"})
    poison = client.send("r", {"kind": "poison"})
    wait_until("flaky done, poison rejected",
               lambda: worker.stats.succeeded == 1 and worker.stats.rejected == 1)
    worker.stop()
    t.join(5)
    (second,) = [a for n, a in seen if n == 2]
    assert second is not None and second["type"] == "raw"
    assert (second["error"]["type"], second["error"]["message"]) == ("builtins.KeyError", "'not yet'")
    (dead,) = client.peek("r-dlq")
    assert dead.id == poison and dead.body == {"kind": "poison"} and dead.receive_count == 1
    assert dead.attributes is not None
    assert dead.attributes["dead_letter_reason"] == "cannot ever parse this"
    assert dead.attributes["error"]["type"] == "queue_pg.jobs.job.Reject"
    stats = client.stats("r")
    assert (stats.visible, stats.in_flight, stats.lease_expiries) == (0, 0, 0)


async def test_async_worker_dead_letters_unknown_tasks_and_used_up_retries(clean: str) -> None:
    reg = Registry()

    @queue_pg.task(queue="at", name="flaky", retries=1, backoff=Backoff(base=0.05), registry=reg)
    async def flaky(n: int) -> None:
        raise ValueError(f"bad {n}")

    async with queue_pg.AsyncClient(clean, sweep_interval=None) as client:
        await client.create_queue("at-dlq")
        await client.create_queue("at", visibility_timeout=5, dead_letter_queue="at-dlq",
                                  max_receive_count=10)
        fid = await client.send("at", flaky.envelope([7], {}), attributes={"type": "flaky"})
        uid = await client.send("at", {"task": "gone", "args": [], "kwargs": {}})
        worker = AsyncWorker(client, "at", reg, concurrency=2, wait=0.5)
        run = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 10
        while worker.stats.rejected < 2:
            assert time.monotonic() < deadline, worker.stats
            await asyncio.sleep(0.02)
        worker.stop()
        await asyncio.wait_for(run, 5)
        dead = {m.id: m for m in await client.peek("at-dlq", 10)}
        assert sorted(dead) == sorted([fid, uid])
        f = dead[fid]
        assert f.attributes is not None
        assert f.attributes["dead_letter_reason"] == (
            "failed 2 times (retries = 1), last: ValueError: bad 7")
        assert (f.attributes["error"]["message"], f.attributes["error"]["attempt"]) == ("bad 7", 2)
        assert f.attributes["type"] == "flaky" and f.body == flaky.envelope([7], {})
        u = dead[uid]
        assert u.attributes is not None
        assert u.attributes["dead_letter_reason"].startswith("unknown task 'gone'")
        stats = await client.stats("at")
        assert (stats.visible, stats.in_flight, stats.lease_expiries) == (0, 0, 0)


def test_checkpoint_leaves_the_lease_as_it_is(client: queue_pg.Client, clean: str) -> None:
    """A checkpoint saves the body only: it neither renews the lease nor ends it, so it works
    even when renewing would pass max_lease (a lease taken for all of max_lease here)."""
    client.create_queue("c", visibility_timeout=5, max_lease=5)
    client.send("c", {"task": "x"}, attributes={"type": "x"})
    (m,) = client.receive("c")  # leased for max_lease: no renewal is possible at all

    def lease_end() -> Any:
        with psycopg.connect(clean, autocommit=True) as c:
            row = c.execute("SELECT visible_at FROM queue_pg.messages WHERE id = %s", [m.id]).fetchone()
        assert row is not None
        return row[0]

    before = lease_end()
    job = Job(client, m, 5.0)
    job.checkpoint({"next": 1})
    job.checkpoint({"next": 2})
    assert job.state == {"next": 2} and not job.cancelled
    assert lease_end() == before
    assert client.stats("c").in_flight == 1
    client.change_visibility("c", m.receipt or "", 0)
    (again,) = client.receive("c")
    assert again.body == {"task": "x", "state": {"next": 2}}
    assert again.attributes == {"type": "x"}


def test_checkpointing_handler_stops_at_max_lease_and_resumes(client: queue_pg.Client) -> None:
    """A handler that only checkpoints (never checks job.cancelled) still stops once max_lease
    stops the heartbeat: its next checkpoint saves, then raises LeaseLost; the message is
    released and the next delivery goes on from the saved step. Every step runs once."""
    client.create_queue("ml", visibility_timeout=0.3, max_lease=1)
    steps: list[tuple[int, int]] = []
    starts: list[tuple[int, int]] = []

    def handler(job: Job) -> None:
        first = (job.state or {}).get("i", 0)
        starts.append((job.receive_count, first))
        for i in range(first, 25):
            time.sleep(0.05)
            steps.append((job.receive_count, i))
            job.checkpoint({"i": i + 1})

    worker = Worker(client, "ml", handler, concurrency=1, wait=0.5)
    t = _run_in_thread(worker)
    client.send("ml", {"job": 1})
    wait_until("all steps done", lambda: worker.stats.succeeded == 1, timeout=15)
    worker.stop()
    t.join(5)
    assert [i for _, i in steps] == list(range(25))  # none skipped, none repeated
    assert len(starts) >= 2 and starts[0] == (1, 0)
    for (n, _), (n2, first2) in itertools.pairwise(starts):
        assert n2 == n + 1 and first2 == max(i for a, i in steps if a == n) + 1
    assert worker.stats.released == len(starts) - 1
    stats = client.stats("ml")
    assert (stats.visible, stats.in_flight, stats.lease_expiries) == (0, 0, 0)


def test_an_undecodable_body_is_dead_lettered_and_its_batch_runs(
    client: queue_pg.Client, clean: str
) -> None:
    from client.helpers import insert_poison

    client.create_queue("pois-dlq")
    client.create_queue("pois", dead_letter_queue="pois-dlq", max_receive_count=5)
    ids = insert_poison(clean, "pois")
    seen: list[Any] = []
    worker = Worker(client, "pois", lambda job: seen.append(job.body), concurrency=4,
                    batch_size=4, wait=0.2)
    t = _run_in_thread(worker)
    wait_until("all settled", lambda: worker.stats.succeeded + worker.stats.rejected == 4)
    worker.stop()
    t.join(5)
    assert sorted(map(str, seen)) == sorted(["fine", "{'a': 1}"])  # the handler never saw poison
    dead = {m.id: m for m in client.peek("pois-dlq", 10)}
    assert sorted(dead) == sorted([ids["deep"], ids["huge"]])
    for m in dead.values():
        assert m.attributes["dead_letter_reason"].startswith("undecodable body: ")


def test_a_running_worker_follows_the_queues_visibility_timeout(
    client: queue_pg.Client,
) -> None:
    """Leases come from the queue's visibility_timeout, read again every LEASE_REFRESH: an
    alter_queue reaches a running worker without a restart."""
    from queue_pg.jobs.worker_loop import LEASE_REFRESH

    client.create_queue("vt", visibility_timeout=30)
    leases: list[float] = []
    worker = Worker(client, "vt", lambda job: leases.append(job.lease), wait=0.2)
    t = _run_in_thread(worker)
    client.send("vt", 1)
    wait_until("first", lambda: len(leases) == 1)
    client.alter_queue("vt", visibility_timeout=7)
    time.sleep(LEASE_REFRESH + 0.5)
    client.send("vt", 2)
    wait_until("second", lambda: len(leases) == 2)
    worker.stop()
    t.join(5)
    assert leases == [30, 7]


def test_a_fifo_queue_runs_each_group_in_send_order(client: queue_pg.Client) -> None:
    """A FIFO receive may hand several messages of one group; the worker, which runs a batch at
    once, takes one message a receive there, so a group's jobs run one after another, in order,
    while groups run side by side."""
    client.create_queue("wf", fifo=True)
    groups = ["a", "b", "c"]
    client.send_batch("wf", [{"g": g, "i": i} for i in range(8) for g in groups],
                      group=[g for _ in range(8) for g in groups])
    ran: list[tuple[str, int]] = []
    running: dict[str, int] = {}
    overlap: list[str] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        g = job.body["g"]
        with lock:
            running[g] = running.get(g, 0) + 1
            if running[g] > 1:
                overlap.append(g)
        time.sleep(0.02 * (1 + job.body["i"] % 3))  # later jobs sometimes quicker
        with lock:
            running[g] -= 1
            ran.append((g, job.body["i"]))

    worker = Worker(client, "wf", handler, concurrency=4, batch_size=4, wait=0.2)
    t = _run_in_thread(worker)
    wait_until("every job", lambda: len(ran) == 24)
    worker.stop()
    t.join(10)
    assert overlap == []
    for g in groups:
        assert [i for h, i in ran if h == g] == list(range(8))
