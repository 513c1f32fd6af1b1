"""The queue's figures and advice on histories with known answers, per-type leases, the tuner
(converges, does not flap), routing by type, and who sees which rows of the views."""

from __future__ import annotations

import itertools
import math
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql as psql

import queue_pg
from queue_pg.advice import TimeoutAdvice
from queue_pg.errors import AccessDenied, InvalidParameter, QueueAlreadyExists
from queue_pg.ops import cli

Conn = psycopg.Connection[Any]


def pcont(values: Sequence[float], f: float) -> float:
    """percentile_cont: linear interpolation between the closest ranks."""
    v = sorted(values)
    pos = f * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def add_history(
    conn: Conn,
    queue: str,
    works: Sequence[float],
    *,
    type: str | None = None,
    wait: float = 1.0,
    outcome: str = "deleted",
    receive_count: int = 1,
    lease_expiries: int = 0,
    finished: datetime | None = None,
) -> None:
    """History rows of messages whose final lease took ``works`` seconds each, finished just
    now (or at ``finished``), sent ``wait`` seconds before their first receive."""
    conn.execute(
        "INSERT INTO queue_pg.message_history (queue_id, queue, message_id, outcome, enqueued_at,"
        " first_received_at, last_received_at, finished_at, receive_count, lease_expiries, type)"
        " SELECT q.id, q.name, -row_number() OVER (), %(outcome)s,"
        "        f.at - make_interval(secs => w.work + %(wait)s), f.at - make_interval(secs => w.work),"
        "        f.at - make_interval(secs => w.work), f.at, %(rc)s, %(le)s, %(type)s"
        " FROM queue_pg.queues q, unnest(%(works)s::float8[]) w(work),"
        "      (SELECT coalesce(%(finished)s::timestamptz, clock_timestamp()) AS at) f"
        " WHERE q.name = %(queue)s",
        {"outcome": outcome, "wait": wait, "rc": receive_count, "le": lease_expiries,
         "type": type, "works": list(works), "finished": finished, "queue": queue},
    )


def advice_of(client: queue_pg.Client, queue: str) -> dict[str | None, TimeoutAdvice]:
    rows = client.timeout_advice(queue)
    return {("*" if r.scope == "queue" else r.type): r for r in rows}  # type: ignore[misc]


# --- the advice -------------------------------------------------------------------------------


def test_advice_and_processing_times_on_a_known_bimodal_history(
    client: queue_pg.Client, conn: Conn
) -> None:
    client.create_queue("mixed", visibility_timeout=30, max_lease=3600)
    fast = [0.05 + 0.001 * i for i in range(100)]  # 50 ms .. 149 ms
    slow = [20.0 + 0.2 * i for i in range(40)]  # 20 s .. 27.8 s
    untyped = [1.0, 2.0, 3.0]
    add_history(conn, "mixed", fast, type="fast", wait=0.5)
    add_history(conn, "mixed", slow, type="slow", wait=2.0)
    add_history(conn, "mixed", untyped, wait=4.0)
    # a dead-lettered message of type slow: no processing time, counts in the rates
    add_history(conn, "mixed", [100.0], type="slow", outcome="dead_lettered", receive_count=5,
                lease_expiries=4)

    advice = advice_of(client, "mixed")
    assert set(advice) == {"*", "fast", "slow", None}
    everything = fast + slow + untyped
    for key, works in (("fast", fast), ("slow", slow), (None, untyped), ("*", everything)):
        a = advice[key]
        assert a.samples == len(works)
        assert a.p50 == pytest.approx(pcont(works, 0.5), abs=1e-6)
        assert a.p95 == pytest.approx(pcont(works, 0.95), abs=1e-6)
        assert a.p99 == pytest.approx(pcont(works, 0.99), abs=1e-6)
        assert a.max == pytest.approx(max(works), abs=1e-6)
        rec = min(3600, max(1, math.ceil(6 * pcont(works, 0.99))))
        assert a.recommended_timeout == rec
        assert a.heartbeat_interval == pytest.approx(rec / 3)
        assert a.current_timeout == 30
    assert advice["fast"].recommended_timeout == 1  # 6 x 0.148 s, at least 1 s
    assert advice["slow"].recommended_timeout == math.ceil(6 * pcont(slow, 0.99))
    assert (advice["fast"].confidence, advice["slow"].confidence, advice[None].confidence,
            advice["*"].confidence) == ("medium", "medium", "low", "medium")
    # the rates: slow has 41 rows, 1 dead-lettered; 4 expiries in 45 receives
    assert advice["slow"].dead_letter_rate == pytest.approx(1 / 41)
    assert advice["slow"].expiry_rate == pytest.approx(4 / 45)
    assert advice["slow"].redeliveries == 4
    assert advice["fast"].expiry_rate == 0 and advice["fast"].redeliveries == 0
    # one timeout cannot fit both: the split is advised on every row of the queue
    spread = pcont(slow, 0.99) / pcont(fast, 0.99)
    for a in advice.values():
        assert a.split_advised is True
        assert a.p99_spread == pytest.approx(spread)

    times = {(t.scope, t.type): t for t in client.processing_times("mixed")}
    assert times[("type", "fast")].wait_p50 == pytest.approx(0.5, abs=1e-6)
    assert times[("type", "slow")].wait_max == pytest.approx(2.0, abs=1e-6)
    assert times[("type", "slow")].messages == 41 and times[("type", "slow")].samples == 40
    assert times[("queue", None)].wait_samples == 144


def test_no_split_for_one_type_or_thin_samples(client: queue_pg.Client, conn: Conn) -> None:
    client.create_queue("one")
    add_history(conn, "one", [0.1] * 50, type="a")
    add_history(conn, "one", [30.0] * 29, type="b")  # fewer than 30 samples: not evidence
    advice = advice_of(client, "one")
    assert advice["a"].split_advised is False and advice["a"].p99_spread is None
    assert advice["b"].confidence == "low"


def test_lapsing_leases_double_a_timeout_that_already_covers_the_runs_that_completed(
    client: queue_pg.Client, conn: Conn
) -> None:
    client.create_queue("lapsing", visibility_timeout=10, max_lease=15)
    # runs that completed took 1 s (6 x p99 = 6 <= 10), but 1 lease in 50 lapsed
    add_history(conn, "lapsing", [1.0] * 99, receive_count=1)
    add_history(conn, "lapsing", [1.0], receive_count=2, lease_expiries=2)
    a = advice_of(client, "lapsing")["*"]
    assert a.expiry_rate == pytest.approx(2 / 101)
    assert a.recommended_timeout == 15  # 2 x 10, within max_lease
    client.alter_queue("lapsing", visibility_timeout=5)  # now below 6 x p99: that figure wins
    assert advice_of(client, "lapsing")["*"].recommended_timeout == 6


def test_the_window_is_honoured_and_checked(client: queue_pg.Client, conn: Conn) -> None:
    client.create_queue("w")
    old = datetime.now().astimezone() - timedelta(days=3)
    add_history(conn, "w", [100.0] * 40, finished=old)
    add_history(conn, "w", [1.0] * 40)
    assert advice_of(client, "w")["*"].max == pytest.approx(1.0)
    since = old - timedelta(hours=1)
    [a] = [r for r in client.timeout_advice("w", since=since, until=old + timedelta(hours=1))
           if r.scope == "queue"]
    assert a.max == pytest.approx(100.0) and a.samples == 40
    with pytest.raises(InvalidParameter, match="since"):
        client.timeout_advice("w", since=old, until=old)


# --- queue_stats ------------------------------------------------------------------------------


def test_queue_stats_counts_and_flows(client: queue_pg.Client, conn: Conn) -> None:
    client.create_queue("s")
    client.sweep()  # a sample: the baseline of the flows
    client.send_batch("s", list(range(123)))
    client.send("s", 1, delay=60)
    got = client.receive("s", max_messages=10)
    client.delete_batch("s", [m.receipt or "" for m in got[:4]])
    client.delete("s", got[4].receipt or "")
    [h] = client.queue_health("s")
    assert (h.visible, h.in_flight, h.delayed) == (113, 5, 1)
    assert (h.sent, h.received, h.deleted) == (124, 10, 5)
    assert h.approximate is False and h.sent_1m is None  # no sample a minute old yet
    # a minute later (the owner's clock), the flows since the sample
    conn.execute("SET queue_pg.time_offset = '61 seconds'")
    row = conn.execute(
        "SELECT sent_1m, received_1m, deleted_1m, sent_1h FROM queue_pg.queue_stats"
        " WHERE queue = 's'"
    ).fetchone()
    assert row == (124, 10, 5, None)
    assert client.stats("s").visible == 113  # the old view's columns are still there


# --- per-type leases --------------------------------------------------------------------------


def test_per_type_leases_fit_each_type(client: queue_pg.Client, conn: Conn) -> None:
    client.create_queue("pt", visibility_timeout=30, max_lease=600)
    add_history(conn, "pt", [0.1] * 40, type="fast")
    add_history(conn, "pt", [10.0] * 40, type="slow")
    add_history(conn, "pt", [5.0] * 10, type="thin")
    s = client.alter_tuning("pt", lease_policy="per_type")
    assert s.lease_policy == "per_type" and s.auto_tune is False
    types = ["fast", "slow", "thin", None]
    client.send_batch("pt", [1, 2, 3, 4], attributes=[{"type": t} if t else {} for t in types])
    got = client.receive("pt", max_messages=4)
    leases = {
        (m.attributes or {}).get("type"): (m.visible_until - m.first_received_at).total_seconds()
        for m in got
        if m.visible_until and m.first_received_at
    }
    assert leases == pytest.approx({"fast": 1.0, "slow": 60.0, "thin": 30.0, None: 30.0}, abs=0.01)
    # an explicit visibility_timeout wins; 'fixed' gives the default to every type
    client.send("pt", 1, attributes={"type": "slow"})
    [m] = client.receive("pt", visibility_timeout=5)
    assert m.visible_until and m.first_received_at
    assert (m.visible_until - m.first_received_at).total_seconds() == pytest.approx(5, abs=0.01)
    client.alter_tuning("pt", lease_policy="fixed")
    client.send("pt", 1, attributes={"type": "slow"})
    [m] = client.receive("pt")
    assert m.visible_until and m.first_received_at
    assert (m.visible_until - m.first_received_at).total_seconds() == pytest.approx(30, abs=0.01)
    with pytest.raises(InvalidParameter, match="lease_policy"):
        client.alter_tuning("pt", lease_policy="magic")
    with pytest.raises(InvalidParameter, match="tune_max"):
        client.alter_tuning("pt", tune_min=10, tune_max=5)


# --- the tuner --------------------------------------------------------------------------------


def test_the_tuner_converges_from_a_bad_start_and_does_not_flap(
    client: queue_pg.Client, conn: Conn
) -> None:
    client.create_queue("t", visibility_timeout=1, max_lease=3600)
    client.alter_tuning("t", auto_tune=True)
    # the work takes 4.5 to 5 s: advice 30 s; each step needs 30 runs finished under the
    # timeout the last one set, and moves at most 2x, but the step after one the bound cut
    # short completes the move when the advice still calls for it
    seen = [1.0]
    for _ in range(8):
        add_history(conn, "t", [4.5 + 0.5 * i / 39 for i in range(40)])
        [step] = client.tune()
        seen.append(step.new_timeout)
    assert seen == [1, 2, 30, 30, 30, 30, 30, 30, 30]
    log = client.tuning_log("t")
    assert [(c.old_timeout, c.new_timeout) for c in log] == [(1, 2), (2, 30)]
    assert [c.samples for c in log] == [40, 80]  # the last 24 hours'
    assert all(c.advice == 30 for c in log)
    # evidence that wobbles within 25% changes nothing
    for work in (4.0, 5.5, 4.3):
        add_history(conn, "t", [work] * 40)
        [step] = client.tune()
        assert step.changed is False and step.new_timeout == 30, step.why
    # fewer than 30 runs to go by: nothing
    client.create_queue("t2", visibility_timeout=300)
    client.alter_tuning("t2", tune_max=100)
    add_history(conn, "t2", [1.0] * 10)
    [step] = client.tune("t2")
    assert step.new_timeout == 300 and "too few" in step.why
    # bounds: advice 6 s from 300 s steps to 150, then within [tune_min, tune_max]
    add_history(conn, "t2", [1.0] * 40)
    [step] = client.tune("t2")
    assert (step.old_timeout, step.new_timeout) == (300, 100)


def test_sweep_runs_the_tuner_once_a_minute(client: queue_pg.Client, conn: Conn) -> None:
    client.create_queue("auto", visibility_timeout=10)
    client.create_queue("manual", visibility_timeout=10)
    client.alter_tuning("auto", auto_tune=True)
    add_history(conn, "auto", [0.5] * 40)
    add_history(conn, "manual", [0.5] * 40)
    client.sweep()
    assert client.get_queue("auto").visibility_timeout == 5
    assert client.get_queue("manual").visibility_timeout == 10
    add_history(conn, "auto", [0.5] * 40)
    client.sweep()  # within the minute: no second step
    assert client.get_queue("auto").visibility_timeout == 5


@pytest.mark.slow
def test_auto_tune_corrects_a_bad_timeout_under_real_workers(client: queue_pg.Client) -> None:
    """Workers that take a known 0.2 s per message; the user set 20 s and turns auto_tune on."""
    client.create_queue("work", visibility_timeout=20)
    client.alter_tuning("work", auto_tune=True)
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            for m in client.receive("work", max_messages=1, wait=0.2):
                time.sleep(0.2)
                client.delete("work", m.receipt or "")

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    try:
        timeouts = [20.0]
        for _ in range(6):
            client.send_batch("work", list(range(35)))
            deadline = time.monotonic() + 30
            while client.stats("work").visible + client.stats("work").in_flight and (
                time.monotonic() < deadline
            ):
                time.sleep(0.1)
            for step in client.tune():
                timeouts.append(step.new_timeout)
    finally:
        stop.set()
        for t in threads:
            t.join()
    advice = advice_of(client, "work")["*"].recommended_timeout
    assert advice == 2  # 6 x ~0.2 s
    assert timeouts[:2] == [20, 10]  # bounded to 2x, then the move completed
    assert timeouts[2] <= 3
    assert abs(timeouts[-1] - advice) <= 0.25 * timeouts[-1]


@pytest.mark.slow
def test_auto_tune_raises_a_too_short_timeout_under_real_workers(client: queue_pg.Client) -> None:
    """Workers whose runs take 0.5 to 1.2 s (known per message); the user set 1 s. Leases lapse
    (stale receipts) and the completed runs alone already call for more: the tuner goes up each
    step, without waiting for samples that only sweep takes, and stops within 25% of the advice."""
    client.create_queue("slowish", visibility_timeout=1, max_lease=600)
    client.alter_tuning("slowish", auto_tune=True)
    stop = threading.Event()
    lock = threading.Lock()
    done = [0]

    def worker() -> None:
        while not stop.is_set():
            for m in client.receive("slowish", max_messages=1, wait=0.2):
                time.sleep(0.5 + 0.7 * (int(m.body) % 35) / 34)
                try:
                    if client.delete("slowish", m.receipt or ""):
                        with lock:
                            done[0] += 1
                except queue_pg.StaleReceipt:
                    pass  # its lease lapsed and another worker has it

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        timeouts = [1.0]
        steps: list[Any] = []
        for _ in range(8):
            with lock:
                goal = done[0] + 30
            client.send_batch("slowish", list(range(35)))
            deadline = time.monotonic() + 20
            while done[0] < goal and time.monotonic() < deadline:
                time.sleep(0.1)
            for step in client.tune():
                timeouts.append(step.new_timeout)
                steps.append(step)
    finally:
        stop.set()
        for t in threads:
            t.join()
    # the tuner's target: 6 x p99 (the lapses were of the shorter timeouts, before the changes;
    # timeout_advice's second rule, which doubles a timeout already covering the completed
    # runs, applies only with stale receipts of leases granted since the last change)
    advice = steps[-1].advice
    assert advice is not None and 7 <= advice <= 9, [(s.new_timeout, s.advice, s.why) for s in steps]
    # a round whose runs a loaded machine did not finish in time holds (a step, no change)
    changes = [v for i, v in enumerate(timeouts) if i == 0 or v != timeouts[i - 1]]
    assert changes[:2] == [1, 2], timeouts
    reached = next(i for i, v in enumerate(changes) if abs(v - advice) <= 0.25 * v)
    # 1 -> 2 (bounded to 2x) -> about 8 (the move completed): two changes, three when the
    # first step's target was the doubling rule's 2 s
    assert reached <= 3, timeouts
    assert all(b >= a for a, b in itertools.pairwise(timeouts)), timeouts  # no flapping
    assert abs(timeouts[-1] - advice) <= 0.25 * timeouts[-1]


def test_the_tune_interval_setting_sets_how_often_sweep_tunes(client: queue_pg.Client, conn: Conn) -> None:
    client.create_queue("often", visibility_timeout=40)
    client.alter_tuning("often", auto_tune=True)
    conn.execute("SET queue_pg.tune_interval = '1 second'")
    add_history(conn, "often", [0.5] * 40)
    conn.execute("SELECT queue_pg.sweep()")
    assert client.get_queue("often").visibility_timeout == 20
    add_history(conn, "often", [0.5] * 40)
    time.sleep(1.1)
    conn.execute("SELECT queue_pg.sweep()")  # a second later: another step, completing the move
    assert client.get_queue("often").visibility_timeout == 3
    client.alter_queue("often", visibility_timeout=10)
    add_history(conn, "often", [0.5] * 40)
    conn.execute("SET queue_pg.tune_interval = 'nonsense'")  # invalid: the minute
    conn.execute("SELECT queue_pg.sweep()")
    assert client.get_queue("often").visibility_timeout == 10


# --- routing ----------------------------------------------------------------------------------


def test_routes_send_each_type_to_its_queue(client: queue_pg.Client) -> None:
    for name in ("in", "slow", "fast"):
        client.create_queue(name)
    assert client.add_route("in", "slow", "slow") is True
    assert client.add_route("in", "slow", "slow") is False
    assert client.add_route("in", "fast", "fast") is True
    with pytest.raises(QueueAlreadyExists):
        client.add_route("in", "slow", "fast")
    with pytest.raises(InvalidParameter, match="itself"):
        client.add_route("in", "x", "in")
    client.send("in", 1, attributes={"type": "slow"})
    client.send("in", 2, attributes={"type": "other"})
    client.send("in", 3)
    client.send_batch("in", [4, 5, 6, 7], attributes=[{"type": "fast"}, {"type": "slow"}, {},
                                                       {"type": "fast"}])
    client.send_batch("in", [8])

    def bodies(q: str) -> list[Any]:
        return sorted(m.body for m in client.peek(q, 10))

    assert (bodies("in"), bodies("slow"), bodies("fast")) == ([2, 3, 6, 8], [1, 5], [4, 7])
    assert {h.queue: h.sent for h in client.queue_health()} == {"in": 4, "slow": 2, "fast": 2}
    assert [(r.queue, r.type, r.target) for r in client.list_routes()] == [
        ("in", "fast", "fast"), ("in", "slow", "slow")]
    assert client.drop_route("in", "slow") is True and client.drop_route("in", "slow") is False
    client.send("in", 9, attributes={"type": "slow"})
    assert 9 in bodies("in")
    client.drop_route("in", "fast")
    assert client.get_queue("in") is not None
    client.drop_queue("fast")  # a dropped target takes its routes with it
    assert client.list_routes() == []


# --- who sees what ----------------------------------------------------------------------------


@pytest.fixture
def role(clean: str) -> Iterator[Any]:
    made: list[str] = []

    def make(*groups: str) -> str:
        name = f"qp_adv_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(clean, autocommit=True) as c:
            c.execute(psql.SQL("CREATE ROLE {} LOGIN").format(psql.Identifier(name)))
            for g in groups:
                c.execute(psql.SQL("GRANT {} TO {}").format(*map(psql.Identifier, (g, name))))
        made.append(name)
        return name

    yield make
    with psycopg.connect(clean, autocommit=True) as c:
        for name in made:
            c.execute(psql.SQL("DROP OWNED BY {}").format(psql.Identifier(name)))
            c.execute(psql.SQL("DROP ROLE {}").format(psql.Identifier(name)))


def test_limited_roles_see_only_their_queues(
    client: queue_pg.Client, conn: Conn, clean: str, role: Any
) -> None:
    client.create_queue("dlq")
    client.create_queue("mine", dead_letter_queue="dlq", max_receive_count=3)
    client.create_queue("theirs")
    for q in ("mine", "theirs"):
        add_history(conn, q, [0.2] * 40, type="a")
        client.send(q, {"secret": "body"}, attributes={"type": "a"})
        client.receive(q, visibility_timeout=60)
    client.send("mine", 1)
    [m] = client.receive("mine", visibility_timeout=60)
    client.dead_letter("mine", m.receipt or "", reason="bad input")
    consumer = role("queue_pg_consumer")
    client.grant("mine", consumer, "receive")
    client.grant("dlq", consumer, "receive")
    dsn = psycopg.conninfo.make_conninfo(clean, user=consumer)
    with queue_pg.Client(dsn, sweep_interval=None) as c:
        assert [h.queue for h in c.queue_health()] == ["dlq", "mine"]
        assert {a.queue for a in c.timeout_advice()} == {"mine"}
        assert {t.queue for t in c.processing_times()} == {"mine"}
        assert [(f.queue, f.type) for f in c.in_flight()] == [("mine", "a")]
        [d] = c.dead_letters()
        assert (d.dead_letter_queue, d.source_queue, d.reason) == ("dlq", "mine", "bad input")
        with pytest.raises(AccessDenied):
            c.tune("mine")  # tuning needs manage
        with pytest.raises(AccessDenied):
            c.add_route("mine", "a", "dlq")
        assert c.tune() == []  # no auto_tune queue it manages
    bare = role()
    with psycopg.connect(clean, user=bare, autocommit=True) as c, pytest.raises(
        psycopg.errors.InsufficientPrivilege
    ):
        c.execute("SELECT * FROM queue_pg.timeout_advice")


def test_a_producer_sends_through_a_route_with_its_grant_on_the_source(
    client: queue_pg.Client, clean: str, role: Any
) -> None:
    client.create_queue("front")
    client.create_queue("back")
    client.add_route("front", "big", "back")
    producer = role("queue_pg_producer")
    client.grant("front", producer, "send")
    dsn = psycopg.conninfo.make_conninfo(clean, user=producer)
    with queue_pg.Client(dsn, sweep_interval=None) as c:
        c.send("front", 1, attributes={"type": "big"})
        c.send_batch("front", [2, 3], attributes=[{"type": "big"}, {}])
    assert sorted(m.body for m in client.peek("back", 10)) == [1, 2]
    assert [m.body for m in client.peek("front", 10)] == [3]


# --- the commands -----------------------------------------------------------------------------


def test_advise_and_tune_split_apply_from_the_command_line(
    client: queue_pg.Client, conn: Conn, clean: str
) -> None:
    client.create_queue("jobs", visibility_timeout=30, max_receive_count=None)
    add_history(conn, "jobs", [0.05] * 40, type="thumb")
    add_history(conn, "jobs", [20.0] * 40, type="video")

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli.main, ["--dsn", clean, *args])
        assert result.exit_code == 0, result.output
        return result.stdout

    shown = run("advise", "jobs")
    assert "video" in shown and "2m" in shown and "spread 400x" in shown
    proposed = run("tune", "--split")
    assert "jobs-video" in proposed and client.list_routes() == []
    run("tune", "jobs", "--split", "--apply")
    assert [(r.type, r.target) for r in client.list_routes("jobs")] == [
        ("thumb", "jobs-thumb"), ("video", "jobs-video")]
    assert client.get_queue("jobs-video").visibility_timeout == 120
    assert client.get_queue("jobs-thumb").visibility_timeout == 1
    client.send("jobs", 1, attributes={"type": "video"})
    assert [m.body for m in client.peek("jobs-video")] == [1]
    assert "advice" in run("tune", "jobs") and client.get_queue("jobs").visibility_timeout == 30


def test_lapses_without_stale_receipts_do_not_raise_the_timeout(
    client: queue_pg.Client, conn: Conn
) -> None:
    """Crashed consumers lapse leases too; only stale receipts (a consumer that came back
    after its lease ended) show the work outlasting the timeout."""
    client.create_queue("c", visibility_timeout=10)
    client.alter_tuning("c", auto_tune=True, lease_policy="per_type")
    add_history(conn, "c", [1.0] * 95, type="a")
    add_history(conn, "c", [1.0] * 5, type="a", receive_count=2, lease_expiries=1)
    assert advice_of(client, "c")["*"].recommended_timeout == 20  # the advice: 2 x 10
    [step] = client.tune("c", apply=False)
    assert step.advice == 6 and step.new_timeout == 6 and "crashed" in step.why
    client.tune("c")  # refreshes the per-type lease too
    assert conn.execute("SELECT lease FROM queue_pg.type_leases").fetchall() == [(6,)]
    client.alter_queue("c", visibility_timeout=10)
    # a sweep's sample once the longest run (1 s) has passed since the change: the stale
    # receipts after it are of leases granted since
    conn.execute("SET queue_pg.time_offset = '20 seconds'")
    conn.execute("SELECT queue_pg.sweep()")
    # a consumer that outlived its lease: its delete is refused as stale
    client.send("c", 1)
    [first] = client.receive("c", visibility_timeout=0.01)
    time.sleep(0.05)
    client.receive("c")
    with pytest.raises(queue_pg.StaleReceipt):
        client.delete("c", first.receipt or "")
    add_history(conn, "c", [1.0] * 95, type="a")  # evidence since the last change
    add_history(conn, "c", [1.0] * 5, type="a", receive_count=2, lease_expiries=1)
    advice, new = conn.execute("SELECT advice, new_timeout FROM queue_pg.tune('c')").fetchone()
    assert (advice, new) == (20, 20)


def refuse_stale(client: queue_pg.Client, queue: str) -> None:
    """A consumer that outlived its lease: its delete is refused as stale."""
    client.send(queue, 1)
    [first] = client.receive(queue, visibility_timeout=0.01)
    time.sleep(0.05)
    [again] = client.receive(queue)
    with pytest.raises(queue_pg.StaleReceipt):
        client.delete(queue, first.receipt or "")
    client.delete(queue, again.receipt or "")


def tune_later(conn: Conn, queue: str, offset: int) -> Any:
    """A sweep's sample and a tuning step of ``queue``, ``offset`` seconds from now."""
    conn.execute(f"SET queue_pg.time_offset = '{offset} seconds'")
    conn.execute("SELECT queue_pg.sweep()")  # a sample (no auto_tune queue to tune)
    return conn.execute(
        f"SELECT new_timeout, advice, why FROM queue_pg.tune('{queue}')"
    ).fetchone()


def test_stale_receipts_of_leases_granted_before_a_change_do_not_double_it(
    client: queue_pg.Client, conn: Conn
) -> None:
    """A consumer leased before the timeout went up reports back, stale, after the change: that
    says nothing of the new timeout. Stale receipts after the longest run has passed do."""
    client.create_queue("o", visibility_timeout=6, max_lease=3600)
    # runs take up to 2 s: 6 x p99 = 12; 1 lapse in 20 (crashes)
    works = [1.0 + i / 39 for i in range(40)]

    def evidence() -> None:
        add_history(conn, "o", works[:38])
        add_history(conn, "o", works[38:], receive_count=2, lease_expiries=1)

    def stale_receipt() -> None:
        refuse_stale(client, "o")

    def tune_at(offset: int) -> Any:
        return tune_later(conn, "o", offset)

    evidence()
    assert tune_at(0)[0] == 12  # 6 -> 12 from 6 x p99
    stale_receipt()  # of a lease granted before the change
    evidence()
    new, advice, why = tune_at(0)  # within the longest run of the change: may be the old leases'
    assert new == 12 and "waiting" in why, why
    new, advice, why = tune_at(20)  # the sample 20 s later counts from there: nothing since
    assert (new, advice) == (12, 12), why
    # a timeout that is too short: stale receipts keep coming after the change has settled
    stale_receipt()
    evidence()
    new, advice, why = tune_at(40)
    assert (new, advice) == (24, 24), why
    assert [(c.old_timeout, c.new_timeout) for c in client.tuning_log("o")] == [(6, 12), (12, 24)]


def test_stale_receipts_since_a_change_keep_it_from_going_down(
    client: queue_pg.Client, conn: Conn
) -> None:
    """A rare slow type outlived the old timeout: the fast runs' p99 does not lower it again."""
    client.create_queue("h", visibility_timeout=3, max_lease=3600)
    add_history(conn, "h", [1.0] * 40)
    assert tune_later(conn, "h", 0)[0] == 6  # 6 x p99
    refuse_stale(client, "h")
    add_history(conn, "h", [0.1] * 10_000)  # the p99 is now the fast runs': advice 1 s
    new, advice, why = tune_later(conn, "h", 20)
    assert (new, advice) == (6, 1) and "not lowering" in why, why
