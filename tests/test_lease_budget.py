"""Leases from a duplicate budget: the quantile lease against a known distribution, the rule
as the fallback on thin history, the setting's checks, and the tuner's convergence without a
dead band."""

from __future__ import annotations

import logging
import math
import random
import statistics
import threading
import time
from typing import Any

import psycopg
import pytest

import queue_pg
from queue_pg.errors import InvalidParameter, LeaseLimitExceeded
from queue_pg.jobs.job import HUNG, Job
from queue_pg.jobs.worker import Worker
from tests.test_advice import add_history

Conn = psycopg.Connection[Any]

Z_1E6 = 4.753424  # the standard normal's upper 1e-6 point


def lognormal(n: int, mu: float, sigma: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.lognormvariate(mu, sigma) for _ in range(n)]


def test_the_budget_lease_is_the_true_quantile_of_a_known_lognormal(
    client: queue_pg.Client, conn: Conn
) -> None:
    client.create_queue("logn", visibility_timeout=30, max_lease=3600)
    mu, sigma = math.log(2.0), 0.5  # median 2 s
    add_history(conn, "logn", lognormal(20000, mu, sigma, seed=7), type="work")
    add_history(conn, "logn", lognormal(150, mu, sigma, seed=8), type="few")
    add_history(conn, "logn", lognormal(50, mu, sigma, seed=9), type="thin")
    rows = {r.type: r for r in client.lease_advice("logn") if r.scope == "type"}
    true_q = math.exp(mu + Z_1E6 * sigma)  # 21.5 s
    work = rows["work"]
    assert work.fit == "lognormal" and work.duplicate_budget == 1e-6
    # 20,000 samples: the margin widens sigma by 3%, so the lease is 0 to 20% above the truth
    assert work.lease is not None and true_q <= work.lease <= 1.2 * true_q, (work, true_q)
    assert work.recovery_time == work.lease
    assert work.duplicates_per_million is not None and work.duplicates_per_million <= 1.0
    # the rule (6 x p99 = 39 s) recovers hung work later for no risk that matters
    assert work.rule_timeout is not None and 37 <= work.rule_timeout <= 40
    assert work.lease < work.rule_timeout / 1.5
    # few samples: a wider margin, still a fit; thin history: the rule
    few = rows["few"]
    assert few.fit == "lognormal" and few.lease is not None and few.lease > work.lease
    thin = rows["thin"]
    assert thin.fit == "6 x p99" and thin.lease == thin.rule_timeout
    # a larger budget gives a shorter lease: the quantile 1 - 1e-3 (z = 3.09)
    s = client.alter_tuning("logn", duplicate_budget=1e-3)
    assert s.duplicate_budget == 1e-3
    [work3] = [r for r in client.lease_advice("logn") if r.type == "work"]
    assert work3.lease is not None
    assert math.exp(mu + 3.090 * sigma) <= work3.lease <= 1.2 * math.exp(mu + 3.090 * sigma)
    # per-type leases take the budget's lease
    client.alter_tuning("logn", lease_policy="per_type")
    leases = dict(conn.execute(
        "SELECT type, lease FROM queue_pg.type_leases l JOIN queue_pg.queues q ON q.id = l.queue_id"
        " WHERE q.name = 'logn'").fetchall())
    assert leases["work"] == pytest.approx(work3.lease)
    assert leases["thin"] == thin.rule_timeout


def test_the_budget_is_checked_and_bounded_by_the_tuning_bounds(
    client: queue_pg.Client, conn: Conn
) -> None:
    client.create_queue("b", visibility_timeout=30, max_lease=600)
    add_history(conn, "b", lognormal(1000, math.log(2.0), 0.5, seed=1), type="w")
    for bad in (0.5, 0.0, 1e-12, float("nan")):
        with pytest.raises(InvalidParameter, match=r"duplicate_budget = .* allowed 0\.000000001 to 0\.01"):
            client.alter_tuning("b", duplicate_budget=bad, tune_min=5)
    s = client.alter_tuning("b", tune_max=10)  # bad input changed nothing
    assert s.duplicate_budget == 1e-6 and s.tune_min == 1
    [w] = [r for r in client.lease_advice("b") if r.type == "w"]
    assert w.quantile is not None and w.quantile > 10 and w.lease == 10
    client.alter_tuning("b", tune_min=100, clear=["tune_max"])
    [w] = [r for r in client.lease_advice("b") if r.type == "w"]
    assert w.lease == 100


# --- the budget split across types --------------------------------------------------------------


def _fits(client: queue_pg.Client, queue: str) -> dict[str, tuple[float, float, float]]:
    """Each type's fit as docs/timeouts.md states it, from the advice's percentiles: (share of
    the fitted types' samples, mu, sigma x margin)."""
    rows = [r for r in client.timeout_advice(queue) if r.scope == "type" and r.type is not None]
    total = sum(r.samples for r in rows)
    out = {}
    for r in rows:
        assert r.p50 and r.p95 and r.p99
        sigma = max(math.log(r.p99 / r.p50) / 2.326348, math.log(r.p95 / r.p50) / 1.644854)
        out[r.type or ""] = (r.samples / total, math.log(r.p50),
                             sigma * (1 + 1 / math.sqrt(0.05 * r.samples)))
    return out


def _tail(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_the_budget_is_split_to_spend_it_where_a_second_buys_least_risk(
    client: queue_pg.Client, conn: Conn
) -> None:
    """Two types of the same median, one with a steep tail (sigma 0.3) and one with a heavy one
    (sigma 0.8), half the work each. The split leaves the heavy type the longer lease, but gives
    it more of the budget than the other (its tail is dear to cover: a second of lease buys
    little risk) and covers the steep type further into its tail (cheap): at the optimum both
    fitted densities at the leases are equal, the fits' predicted rate is the budget, and the
    expected wait of hung work is below the equal split's (each type its own quantile)."""
    client.create_queue("two", visibility_timeout=30, max_lease=3600)
    mu = math.log(2.0)
    add_history(conn, "two", lognormal(20000, mu, 0.3, seed=11), type="steep")
    add_history(conn, "two", lognormal(20000, mu, 0.8, seed=12), type="heavy")
    rows = {r.type: r for r in client.lease_advice("two") if r.scope == "type"}
    fits = _fits(client, "two")
    lease = {t: rows[t].lease or 0.0 for t in fits}
    own = {t: math.exp(m + Z_1E6 * s) for t, (_, m, s) in fits.items()}  # the equal split
    assert lease["heavy"] > 5 * lease["steep"]
    assert lease["steep"] > 1.1 * own["steep"] and lease["heavy"] < 0.95 * own["heavy"], (lease, own)
    risk = {t: _tail((math.log(lease[t]) - m) / s) for t, (_, m, s) in fits.items()}
    assert risk["heavy"] > 10 * risk["steep"]
    total = sum(fits[t][0] * risk[t] for t in fits)
    assert 0.99e-6 <= total <= 1e-6, total  # the budget, spent (the leases' ms rounding: less)
    density = {t: math.exp(-((math.log(lease[t]) - m) / s) ** 2 / 2) / (s * lease[t])
               for t, (_, m, s) in fits.items()}
    assert density["steep"] == pytest.approx(density["heavy"], rel=0.02), density
    assert sum(lease.values()) < 0.95 * sum(own.values())
    # the distributions themselves: within the budget too (the margins make the fits wider)
    true = 0.5 * _tail((math.log(lease["steep"]) - mu) / 0.3) + 0.5 * _tail(
        (math.log(lease["heavy"]) - mu) / 0.8)
    assert true <= 1e-6
    # the queue-wide row is not split: the quantile of its own fit
    [whole] = [r for r in client.lease_advice("two") if r.scope == "queue"]
    assert whole.lease is not None and whole.quantile is not None
    assert whole.lease == pytest.approx(math.ceil(1000 * whole.quantile) / 1000)
    # per-type leases are the split's
    client.alter_tuning("two", lease_policy="per_type")
    got = dict(conn.execute(
        "SELECT type, lease FROM queue_pg.type_leases l JOIN queue_pg.queues q ON q.id = l.queue_id"
        " WHERE q.name = 'two'").fetchall())
    assert got == pytest.approx(lease)
    # a bound that holds the heavy type shorter than its share: the steep type gives up risk
    # for it (a longer lease), within the budget, while the budget can still be met
    w, m, s = fits["heavy"]
    limit = math.exp(m + s * statistics.NormalDist().inv_cdf(1 - 1e-6 / w))  # all of it: heavy
    assert limit < lease["heavy"]
    client.alter_tuning("two", tune_max=round((limit + lease["heavy"]) / 2, 3))
    held = {r.type: r.lease or 0.0 for r in client.lease_advice("two") if r.scope == "type"}
    assert held["heavy"] == round((limit + lease["heavy"]) / 2, 3)
    assert held["steep"] > lease["steep"], (held, lease)
    assert sum(fits[t][0] * _tail((math.log(held[t]) - m) / s)
               for t, (_, m, s) in fits.items()) <= 1e-6
    # past what the budget allows: each type its own quantile (the rule before the split)
    client.alter_tuning("two", tune_max=math.floor(limit) - 1)
    held = {r.type: r.lease or 0.0 for r in client.lease_advice("two") if r.scope == "type"}
    assert held == {"heavy": math.floor(limit) - 1,
                    "steep": pytest.approx(math.ceil(1000 * own["steep"]) / 1000, rel=1e-3)}


def test_one_type_keeps_the_quantile_of_the_budget(client: queue_pg.Client, conn: Conn) -> None:
    """A queue with one fitted type: the split is the rule before it, the quantile 1 - budget
    of the type's fit (the same as the queue-wide row's); types on thin history stay outside."""
    client.create_queue("one", visibility_timeout=30, max_lease=3600)
    add_history(conn, "one", lognormal(5000, math.log(0.5), 0.6, seed=21), type="only")
    add_history(conn, "one", [0.2] * 40, type="thin")  # 6 x p99: not in the split
    rows = {r.type: r for r in client.lease_advice("one") if r.scope == "type"}
    [adv] = [r for r in client.timeout_advice("one") if r.type == "only"]
    assert adv.p50 and adv.p95 and adv.p99
    sigma = max(math.log(adv.p99 / adv.p50) / 2.326348, math.log(adv.p95 / adv.p50) / 1.644854)
    s = sigma * (1 + 1 / math.sqrt(0.05 * adv.samples))
    only = rows["only"]
    assert only.fit == "lognormal" and only.quantile is not None and only.lease is not None
    assert only.quantile == pytest.approx(math.exp(math.log(adv.p50) + Z_1E6 * s), rel=1e-3)
    assert only.lease == math.ceil(1000 * only.quantile) / 1000
    assert rows["thin"].fit == "6 x p99" and rows["thin"].lease == 2
    # the same type alone on a queue: its row and the queue-wide row are the same fit
    client.create_queue("solo", visibility_timeout=30, max_lease=3600)
    add_history(conn, "solo", lognormal(5000, math.log(0.5), 0.6, seed=21), type="only")
    whole = {r.scope: r for r in client.lease_advice("solo")}
    assert whole["type"].lease == whole["queue"].lease == only.lease


# --- the tuner: no dead band trap ---------------------------------------------------------------


def test_the_tuner_follows_step_changes_within_two_cycles_and_holds_steady(
    client: queue_pg.Client, conn: Conn
) -> None:
    """Fast (0.1 s: target 1 s), then slow (1 s: target 7 s), then fast again: each time the
    timeout reaches the target within two tune cycles (the first bounded to 2x, the second
    completes the move: no stop inside the 25% band short of it), then does not move while the
    target holds."""
    client.create_queue("step", visibility_timeout=60, max_lease=3600)
    client.alter_tuning("step", auto_tune=True)

    def cycles(works: list[float], n: int, first: list[float] | None = None) -> list[float]:
        seen = []
        for i in range(n):
            add_history(conn, "step", first if i == 0 and first else works)
            time.sleep(1.2)  # lowering waits for the longest run (1.05 s) since the last change
            [s] = client.tune("step")
            seen.append(s.new_timeout)
        return seen

    fast = [0.09 + 0.02 * i / 39 for i in range(40)]
    slow = [0.95 + 0.1 * i / 39 for i in range(40)]
    assert cycles(fast, 4) == [30, 1, 1, 1]
    assert cycles(slow, 4) == [2, 7, 7, 7]
    # back to fast: enough fast runs that the slow ones (160) are under 1% of the day's
    assert cycles(fast, 4, first=fast * 500) == [3.5, 1, 1, 1]
    log = [(c.old_timeout, c.new_timeout) for c in client.tuning_log("step")]
    assert log == [(60, 30), (30, 1), (1, 2), (2, 7), (7, 3.5), (3.5, 1)]


# --- hung work ----------------------------------------------------------------------------------


def _quick_queue(client: queue_pg.Client, conn: Conn, name: str) -> None:
    """A per_type queue whose type 'quick' has a lease of 1 s (0.1 s runs: 6 x p99, floor 1
    s): stuck after 2 s, heartbeats refused after 4 s."""
    client.create_queue(name, visibility_timeout=30, max_lease=3600)
    add_history(conn, name, [0.1] * 40, type="quick")
    client.alter_tuning(name, lease_policy="per_type")


def test_a_hung_run_is_reported_stuck_and_its_heartbeats_stop(
    client: queue_pg.Client, conn: Conn
) -> None:
    _quick_queue(client, conn, "hung")
    mid = client.send("hung", 1, attributes={"type": "quick"})
    client.send("hung", 2, attributes={"type": "other"})  # no lease of its type: no limit
    got = client.receive("hung", max_messages=2, visibility_timeout=2)  # a heartbeater's lease
    [m] = [x for x in got if x.id == mid]
    [other] = [x for x in got if x.id != mid]
    t0 = time.monotonic()
    stuck: list[Any] = []
    while time.monotonic() - t0 < 4.3:
        client.change_visibility("hung", m.receipt or "", 2)  # beats up to the limit are kept
        client.change_visibility("hung", other.receipt or "", 2)
        stuck = conn.execute("SELECT id, type, stuck_after, stopped_after FROM queue_pg.stuck_jobs"
                             " WHERE queue = 'hung'").fetchall()
        if time.monotonic() - t0 < 1.5:
            assert stuck == []
        time.sleep(0.4)
        if time.monotonic() - t0 > 3.9:
            break
    assert stuck == [(mid, "quick", 2.0, 4.0)]
    [job] = client.stuck_jobs("hung")
    assert (job.id, job.type, job.consumer) == (mid, "quick", None) and job.running_for > 2
    time.sleep(max(0.0, 4.2 - (time.monotonic() - t0)))
    with pytest.raises(LeaseLimitExceeded, match="hung-work limit of type 'quick'"):
        client.change_visibility("hung", m.receipt or "", 2)
    client.change_visibility("hung", other.receipt or "", 2)  # the type without a lease: kept
    # its lease (at most 2 s more) lapses and it is delivered again
    again = client.receive("hung", wait=5)
    assert [x.id for x in again] == [mid] and again[0].receive_count == 2


def test_a_worker_stops_beating_for_hung_work_and_the_message_comes_back(
    client: queue_pg.Client, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "queue_pg")
    _quick_queue(client, conn, "hw")
    seen: dict[str, Any] = {}

    def handler(job: Job) -> None:
        t0 = time.monotonic()
        while not job.cancelled:  # hung: it ends only when told
            assert time.monotonic() - t0 < 20, "never cancelled"
            time.sleep(0.01)
        seen["after"] = time.monotonic() - t0
        seen["reason"] = job.cancel_reason
        worker.stop()
        job.raise_if_cancelled()

    worker = Worker(client, "hw", handler, concurrency=1, wait=0.5, visibility_timeout=1.5)
    t = threading.Thread(target=worker.run, kwargs={"signals": ()}, daemon=True)
    t.start()
    try:
        mid = client.send("hw", 1, attributes={"type": "quick"})
        deadline = time.monotonic() + 30
        while "reason" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.stop()
        t.join(10)
    assert seen["reason"] == HUNG
    assert 4.0 <= seen["after"] < 10.0
    assert any("hung-work limit" in r.getMessage() and r.levelno == logging.ERROR
               for r in caplog.records)
    [m] = client.receive("hw", wait=5)
    assert m.id == mid and m.receive_count == 2


# --- the bench's baselines ----------------------------------------------------------------------


def test_the_bench_baselines_come_from_the_distributions() -> None:
    """6 x p99 and the fixed timeout of equal risk are read off the workload's distributions:
    exact quantiles of a known lognormal, a mixture's risk matched, the Pareto tail's cut."""
    from bench.tuning import SHAPES, Workload

    size = dict(messages=10, consumers=1, heartbeating=0, rate=1.0, history=10, crash_share=0.0)
    one = Workload(**SHAPES["lognormal"], **size, sigma=0.5)  # type: ignore[arg-type]
    assert one.quantile(0.99) == pytest.approx(0.1 * math.exp(2.326348 * 0.5), rel=1e-6)
    assert one.fixed_of_risk(1e-6) == pytest.approx(0.1 * math.exp(Z_1E6 * 0.5), rel=1e-6)
    two = Workload(**SHAPES["bimodal"], **size, sigma=0.4)  # type: ignore[arg-type]
    assert two.quantile(0.99) == pytest.approx(2.115, rel=0.01)  # in the slow type's tail
    leases = {"fast": 1.0, "slow": 12.0}
    fixed = two.fixed_of_risk(two.risk(leases))
    assert two.risk(dict.fromkeys(leases, fixed)) == pytest.approx(two.risk(leases), rel=1e-6)
    assert 1.0 < fixed < 12.0
    tail = Workload(**SHAPES["pareto"], **size, sigma=0.4)  # type: ignore[arg-type]
    assert tail.survival("fast", 1.0) == pytest.approx((0.05 / 2 ** (1 / 1.5) / 1.0) ** 1.5)
    assert tail.survival("fast", 10.0) == 0.0  # runs are cut at 200 x the median
    assert max(tail.works(["fast"] * 2000, seed=3)) <= 10.0
