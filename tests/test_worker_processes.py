"""The process pool (``Worker(..., pool="processes")``, ``AsyncWorker(..., pool="processes")``,
``queue-pg worker --pool processes``): real child processes, killed with SIGKILL at a task's hard
limit, on a revoke with terminate, or dying by themselves; each such attempt fails (retried, then
dead-lettered) and the child is replaced, and the pool goes on serving. Each test runs with both
workers (the ``kind`` fixture). Tasks are in tests/pool_app.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

import queue_pg
from queue_pg.jobs.aio_worker import AsyncWorker
from queue_pg.jobs.pool import hard_limit
from queue_pg.jobs.worker import Worker
from tests import pool_app
from tests.procs import ended
from tests.test_advice import add_history
from tests.test_worker import wait_until

ROOT = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.fixture
def pool_db(clean: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("POOL_APP_DSN", clean)
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS pool_runs")
        c.execute(pool_app.RUNS_DDL)
    with queue_pg.Client(clean, sweep_interval=None) as c:
        c.create_queue("pool-dlq")
        c.create_queue("pool", dead_letter_queue="pool-dlq", max_receive_count=10,
                       visibility_timeout=3)
    return clean


def runs(dsn: str, key: str | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(
            "SELECT task, key, attempt, pid, event FROM pool_runs"
            " WHERE %(k)s::text IS NULL OR key = %(k)s ORDER BY n", {"k": key}).fetchall()


KINDS = ("threads", "asyncio")


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Which worker runs the pool: Worker (its handler threads) or AsyncWorker (its tasks)."""
    return str(request.param)


class Running:
    """A process-pool worker in a thread of this test (``kind`` "threads": a Worker;
    "asyncio": an AsyncWorker in an event loop of that thread); stopped at the end."""

    def __init__(self, dsn: str, kind: str, concurrency: int = 2, **options: Any) -> None:
        self.kind = kind
        self.options = {"pool": "processes", "modules": ["tests.pool_app"],
                        "concurrency": concurrency, "wait": 0.2, **options}
        self.worker: Worker | AsyncWorker | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.dsn = dsn

    def _run(self) -> None:
        try:
            if self.kind == "threads":
                with queue_pg.Client(self.dsn, sweep_interval=None) as client:
                    self.worker = Worker(client, ["pool"], pool_app.REG, **self.options)
                    self.worker.run(signals=())
            else:
                asyncio.run(self._run_async())
        except BaseException as exc:
            self.failure = exc
            raise

    async def _run_async(self) -> None:
        async with queue_pg.AsyncClient(self.dsn, sweep_interval=None) as client:
            self.loop = asyncio.get_running_loop()
            self.worker = AsyncWorker(client, ["pool"], pool_app.REG, **self.options)
            await self.worker.run(signals=())

    def __enter__(self) -> Running:
        self.thread.start()
        wait_until("the worker", lambda: self.worker is not None or self.failure)
        return self

    def children(self) -> list[int]:
        assert self.worker is not None
        return [s.pid for s in self.worker._slots if s.pid is not None]

    def __exit__(self, *exc: object) -> None:
        worker = self.worker
        if isinstance(worker, AsyncWorker):
            assert self.loop is not None
            self.loop.call_soon_threadsafe(worker.stop)
        elif worker is not None:
            worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the worker did not stop"
        assert self.failure is None, self.failure


def dead(client: queue_pg.Client) -> dict[int, str]:
    return {m.id: (m.attributes or {}).get("dead_letter_reason", "")
            for m in client.peek("pool-dlq", 10)}


def test_a_task_past_its_hard_limit_is_killed_retried_and_dead_lettered(
    pool_db: str, kind: str
) -> None:
    assert hard_limit(pool_app.forever) == 1.0
    with Running(pool_db, kind) as w, queue_pg.Client(pool_db, sweep_interval=None) as c:
        wait_until("the children", lambda: len(w.children()) == 2)
        first_children = set(w.children())
        pool_app.forever.send(("f",), client=c)
        got = wait_until("dead-lettered", lambda: dead(c), timeout=60)
        starts = runs(pool_db, "f")
        # retries=1: two attempts, each killed at its hard limit, then the dead-letter queue
        assert [(r[2], r[4]) for r in starts] == [(1, "start"), (2, "start")]
        killed = {r[3] for r in starts}
        assert first_children & killed  # the first child of this pool was killed
        for pid in killed:
            wait_until(f"child {pid} gone", lambda pid=pid: not alive(pid))
        [reason] = got.values()
        assert "hard time limit of 1s" in reason and "killed" in reason
        # replaced: two live children again, none of the killed ones, and they serve
        wait_until("replacements", lambda: len(w.children()) == 2
                   and not killed & set(w.children()))
        r = pool_app.double.send(("after", 21), client=c)
        assert r.get(timeout=30, client=c) == 42


def test_the_soft_limit_raises_inside_the_task_in_a_c_call(pool_db: str, kind: str) -> None:
    with Running(pool_db, kind, concurrency=1) as w, queue_pg.Client(
            pool_db, sweep_interval=None) as c:
        pool_app.soft.send(("s",), client=c)
        got = wait_until("dead-lettered", lambda: dead(c), timeout=60)
        assert [r[4] for r in runs(pool_db, "s")] == ["start", "soft limit"]
        [reason] = got.values()
        assert "TaskTimeout" in reason
        # the soft limit did not cost the child: the same process serves the next job
        pid = runs(pool_db, "s")[0][3]
        assert w.children() == [pid] and alive(pid)


@pytest.mark.parametrize("name", ["exit", "self_kill"])
def test_a_child_that_dies_by_itself_is_a_failure_and_replaced(
    pool_db: str, kind: str, name: str
) -> None:
    the_task = pool_app.REG.tasks[f"pool.{name}"]
    with Running(pool_db, kind, concurrency=1) as w, queue_pg.Client(
            pool_db, sweep_interval=None) as c:
        msg = the_task.send(("d",), client=c)
        got = wait_until("dead-lettered", lambda: dead(c), timeout=60)
        attempts = (the_task.retries or 0) + 1
        assert [r[2] for r in runs(pool_db, "d")] == list(range(1, attempts + 1))
        assert list(got) == [int(msg)]
        assert "died while it ran" in got[int(msg)]
        assert ("exit code 3" if name == "exit" else "killed by SIGKILL") in got[int(msg)]
        dead_pids = {r[3] for r in runs(pool_db, "d")}
        wait_until("a replacement", lambda: w.children() and not dead_pids & set(w.children()))
        assert pool_app.double.send(("after", 2), client=c).get(timeout=30, client=c) == 4


def test_a_child_killed_from_outside_fails_its_job_and_the_pool_goes_on(
    pool_db: str, kind: str
) -> None:
    with Running(pool_db, kind, concurrency=1) as w, queue_pg.Client(
            pool_db, sweep_interval=None) as c:
        msg = pool_app.sleep.send(("k", 60), client=c)
        [start] = wait_until("the run", lambda: runs(pool_db, "k"))
        os.kill(start[3], signal.SIGKILL)
        got = wait_until("dead-lettered", lambda: dead(c), timeout=60)
        assert "killed by SIGKILL" in got[int(msg)]
        assert pool_app.double.send(("after", 5), client=c).get(timeout=30, client=c) == 10
        assert start[3] not in w.children()


@pytest.mark.parametrize("task_name", ["resume", "aresume"])
def test_a_checkpoint_from_a_child_survives_its_death(
    pool_db: str, kind: str, task_name: str
) -> None:
    """A plain task and an ``async def`` one (which awaits its checkpoint) alike."""
    with Running(pool_db, kind, concurrency=1), queue_pg.Client(
            pool_db, sweep_interval=None) as c:
        pool_app.REG.tasks[f"pool.{task_name}"].send(("r",), client=c)
        wait_until("the second attempt", lambda: len(runs(pool_db, "r")) == 3)
        wait_until("done", lambda: not c.peek("pool", 1) and not dead(c))
    with psycopg.connect(pool_db, autocommit=True) as conn:
        states = conn.execute("SELECT attempt, event, data->'state' FROM pool_runs"
                              " WHERE key = 'r' ORDER BY n").fetchall()
    assert states == [(1, "resume", {}), (1, "saved", None), (2, "resume", {"step": 1})]


def test_an_error_in_the_child_keeps_its_type_and_traceback(pool_db: str, kind: str) -> None:
    with Running(pool_db, kind, concurrency=1), queue_pg.Client(
            pool_db, sweep_interval=None) as c:
        pool_app.boom.send(("b",), client=c)
        wait_until("dead-lettered", lambda: dead(c), timeout=60)
        [m] = c.peek("pool-dlq", 1)
        error = (m.attributes or {})["error"]
        assert error["type"] == "builtins.KeyError"
        assert "no such thing: b" in error["message"]
        assert "pool_app.py" in error["traceback"] and "in boom" in error["traceback"]


def test_a_revoked_running_job_is_killed(pool_db: str, kind: str) -> None:
    with Running(pool_db, kind, concurrency=1, visibility_timeout=1.5) as w, queue_pg.Client(
            pool_db, sweep_interval=None) as c:
        msg = pool_app.sleep.send(("v", 60), client=c)
        [start] = wait_until("the run", lambda: runs(pool_db, "v"))
        assert not pool_app.sleep.revoke(msg, client=c)  # running: not without terminate
        assert pool_app.sleep.revoke(msg, client=c, terminate=True)
        wait_until("the child killed", lambda: not alive(start[3]), timeout=10)
        assert [r[4] for r in runs(pool_db, "v")] == ["start"]  # never "done"
        assert not c.peek("pool", 1) and not dead(c)
        assert pool_app.double.send(("after", 1), client=c).get(timeout=30, client=c) == 2
        assert start[3] not in w.children()


def test_a_child_past_its_types_hung_work_limit_is_killed_and_its_slot_serves(
    pool_db: str, kind: str
) -> None:
    """A 'per_type' queue where pool.hang's lease is 3 s: its heartbeat is refused at 12 s
    (docs/timeouts.md, "Hung work"). The hung child is killed and the attempt failed, so the
    one slot runs the retry; a child left running would hold the slot for good."""
    with psycopg.connect(pool_db, autocommit=True) as conn:
        add_history(conn, "pool", [0.5] * 40, type="pool.hang")
    with queue_pg.Client(pool_db, sweep_interval=None) as c:
        c.alter_queue("pool", max_lease=3600)
        c.alter_tuning("pool", lease_policy="per_type")
        [limit] = c.hung_limits("pool")
        assert (limit.type, limit.type_lease, limit.stopped_after) == ("pool.hang", 3.0, 12.0)
    with Running(pool_db, kind, concurrency=1, visibility_timeout=3.0) as w, queue_pg.Client(
            pool_db, sweep_interval=None) as c:
        pool_app.hang.send(("h",), client=c)
        [first] = wait_until("the first run", lambda: runs(pool_db, "h"))
        wait_until("the retry, done", lambda: [r[2:] for r in runs(pool_db, "h")][1:] == [
            (2, w.children()[0] if w.children() else -1, "start"),
            (2, w.children()[0] if w.children() else -1, "done")], timeout=60)
        assert not alive(first[3]) and first[3] not in w.children()


def test_children_run_concurrently(pool_db: str, kind: str) -> None:
    with Running(pool_db, kind, concurrency=3) as w, queue_pg.Client(
            pool_db, sweep_interval=None) as c:
        wait_until("the children", lambda: len(w.children()) == 3, timeout=60)
        for i in range(6):
            pool_app.sleep.send((f"c{i}", 1.0), client=c)
        wait_until("all done", lambda: sum(r[4] == "done" for r in runs(pool_db)) == 6,
                   timeout=60)
        rows = runs(pool_db)
        pids = {r[3] for r in rows}
        assert pids == set(w.children())  # each job in one of the three children
        # at some moment three ran at once: starts and ends interleave
        with psycopg.connect(pool_db, autocommit=True) as conn:
            most = conn.execute(
                "SELECT max(n) FROM (SELECT count(*) OVER (ORDER BY at) -"
                " 2 * count(*) FILTER (WHERE event = 'done') OVER (ORDER BY at) AS n"
                " FROM pool_runs) x").fetchone()
        assert most is not None and most[0] == 3


def test_cli_pool_processes_kills_at_the_hard_limit(pool_db: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QUEUE_PG_DSN": pool_db}
    with queue_pg.Client(pool_db, sweep_interval=None) as c:
        pool_app.forever.send(("cli",), client=c)
        pool_app.double.send(("cli2", 4), client=c)
        proc = subprocess.Popen(
            [sys.executable, "-m", "queue_pg.jobs.worker_cli", "tests.pool_app", "--queue", "pool",
             "--pool", "processes", "--concurrency", "2", "--wait", "0.2", "--grace-period",
             "1"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        with ended(proc):
            wait_until("dead-lettered", lambda: dead(c), timeout=60)
            wait_until("double ran", lambda: runs(pool_db, "cli2"))
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "a child process each" in err
    assert [r[2] for r in runs(pool_db, "cli")] == [1, 2]
    assert "hard time limit" in err
