"""Per-task limits the database enforces across workers, checked against what ran and against
the history: at most N runs of a task at once (without holding back other tasks of its queue),
at most R starts a second on a queue; queues without limits are untouched."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

import queue_pg
from queue_pg.declare import limited_queue
from queue_pg.errors import InvalidParameter
from queue_pg.tasks import Registry, Task


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
    with pytest.raises(InvalidParameter, match="per_second = 0 is out of range"):
        client.set_rate_limit("rated", 0)
