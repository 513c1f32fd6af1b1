"""Leases from a duplicate budget: the quantile lease against a known distribution, the rule
as the fallback on thin history, the setting's checks, and the tuner's convergence without a
dead band."""

from __future__ import annotations

import math
import random
import time
from typing import Any

import psycopg
import pytest

import queue_pg
from queue_pg.errors import InvalidParameter
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
