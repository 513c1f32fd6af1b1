"""The history's rollups by minute and hour (sql/api/57_rollups.sql): the figures read from them
agree with the exact ones (counts, rates and maxima exactly, percentiles within the buckets'
1%), for any window, and sweep keeps them with bounded work per call."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import queue_pg

Conn = psycopg.Connection[Any]

EXACT = ("queue", "scope", "type", "messages", "samples", "max", "wait_samples", "wait_max",
         "expiry_rate", "dead_letter_rate", "redeliveries")
QUANTILES = ("p50", "p95", "p99", "wait_p50", "wait_p95", "wait_p99")


def add_history(conn: Conn, queue: str, rows: int, *, start: str, span: str, seed: float) -> None:
    """``rows`` history rows finished evenly over ``span`` from ``start`` (SQL expressions):
    types fast (log-normal around 50 ms), slow (around 20 s) and untyped; some dead-lettered,
    some redelivered after a lapsed lease."""
    conn.execute("SELECT setseed(%s)", [seed])
    conn.execute(
        "INSERT INTO queue_pg.message_history (queue_id, queue, message_id, outcome, enqueued_at,"
        " first_received_at, last_received_at, finished_at, receive_count, lease_expiries, type)"
        " SELECT q.id, q.name, g, CASE WHEN g %% 37 = 0 THEN 'dead_lettered' ELSE 'deleted' END,"
        "        f - make_interval(secs => w + 3 * random()), f - make_interval(secs => w + (g %% 5 = 0)::int),"
        "        f - make_interval(secs => w), f, 1 + (g %% 5 = 0)::int, (g %% 5 = 0)::int,"
        "        CASE g %% 10 WHEN 0 THEN 'slow' WHEN 1 THEN NULL ELSE 'fast' END"
        " FROM queue_pg.queues q, generate_series(1, %(rows)s) g,"
        "      LATERAL (SELECT (" + start + ") + (" + span + ") * (g::float8 / %(rows)s) AS f,"
        "              CASE WHEN g %% 10 = 0 THEN 20 ELSE 0.05 END"
        "              * exp(0.7 * sqrt(-2 * ln(random())) * cos(2 * pi() * random())) AS w) x"
        " WHERE q.name = %(queue)s",
        {"rows": rows, "queue": queue},
    )


def roll_up(conn: Conn, budget: int = 1_000_000) -> None:
    while conn.execute("SELECT queue_pg._rollup_history(clock_timestamp(), %s)", [budget]).fetchone()[0]:  # type: ignore[index]
        pass


def figures(conn: Conn, fn: str, since: datetime, until: datetime) -> dict[Any, dict[str, Any]]:
    cur = conn.execute(f"SELECT * FROM queue_pg.{fn}(%s, %s, NULL)", [since, until])
    names = [d.name for d in cur.description or ()]
    rows = (dict(zip(names, r, strict=True)) for r in cur.fetchall())
    return {(r["queue"], r["scope"], r["type"]): r for r in rows}


def assert_agree(rolled: dict[Any, dict[str, Any]], exact: dict[Any, dict[str, Any]]) -> None:
    assert set(rolled) == set(exact)
    for key, e in exact.items():
        r = rolled[key]
        for col in EXACT:
            assert r[col] == (pytest.approx(e[col], rel=1e-12) if isinstance(e[col], float) else e[col]), (key, col)
        for col in QUANTILES:
            if e[col] is None:
                assert r[col] is None, (key, col)
            else:
                assert r[col] == pytest.approx(e[col], rel=0.00995), (key, col)


@pytest.fixture
def history(client: queue_pg.Client, conn: Conn) -> Iterator[datetime]:
    """Two queues with five hours of history up to a minute ago; their clock's now."""
    for name in ("alpha", "beta"):
        client.create_queue(name, max_lease=3600)
    add_history(conn, "alpha", 20_000, start="clock_timestamp() - interval '5 hours'",
                span="interval '299 minutes'", seed=0.1)
    add_history(conn, "beta", 3_000, start="clock_timestamp() - interval '5 hours'",
                span="interval '299 minutes'", seed=0.2)
    yield conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]


def state(conn: Conn) -> tuple[Any, ...]:
    row = conn.execute("SELECT lo, hi, hours_hi FROM queue_pg.history_rollup_state").fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.slow
def test_rolled_up_figures_agree_with_the_rows_for_any_window(conn: Conn, history: datetime) -> None:
    now = history
    windows = [
        (now - timedelta(hours=24), now),  # the views' window: hours, minutes and the tail
        (now - timedelta(hours=3, seconds=17.5), now - timedelta(minutes=13, seconds=-3)),  # ragged
        (now - timedelta(minutes=90, seconds=1), now - timedelta(minutes=80)),  # minutes only
    ]
    before = {w: figures(conn, "_history_figures_exact", *w) for w in windows}
    for w in windows:  # nothing rolled up yet: the figures are the rows'
        assert figures(conn, "_history_figures", *w) == before[w]
    roll_up(conn)
    lo, hi, hours_hi = state(conn)
    oldest = conn.execute("SELECT min(finished_at) FROM queue_pg.message_history").fetchone()[0]  # type: ignore[index]
    # the first run starts at the oldest row's minute (which the clock may have carried past now - 5 h)
    assert lo == oldest.replace(second=0, microsecond=0) and hi >= now - timedelta(minutes=2)
    assert hours_hi > hi - timedelta(hours=1)
    kinds = dict(conn.execute("SELECT minutes, count(*) FROM queue_pg.history_rollups GROUP BY 1").fetchall())
    assert kinds[60] >= 2 * 3 * 4 and kinds[1] >= 2 * 3 * 290  # hours and minutes of both queues
    for w in windows:
        assert_agree(figures(conn, "_history_figures", *w), before[w])
    # windows that end inside the last hour merged, and start inside the first one
    for w in ((hours_hi - timedelta(hours=2, seconds=17), hours_hi - timedelta(minutes=13, seconds=-3)),
              (lo + timedelta(minutes=61, seconds=5), hours_hi - timedelta(minutes=59, seconds=30))):
        assert_agree(figures(conn, "_history_figures", *w), figures(conn, "_history_figures_exact", *w))
    # rows that finish after the rollup are read from the history
    add_history(conn, "beta", 100, start="clock_timestamp() - interval '10 seconds'",
                span="interval '5 seconds'", seed=0.3)
    end = now + timedelta(minutes=5)
    assert_agree(figures(conn, "_history_figures", now - timedelta(hours=24), end),
                 figures(conn, "_history_figures_exact", now - timedelta(hours=24), end))


def test_the_advice_reads_the_rollups_and_stays_within_the_bucket_error(
    client: queue_pg.Client, conn: Conn, history: datetime
) -> None:
    exact = {(a.queue, a.scope, a.type): a for a in client.timeout_advice()}
    roll_up(conn)
    rolled = {(a.queue, a.scope, a.type): a for a in client.timeout_advice()}
    assert set(rolled) == set(exact)
    for key, e in exact.items():
        r = rolled[key]
        assert (r.samples, r.confidence, r.split_advised, r.max) == (e.samples, e.confidence, e.split_advised, e.max)
        assert r.p99 == pytest.approx(e.p99, rel=0.01)
        # ceil(6 x p99): within 1% and one rounding
        assert e.recommended_timeout is not None and r.recommended_timeout is not None
        assert abs(r.recommended_timeout - e.recommended_timeout) <= math.ceil(0.01 * e.recommended_timeout) + 1


def test_each_call_does_bounded_work_and_sweep_keeps_up(client: queue_pg.Client, conn: Conn) -> None:
    client.create_queue("dense")
    # 5 minutes of 400 rows each, ending three minutes ago
    add_history(conn, "dense", 2_000, start="queue_pg._floor_to(clock_timestamp(), 60) - interval '8 minutes'",
                span="interval '299 seconds'", seed=0.4)
    read = conn.execute("SELECT queue_pg._rollup_history(clock_timestamp(), 500)").fetchone()[0]  # type: ignore[index]
    assert 500 <= read <= 900  # stops after the minute that took it past the budget
    rolled = conn.execute("SELECT sum(messages) FROM queue_pg.history_rollups").fetchone()[0]  # type: ignore[index]
    assert rolled == read
    conn.execute("SELECT queue_pg.sweep()")  # sweep goes on from there, 20,000 rows a call
    assert conn.execute("SELECT sum(messages) FROM queue_pg.history_rollups WHERE minutes = 1").fetchone() == (2_000,)
    _, hi, _ = state(conn)
    assert hi == conn.execute("SELECT queue_pg._floor_to(clock_timestamp(), 60) - interval '1 minute'").fetchone()[0]  # type: ignore[index]
    # caught up: a call reads nothing and writes nothing
    assert conn.execute("SELECT queue_pg._rollup_history(clock_timestamp(), 500)").fetchone() == (0,)


def test_old_rollups_go_with_the_history_retention(client: queue_pg.Client, conn: Conn, history: datetime) -> None:
    roll_up(conn)
    client.alter_queue("beta", history_retention=3600)
    conn.execute("SELECT queue_pg._forget_rollups(clock_timestamp(), 100000)")
    oldest = dict(conn.execute(
        "SELECT q.name, min(r.start) FROM queue_pg.history_rollups r JOIN queue_pg.queues q ON q.id = r.queue_id"
        " GROUP BY q.name").fetchall())
    assert oldest["beta"] >= history - timedelta(hours=1, minutes=1)
    assert oldest["alpha"] <= history - timedelta(hours=4, minutes=59)
    client.drop_queue("alpha")  # its rollups go with it
    assert conn.execute(
        "SELECT DISTINCT q.name FROM queue_pg.history_rollups r LEFT JOIN queue_pg.queues q ON q.id = r.queue_id"
    ).fetchall() == [("beta",)]


def test_a_row_committed_after_its_minute_was_reached_is_rolled_up(
    client: queue_pg.Client, conn: Conn, clean: str
) -> None:
    """A consumer deletes a message inside a transaction it holds open while the roller, three
    minutes later by its clock, reaches that minute: the minute waits for the transaction."""
    client.create_queue("late")
    client.send("late", 1)
    [m] = client.receive("late")
    later = "clock_timestamp() + interval '3 minutes'"
    with psycopg.connect(clean) as other:  # a transaction, open until the commit below
        assert client.delete("late", m.receipt or "", conn=other)
        [(finished,)] = other.execute("SELECT finished_at FROM queue_pg.message_history").fetchall()
        conn.execute(f"SELECT queue_pg._rollup_history({later}, 1000000)")
        _, hi, _ = state(conn)
        assert hi is None or hi <= finished  # its minute is not rolled up while it may change
        other.commit()
    conn.execute(f"SELECT queue_pg._rollup_history({later}, 1000000)")
    _, hi, _ = state(conn)
    assert hi > finished
    assert conn.execute(
        "SELECT sum(messages) FROM queue_pg.history_rollups WHERE minutes = 1").fetchone() == (1,)
    # and the figures read from the rollups count it
    since = finished - timedelta(minutes=5)
    [row] = [r for r in figures(conn, "_history_figures", since, hi).values() if r["scope"] == "queue"]
    assert row["messages"] == 1 and row["samples"] == 1


def test_one_open_transaction_holds_the_rollups_back_only_up_to_the_cap(
    client: queue_pg.Client, conn: Conn, clean: str
) -> None:
    client.create_queue("stuck")
    add_history(conn, "stuck", 100, start="clock_timestamp() - interval '10 minutes'",
                span="interval '5 minutes'", seed=0.5)
    client.send("stuck", 1)
    [m] = client.receive("stuck")
    with psycopg.connect(clean) as other:
        assert client.delete("stuck", m.receipt or "", conn=other)
        conn.execute("SELECT queue_pg._rollup_history(clock_timestamp(), 1000000)")
        assert conn.execute("SELECT count(*) FROM queue_pg.history_rollups").fetchone() == (0,)
        # a call within the cap still waits; one past it rolls up, the writer still open
        conn.execute("SELECT queue_pg._rollup_history(clock_timestamp() + interval '9 minutes', 1000000)")
        assert conn.execute("SELECT count(*) FROM queue_pg.history_rollups").fetchone() == (0,)
        conn.execute("SELECT queue_pg._rollup_history(clock_timestamp() + interval '11 minutes', 1000000)")
        assert conn.execute(
            "SELECT sum(messages) FROM queue_pg.history_rollups WHERE minutes = 1").fetchone() == (100,)
        other.rollback()
