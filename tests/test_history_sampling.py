"""History of busy queues is a weighted sample (revision 0022, sql/api/57_rollups.sql): the
advice drawn from a sample is as good as from every row, and sweep sets the rate."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row, tuple_row

from queue_pg import Client
from tests.test_advice import add_history

N = 20_000
EVERY = 10


def workload() -> Counter[float]:
    """N processing times (lognormal, median 2 s), in 2-digit steps so that each step is one
    delete_batch: the same times for both queues."""
    rng = random.Random(7)
    return Counter(float(f"{rng.lognormvariate(0.7, 0.6):.2g}") for _ in range(N))


def run(conn: psycopg.Connection[Any], queue: str, times: Counter[float]) -> None:
    """Each time's messages received, then deleted that many seconds later (the session's clock
    moved by the test hook queue_pg.time_offset, so nothing sleeps)."""
    for seconds, count in sorted(times.items()):
        left = count
        while left:
            rows = conn.execute("SELECT receipt FROM queue_pg.receive(%s, %s)",
                                (queue, min(left, 1000))).fetchall()
            left -= len(rows)
            conn.execute("SELECT set_config('queue_pg.time_offset', %s, false)", (f"{seconds} seconds",))
            conn.execute("SELECT count(*) FROM queue_pg.delete_batch(%s, %s)",
                         (queue, [r[0] for r in rows]))
            conn.execute("SELECT set_config('queue_pg.time_offset', '', false)")


def test_advice_from_a_sample_is_within_its_stated_error(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    times = workload()
    for name in ("full", "sampled"):
        client.create_queue(name, visibility_timeout=3600)
        for start in range(0, N, 1000):
            client.send_batch(name, list(range(start, start + 1000)))
    # what sweep sets for a queue-type finishing more than 10 a second (here by hand: the rate
    # is the test's, not the clock's)
    conn.execute("INSERT INTO queue_pg.history_sampling SELECT id, '', %s FROM queue_pg.queues"
                 " WHERE name = 'sampled'", (EVERY,))
    conn.execute("SELECT setseed(0.25)")  # which rows the sample keeps: the same each run
    run(conn, "full", times)
    run(conn, "sampled", times)

    rows = {r[0]: r[1:] for r in conn.execute(
        "SELECT queue, count(*), sum(weight) FROM queue_pg.message_history GROUP BY queue")}
    assert rows["full"] == (N, N)
    kept, weighted = rows["sampled"]
    assert 0.08 * N < kept < 0.12 * N and weighted == kept * EVERY  # a tenth, each standing for 10

    # the window reaches past now: the deletes ran on clocks moved up to a minute ahead
    conn.row_factory = namedtuple_row
    advice = {a.queue: a for a in conn.execute(
        "SELECT * FROM queue_pg.timeout_advice(now() - interval '1 hour', now() + interval '1 hour')"
        " WHERE scope = 'queue'")}
    conn.row_factory = tuple_row
    full, sampled = advice["full"], advice["sampled"]
    assert full.samples == N and abs(sampled.samples - N) <= 0.05 * N
    # the stated error at 2,000 rows kept (docs/timeouts.md): p50 within 5%, p95 8%, p99 12%, the
    # recommended timeout (ceil(6 x p99)) within 12% plus the rounding second
    assert full.p50 is not None and sampled.p50 is not None
    assert abs(sampled.p50 - full.p50) <= 0.05 * full.p50
    assert full.p95 is not None and sampled.p95 is not None
    assert abs(sampled.p95 - full.p95) <= 0.08 * full.p95
    assert full.p99 is not None and sampled.p99 is not None
    assert abs(sampled.p99 - full.p99) <= 0.12 * full.p99
    assert full.recommended_timeout is not None and sampled.recommended_timeout is not None
    assert abs(sampled.recommended_timeout - full.recommended_timeout) <= (
        0.12 * full.recommended_timeout + 1)
    # the rate figures scale too: no lease lapsed, no message dead-lettered
    assert sampled.expiry_rate == 0 and sampled.dead_letter_rate == 0

    # the same through the rollups (the histograms count each row weight times)
    conn.execute("SELECT queue_pg._rollup_history(clock_timestamp() + interval '3 minutes', 100000)")
    rolled = {(r[0]): r[1:] for r in conn.execute(
        "SELECT q.name, sum(r.messages), sum(r.receives) FROM queue_pg.history_rollups r"
        " JOIN queue_pg.queues q ON q.id = r.queue_id WHERE r.minutes = 1 GROUP BY q.name")}
    assert rolled["full"] == (N, N)
    assert abs(rolled["sampled"][0] - N) <= 0.05 * N


def test_weight_one_figures_are_percentile_cont(client: Client, conn: psycopg.Connection[Any]) -> None:
    """With every row kept the exact figures are those of percentile_cont, as before."""
    client.create_queue("q")
    works = [0.1 * i for i in range(1, 101)]
    add_history(conn, "q", works)
    got = conn.execute(
        "SELECT p50, p95, p99, max FROM queue_pg._history_figures_exact(now() - interval '1 hour',"
        " now() + interval '1 hour', NULL) WHERE scope = 'queue'").fetchone()
    want = conn.execute(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY w), percentile_cont(0.95) WITHIN GROUP"
        " (ORDER BY w), percentile_cont(0.99) WITHIN GROUP (ORDER BY w), max(w)"
        " FROM unnest(%s::float8[]) w", (works,)).fetchone()
    assert got is not None and want is not None
    assert all(abs(a - b) < 1e-9 for a, b in zip(got, want, strict=True)), (got, want)


def test_sweep_samples_busy_queue_types_and_keeps_slow_ones_whole(
    client: Client, conn: psycopg.Connection[Any]
) -> None:
    client.create_queue("busy")
    add_history(conn, "busy", [0.5] * 6000, type="a")  # 100 a second over the last minute
    add_history(conn, "busy", [0.5] * 300, type="b")  # 5 a second: every row kept
    add_history(conn, "busy", [0.5] * 1500)  # no type: 25 a second
    client.sweep()
    assert dict(conn.execute(
        "SELECT type, every FROM queue_pg.history_sampling ORDER BY type").fetchall()) == {
        "": 3, "a": 10}
    # a message of a sampled type: kept one in ten, weight 10; of a slow type: always, weight 1
    for _ in range(200):
        client.send("busy", {}, attributes={"type": "a"})
    client.send("busy", {}, attributes={"type": "b"})
    got = client.receive("busy", 201)
    for start in range(0, len(got), 50):
        client.delete_batch("busy", [m.receipt or "" for m in got[start:start + 50]])
    kept = {r[0]: r[1:] for r in conn.execute(
        "SELECT type, count(*), min(weight), max(weight) FROM queue_pg.message_history"
        " WHERE message_id > 0 GROUP BY type")}
    assert kept["b"] == (1, 1, 1)
    n, lo, hi = kept["a"]
    assert 5 <= n <= 50 and lo == hi == 10, kept
    # the rate falls: the queue-type is kept whole again
    conn.execute("DELETE FROM queue_pg.message_history")
    client.sweep()
    assert conn.execute("SELECT count(*) FROM queue_pg.history_sampling").fetchone() == (0,)
