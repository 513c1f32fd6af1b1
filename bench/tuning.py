"""Scenario "tuning": which visibility timeout set-up serves a mixed queue best.

One workload, replayed against each set-up in a scratch database of its own: messages of a fast
type and a rare slow type (lognormal processing times, scaled down 10x so a run takes minutes),
consumers of two kinds (half of them heartbeat: they lease each message for a short
``HEARTBEAT_LEASE`` and renew it every third of that while they work, as ``queue_pg.Worker`` does
with ``visibility_timeout`` set; the others never heartbeat and live by the queue's lease policy),
and a fixed share of deliveries whose consumer crashes part way (it drops the message without
deleting it, and its heartbeats stop). Every set-up sees the same messages, the same
processing times and the same crashes (a seeded random draw per message and delivery). The
advice-based set-ups start from yesterday's history: a day of finished messages drawn from the
same distributions (another seed, ``history`` of them), written into ``queue_pg.message_history``.

The slow type is rare (0.5%) on purpose: that is the queue where one timeout goes wrong unseen.
Its p99 sits in the fast type's tail, so 6 x p99 of a sample of the whole queue fits the fast
work, and the slow jobs (1 in 200) outlast it.

Set-ups:

1. ``sqs-default``: SQS's 30 s default, scaled (3 s);
2. ``best-fixed``: 6 x p99 of the whole queue's processing-time distribution, computed from the
   workload's own distributions (analytically: a sample of a thousand runs misses a rare slow
   type's tail and came out shorter than every slow job);
   ``equal-risk``: the one fixed timeout whose predicted duplicate risk (the share of runs
   longer than it, from the same distributions) equals the per-type leases' predicted risk:
   the comparison at equal duplicate risk, where per-type leases must win on recovery time;
3. ``auto-tune``: starts at the scaled SQS default with ``auto_tune`` on; a maintenance thread
   runs ``sweep()`` (whose samples date the stale receipts) and ``tune()`` every second;
4. ``per-type``: ``lease_policy = 'per_type'``;
5. ``routing``: a queue per type (``queue_pg.split(apply => true)``), producers unchanged.

The heartbeating consumers do the same in every set-up (their lease is their own), so what
tells the set-ups apart is what happens to the work of the consumers that do not heartbeat.

Timed runs (``--seconds``, the comparison at equal duplicate risk in docs/timeouts.md): a matrix
of mixes x backlogs (``--backlog``: about that many messages kept visible, so a redelivery waits
behind them) x failures (``--failure hang``: the consumer lives on and neither deletes nor renews
the message, so only the lease ends it; ``crash``: the process dies, a reap ends its leases) x
seeds x set-ups, each for that many seconds, then no new failure and up to ``DRAIN_MAX`` for the
failed messages to come back; duplicates, wasted work (finished runs whose delete was refused)
and failure-to-redelivery times, the seeds pooled.

Reported per set-up: duplicate deliveries of work that did not crash (a lease lapsed while its
consumer still worked), mean and p99 seconds from a crash to the message's redelivery (overall,
per type, and per kind of consumer that crashed), and throughput (messages finished per second
of the run).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import queue_pg
from bench import Scenario, db
from bench.report import DEFAULT_OUT, machine_info, machine_line, markdown_table, write_results
from queue_pg.install import migrate
from queue_pg.jobs.pulse import REAP_INTERVAL

__all__ = ["SCENARIO", "Workload", "run", "run_setup"]

RESULT_NAME = "tuning"
SCALE = 0.1  #: real seconds per workload second: SQS's 30 s default becomes 3 s
SETUPS = ("sqs-default", "best-fixed", "fixed-2x", "fixed-1x", "equal-risk", "auto-tune",
          "per-type", "routing")
#: the set-ups of a timed run (``--seconds``): the fixed 6x / 2x / 1x p99 rules, the fixed timeout
#: of the per-type leases' predicted risk, and the per-type leases of the duplicate budget
TIMED_SETUPS = ("best-fixed", "fixed-2x", "fixed-1x", "equal-risk", "per-type")
FIXED_MULTIPLES = {"fixed-2x": 2.0, "fixed-1x": 1.0}
DRAIN_MAX = 60.0  #: seconds a timed run waits after its end for failed work to come back
DLQ = "jobs-dlq"
MAX_RECEIVES = 5
#: The mixes of types (``--mix``): slow share and median, medium share and median (seconds).
MIXES = {
    # the whole queue's p99 misses the slow type: 6 x p99 fits the fast one
    "rare-slow": (0.005, 2.5, 0.0, 0.0),
    # the p99 lands on the slow type: 6 x p99 fits the slow one
    "common-slow": (0.03, 2.5, 0.0, 0.0),
    # the p99 lands on a medium type, and a rarer slow one outlasts 6 x p99
    "three-types": (0.005, 12.0, 0.02, 2.0),
}
#: Workloads stated by their distributions (``--mix``): the bimodal one (fast 40 ms median /
#: 150 ms p99, slow 600 ms / 2.5 s, half each), one lognormal type, one heavy-tailed Pareto
#: type (alpha 1.5: no quantile of it is safe; its runs are cut at PARETO_CAP x the median so a
#: run ends, and the distributions the baselines read are cut the same way).
SHAPES: dict[str, dict[str, Any]] = {
    "bimodal": dict(slow_share=0.5, fast_median=0.04, slow_median=0.6,
                    fast_sigma=math.log(0.15 / 0.04) / 2.326348,
                    slow_sigma=math.log(2.5 / 0.6) / 2.326348),
    "lognormal": dict(slow_share=0.0, fast_median=0.1, slow_median=0.1, fast_sigma=0.5),
    "pareto": dict(slow_share=0.0, fast_median=0.05, slow_median=0.05, tail="pareto"),
}
PARETO_ALPHA = 1.5
PARETO_CAP = 200.0  #: a Pareto run lasts at most this many times the median
DEFAULT_MIX = "rare-slow"  #: results of another mix go to tuning-MIX.md
HEARTBEAT_LEASE = 1.0  #: seconds (scaled: 10 s) a heartbeating consumer leases and renews


@dataclass(frozen=True)
class Workload:
    """The messages: their types and processing times, and which deliveries crash."""

    messages: int
    slow_share: float  #: share of messages of type "slow"
    fast_median: float  #: seconds (scaled)
    slow_median: float
    sigma: float  #: of the lognormal
    crash_share: float  #: share of deliveries whose consumer crashes
    consumers: int
    heartbeating: int  #: of the consumers, how many heartbeat (the first ones)
    rate: float  #: messages sent per second
    history: int  #: finished messages of yesterday the advice starts from
    seed: int = 1
    #: consumers register as Workers do (queue_pg.jobs.pulse): a crashed one's leases end once a
    #: reap finds its session gone for the grace period, instead of when they lapse
    detect_crashes: bool = True
    medium_share: float = 0.0  #: share of messages of type "medium" (a third type; 0: none)
    medium_median: float = 0.0
    fast_sigma: float | None = None  #: per type (None: sigma)
    slow_sigma: float | None = None
    tail: str = "lognormal"  #: or "pareto" (alpha PARETO_ALPHA, cut at PARETO_CAP x median)
    #: what a failing delivery does: "crash" (its consumer's process dies: the session ends, a
    #: reap can end its leases) or "hang" (the consumer stops working on the message and never
    #: deletes nor heartbeats it, but its process and session live on: only the lease ends it)
    failure: str = "crash"
    #: keep about this many messages visible (topped up every 50 ms) instead of sending at
    #: ``rate``: a redelivered message waits behind them (None: send at ``rate``)
    backlog: int | None = None
    #: run for this many seconds (then inject no more failures and wait up to DRAIN_MAX for the
    #: failed work to come back) instead of until ``messages`` are finished (None)
    seconds: float | None = None

    def types(self, seed: int | None = None, n: int | None = None) -> list[str]:
        rng = random.Random(self.seed if seed is None else seed)
        count = self.messages if n is None else n
        return [self._type(rng.random()) for _ in range(count)]

    def _type(self, r: float) -> str:
        if r < self.slow_share:
            return "slow"
        return "medium" if r < self.slow_share + self.medium_share else "fast"

    def kinds(self) -> list[str]:
        """The types of the mix, fastest first."""
        return ["fast"] + (["medium"] if self.medium_share else []) + ["slow"]

    def describe(self) -> str:
        if self.tail == "pareto":
            return (f"one type, Pareto alpha {PARETO_ALPHA:g}, median {self.fast_median:g} s"
                    f" (runs cut at {PARETO_CAP:g} x the median)")
        if not self.slow_share and not self.medium_share:
            return f"one type, lognormal median {self.fast_median:g} s, sigma {self.sigma:g}"
        parts = [f"{self.slow_share:.1%} of type slow (lognormal median {self.slow_median:g} s)"]
        if self.medium_share:
            parts.append(f"{self.medium_share:.1%} medium (median {self.medium_median:g} s)")
        return (", ".join(parts) + f" and the rest fast (median {self.fast_median:g} s),"
                f" sigma {self.sigma:g}")

    def _median_sigma(self, type: str) -> tuple[float, float]:
        median = {"slow": self.slow_median, "medium": self.medium_median}.get(type,
                                                                              self.fast_median)
        sigma = {"slow": self.slow_sigma, "fast": self.fast_sigma}.get(type)
        return median, self.sigma if sigma is None else sigma

    def work(self, type: str, rng: random.Random) -> float:
        median, sigma = self._median_sigma(type)
        if self.tail == "pareto":  # median = xm 2^(1/alpha)
            xm = median / 2 ** (1 / PARETO_ALPHA)
            return min(xm * float((1 - rng.random()) ** (-1 / PARETO_ALPHA)), PARETO_CAP * median)
        return rng.lognormvariate(math.log(median), sigma)

    def shares(self) -> dict[str, float]:
        out = {"slow": self.slow_share, "medium": self.medium_share}
        out["fast"] = 1 - self.slow_share - self.medium_share
        return {t: v for t, v in out.items() if v > 0}

    def survival(self, type: str, t: float) -> float:
        """P(a run of ``type`` lasts longer than ``t`` seconds): from the distribution itself."""
        median, sigma = self._median_sigma(type)
        if t <= 0:
            return 1.0
        if self.tail == "pareto":
            xm = median / 2 ** (1 / PARETO_ALPHA)
            return 0.0 if t >= PARETO_CAP * median else min(1.0, float((xm / t) ** PARETO_ALPHA))
        return 1 - statistics.NormalDist(math.log(median), sigma).cdf(math.log(t))

    def risk(self, leases: dict[str, float]) -> float:
        """The predicted share of deliveries whose run outlasts its lease (``leases`` per type)."""
        return sum(share * self.survival(t, leases[t]) for t, share in self.shares().items())

    def quantile(self, q: float) -> float:
        """The whole queue's processing-time quantile ``q`` (bisection on the mixture)."""
        return self.fixed_of_risk(1 - q)

    def fixed_of_risk(self, risk: float) -> float:
        """The fixed timeout whose predicted duplicate risk is ``risk`` (0 if none needed)."""
        lo, hi = 1e-6, 1e6
        if self.risk(dict.fromkeys(self.shares(), lo)) <= risk:
            return lo
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            if self.risk(dict.fromkeys(self.shares(), mid)) > risk:
                lo = mid
            else:
                hi = mid
        return hi

    def works(self, types: Sequence[str] | None = None, seed: int | None = None) -> list[float]:
        """Processing time of each message (the same on every delivery)."""
        rng = random.Random(self.seed + 1 if seed is None else seed)
        return [self.work(t, rng) for t in (self.types() if types is None else types)]

    def yesterday(self) -> tuple[list[str], list[float]]:
        """The history the advice starts from: another draw of the same distributions."""
        types = self.types(self.seed + 2, self.history)
        return types, self.works(types, self.seed + 3)

    def crashes(self, index: int, delivery: int) -> float | None:
        """For the delivery-th delivery of message index: the share of its work done when its
        consumer crashes, or None."""
        rng = random.Random(self.seed * 1_000_003 + index * 1009 + delivery)
        return rng.random() if rng.random() < self.crash_share else None


@dataclass
class Outcome:
    setup: str
    timeouts: str  #: the lease(s) the set-up gave, for the table
    messages: int
    seconds: float
    duplicates: int  #: deliveries while a live consumer still worked on the message
    crashes: int
    dead_lettered: int  #: messages that used up their receives (work lost)
    recovery: list[float] = field(default_factory=list)  #: crash -> redelivery, seconds
    timeout_path: list[float] = field(default_factory=list)  #: auto-tune: the timeouts set
    #: (type, "heartbeat" | "no heartbeat") of the crash -> its crash -> redelivery times
    recovery_by: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    #: the leases' duplicates per million deliveries predicted from the workload's
    #: distributions (None: leases that change during the run)
    predicted_dpm: float | None = None
    wasted: float = 0.0  #: seconds of finished runs whose delete was refused (a lapsed lease)
    work: float = 0.0  #: seconds of all runs (finished or not)
    unrecovered: int = 0  #: failed deliveries not delivered again by the end (timed runs)

    def row(self) -> dict[str, Any]:
        rec = sorted(self.recovery)
        return {
            "setup": self.setup,
            "timeouts": self.timeouts,
            "messages": self.messages,
            "duplicates": self.duplicates,
            "predicted_duplicates_per_million": self.predicted_dpm,
            "crashes": self.crashes,
            "dead_lettered": self.dead_lettered,
            "recovery_mean_s": statistics.fmean(rec) if rec else None,
            "recovery_p99_s": _p99(rec) if rec else None,
            "throughput_per_s": self.messages / self.seconds if self.seconds else None,
            "wasted_s": self.wasted,
            "work_s": self.work,
            "unrecovered": self.unrecovered,
            "seconds": self.seconds,
            "timeout_path": self.timeout_path,
            "recovery_by": {
                f"{t}/{kind}": {"crashes": len(v), "mean_s": statistics.fmean(v), "p99_s": _p99(v)}
                for (t, kind), v in sorted(self.recovery_by.items()) if v
            },
        }

    def of_type(self, type: str) -> list[float]:
        return [x for (t, _), v in self.recovery_by.items() if t == type for x in v]


def _history(conn: Any, queue: str, types: Sequence[str], works: Sequence[float]) -> None:
    """Yesterday's history of ``queue``: one finished message per (type, processing time)."""
    conn.execute(
        "INSERT INTO queue_pg.message_history (queue_id, queue, message_id, outcome, enqueued_at,"
        " first_received_at, last_received_at, finished_at, receive_count, lease_expiries, type)"
        " SELECT q.id, q.name, -w.i, 'deleted', f.at - make_interval(secs => w.work + 0.01),"
        "        f.at - make_interval(secs => w.work), f.at - make_interval(secs => w.work),"
        "        f.at, 1, 0, w.type"
        " FROM queue_pg.queues q,"
        "      unnest(%s::text[], %s::float8[]) WITH ORDINALITY w(type, work, i),"
        "      LATERAL (SELECT queue_pg.now() - interval '12 hours'"
        "                      + w.i * interval '1 second') f(at)"
        " WHERE q.name = %s",
        [list(types), list(works), queue],
    )


def _p99(values: Sequence[float]) -> float:
    v = sorted(values)
    pos = 0.99 * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def type_leases(client: queue_pg.Client, w: Workload) -> dict[str, float]:
    """The lease each type of "jobs" gets under lease_policy 'per_type' (the duplicate budget's
    lease, or the rule on thin history; a type without one gets the queue's timeout)."""
    default = client.get_queue("jobs").visibility_timeout
    got = {r.type: r.lease for r in client.lease_advice("jobs")
           if r.scope == "type" and r.type is not None and r.lease is not None and r.samples >= 30}
    return {t: got.get(t, default) for t in w.shares()}


def predicted_risk(setup: str, client: queue_pg.Client, w: Workload) -> float | None:
    """Duplicates per million deliveries of a set-up's leases, predicted from the workload's
    distributions (None: leases that change during the run, or a queue per type)."""
    if setup == "per-type":
        return 1e6 * w.risk(type_leases(client, w))
    if setup in ("sqs-default", "best-fixed", "equal-risk", *FIXED_MULTIPLES):
        return 1e6 * w.risk(dict.fromkeys(w.shares(), client.get_queue("jobs").visibility_timeout))
    return None


def _prepare(client: queue_pg.Client, conn: Any, setup: str, w: Workload) -> tuple[list[str], str]:
    """Make the set-up's queue(s); returns the queues consumers read and a label of the leases."""
    sqs = 30 * SCALE
    types, works = w.yesterday()
    # as SQS users do: a redrive policy, so work that never fits its lease ends in a DLQ
    client.create_queue(DLQ)
    client.create_queue("jobs", visibility_timeout=sqs, max_lease=3600, dead_letter_queue=DLQ,
                        max_receive_count=MAX_RECEIVES)
    if setup == "sqs-default":
        return ["jobs"], f"{sqs:g} s"
    _history(conn, "jobs", types, works)
    if setup == "best-fixed":
        fixed = max(1.0, math.ceil(6 * w.quantile(0.99)))
        client.alter_queue("jobs", visibility_timeout=fixed)
        return ["jobs"], f"{fixed:g} s"
    if setup in FIXED_MULTIPLES:
        fixed = round(FIXED_MULTIPLES[setup] * w.quantile(0.99), 3)
        client.alter_queue("jobs", visibility_timeout=fixed)
        return ["jobs"], f"{fixed:g} s"
    if setup == "equal-risk":
        risk = w.risk(type_leases(client, w))
        fixed = round(w.fixed_of_risk(risk), 3)
        client.alter_queue("jobs", visibility_timeout=fixed)
        return ["jobs"], f"{fixed:g} s"
    if setup == "auto-tune":
        client.alter_tuning("jobs", auto_tune=True)
        return ["jobs"], f"from {sqs:g} s"
    if setup == "per-type":
        client.alter_tuning("jobs", lease_policy="per_type")
        leases = type_leases(client, w)
        return ["jobs"], ", ".join(f"{t} {v:g} s" for t, v in sorted(leases.items()))
    parts = client.split("jobs", apply=True)
    return ["jobs"] + [p.target for p in parts if p.routed], ", ".join(
        f"{p.type} {p.visibility_timeout:g} s" for p in parts
    )


def run_setup(dsn: str, setup: str, w: Workload, log: Callable[[str], None]) -> Outcome:
    """One set-up on the database of ``dsn`` (installed, empty)."""
    types, works = w.types(), w.works()
    lock = threading.Lock()
    working: dict[int, int] = {}  #: message index -> live deliveries now
    crashed_at: dict[int, tuple[float, str]] = {}  #: message index -> when and which kind crashed
    recovery: list[float] = []
    recovery_by: dict[tuple[str, str], list[float]] = {}
    duplicates = 0
    crashes = 0
    done = threading.Event()
    finished: set[int] = set()
    path: list[float] = []
    with queue_pg.Client(dsn, sweep_interval=None, max_size=w.consumers + 4) as client, \
            db.connect(dsn) as conn:
        queues, label = _prepare(client, conn, setup, w)
        predicted = predicted_risk(setup, client, w)
        began = time.monotonic()

        sent = 0

        def produce() -> None:
            """At the workload's rate, in batches of 10: a queue that keeps up, so a redelivery
            waits for its lease, not for a backlog. With ``w.backlog``: about that many visible."""
            nonlocal sent
            if w.backlog is not None:
                while not done.is_set() and sent < w.messages:
                    n = min(w.backlog - client.stats("jobs").visible, w.messages - sent)
                    if n > 0:
                        client.send_batch("jobs", list(range(sent, sent + n)),
                                          attributes=[{"type": t} for t in types[sent:sent + n]])
                        sent += n
                    done.wait(0.05)
                return
            for start in range(0, w.messages, 10):
                due = began + start / w.rate
                time.sleep(max(0.0, due - time.monotonic()))
                n = min(10, w.messages - start)
                client.send_batch("jobs", list(range(start, start + n)),
                                  attributes=[{"type": t} for t in types[start:start + n]])

        def work(queue: str, receipt: str, seconds: float, beat: bool) -> None:
            """Works ``seconds``; a heartbeating consumer renews its lease every third of it
            meanwhile (from the receive: a renewal that finds the lease gone stops)."""
            end = time.monotonic() + seconds
            while beat:
                left = end - time.monotonic()
                if left <= HEARTBEAT_LEASE / 3:
                    break
                time.sleep(HEARTBEAT_LEASE / 3)
                try:
                    client.change_visibility(queue, receipt, HEARTBEAT_LEASE)
                except queue_pg.StaleReceipt:
                    break
            time.sleep(max(0.0, end - time.monotonic()))

        def register() -> tuple[Any, int | None]:
            """A consumer process starting: its registration on a connection of its own."""
            if not w.detect_crashes:
                return None, None
            reg = db.connect(dsn)
            return reg, client.register_consumer(reg)

        wasted = 0.0
        work_total = 0.0
        closing = threading.Event()  #: a timed run's end: no more failures

        def consume(me: int) -> None:
            nonlocal duplicates, crashes, wasted, work_total
            turn = me
            beat = me < w.heartbeating
            kind = "heartbeat" if beat else "no heartbeat"
            reg, consumer = register()
            while not done.is_set():
                queue = queues[turn % len(queues)]
                turn += 1
                got = client.receive(queue, max_messages=1, wait=0.05, consumer=consumer,
                                     visibility_timeout=HEARTBEAT_LEASE if beat else None)
                if not got:
                    continue
                m = got[0]
                i = int(m.body)
                now = time.monotonic()
                with lock:
                    if working.get(i):
                        duplicates += 1
                    if i in crashed_at:
                        at, who = crashed_at.pop(i)
                        recovery.append(now - at)
                        recovery_by.setdefault((types[i], who), []).append(now - at)
                    working[i] = working.get(i, 0) + 1
                share = None if closing.is_set() else w.crashes(i, m.receive_count)
                spent = works[i] * (share if share is not None else 1.0)
                work(queue, m.receipt or "", spent, beat)
                with lock:
                    work_total += spent
                    working[i] -= 1
                    if share is not None:
                        crashes += 1
                        crashed_at[i] = (time.monotonic(), kind)
                if share is not None:
                    if reg is not None and w.failure == "crash":
                        # the process dies with its session; a new one starts (a hung consumer's
                        # process and session live on: nothing ends its lease early)
                        reg.close()
                        reg, consumer = register()
                    continue
                try:
                    deleted = client.delete(queue, m.receipt or "")
                except queue_pg.StaleReceipt:
                    deleted = False  # its lease lapsed and another consumer has it
                if not deleted:  # (or it was dead-lettered meanwhile: counted as such)
                    with lock:
                        wasted += spent
                    continue
                with lock:
                    finished.add(i)
                    if len(finished) == w.messages:
                        done.set()
            if reg is not None:
                reg.close()

        def reap() -> None:
            """Each worker reaps every REAP_INTERVAL: together, w.consumers times as often."""
            while not done.wait(REAP_INTERVAL / w.consumers):
                client.reap_consumers()

        def maintain() -> None:
            while not done.wait(1.0):
                client.sweep()  # which runs a step itself once per tune_interval
                client.tune()

        threads = [threading.Thread(target=consume, args=(k,)) for k in range(w.consumers)]
        threads.append(threading.Thread(target=produce))
        if setup == "auto-tune":
            threads.append(threading.Thread(target=maintain))
        if w.detect_crashes:
            threads.append(threading.Thread(target=reap))
        for t in threads:
            t.start()
        deadline = began + (300 if w.seconds is None else w.seconds + DRAIN_MAX)
        dead = 0
        while not done.wait(0.5):
            dead = client.stats(DLQ).visible
            if w.seconds is not None and time.monotonic() > began + w.seconds:
                closing.set()
            with lock:
                if len(finished) + dead >= w.messages:
                    done.set()
                if closing.is_set() and not crashed_at:
                    done.set()
            if time.monotonic() > deadline:
                log(f"  {setup}: gave up after {deadline - began:g} s with {len(finished)}"
                    f" finished, {len(crashed_at)} failed deliveries not back")
                done.set()
        for t in threads:
            t.join()
        seconds = time.monotonic() - began
        if setup == "auto-tune":  # every change, by tune() or by sweep's own step
            log_ = sorted(client.tuning_log("jobs"), key=lambda c: c.at)
            path.extend(c.new_timeout for c in log_)
            label += " to " + " -> ".join(f"{x:g}" for x in path) + " s" if path else ""
    return Outcome(setup, label, len(finished), seconds, duplicates, crashes, dead, recovery,
                   path, recovery_by, predicted, wasted, work_total, len(crashed_at))


CONVERGE_MEDIAN = 0.5  #: seconds: the convergence runs' work (lognormal, sigma CONVERGE_SIGMA)
CONVERGE_SIGMA = 0.25
CONVERGE_STARTS = {"too low": 1.0, "too high": 60.0}
CONVERGE_SECONDS = 45.0


def converge(dsn: str, start: float, log: Callable[[str], None]) -> dict[str, Any]:
    """The tuner from a bad start on a queue of one type whose work takes a known time: 8
    consumers, ``queue_pg.tune_interval`` 1 s (``ALTER DATABASE``, the documented way), a
    maintenance thread that sweeps every 0.5 s as workers do. Returns the path of timeouts, the
    tuner's target at the end, and the steps and seconds until the timeout was first within 25%
    of it, and how often the path changed direction (flapping)."""
    rng = random.Random(7)
    with db.connect(dsn) as conn:
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET queue_pg.tune_interval = '1 second'")
    path: list[tuple[float, float]] = [(0.0, start)]  #: (seconds since start, timeout)
    done = threading.Event()
    with queue_pg.Client(dsn, sweep_interval=None, max_size=12) as client:
        client.create_queue("c", visibility_timeout=start, max_lease=3600)
        client.alter_tuning("c", auto_tune=True)
        began = time.monotonic()

        def consume() -> None:
            while not done.is_set():
                for m in client.receive("c", max_messages=1, wait=0.1):
                    time.sleep(float(m.body))
                    with contextlib.suppress(queue_pg.StaleReceipt):  # lapsed: another has it
                        client.delete("c", m.receipt or "")

        def produce() -> None:
            while not done.is_set():
                client.send_batch("c", [rng.lognormvariate(math.log(CONVERGE_MEDIAN),
                                                           CONVERGE_SIGMA) for _ in range(6)])
                done.wait(0.5)

        def maintain() -> None:
            while not done.wait(0.5):
                client.sweep()
                q = client.get_queue("c")
                if q.visibility_timeout != path[-1][1]:
                    path.append((time.monotonic() - began, q.visibility_timeout))

        threads = [threading.Thread(target=consume) for _ in range(8)]
        threads += [threading.Thread(target=produce), threading.Thread(target=maintain)]
        for t in threads:
            t.start()
        time.sleep(CONVERGE_SECONDS)
        done.set()
        for t in threads:
            t.join()
        [step] = client.tune("c", apply=False)
        target = step.advice
    p99 = CONVERGE_MEDIAN * math.exp(2.3263 * CONVERGE_SIGMA)
    reached = next(((i, at) for i, (at, v) in enumerate(path)
                    if target and abs(v - target) <= 0.25 * v), None)
    moves = [b[1] - a[1] for a, b in itertools.pairwise(path)]
    flips = sum(1 for a, b in itertools.pairwise(moves) if (a > 0) != (b > 0))
    out = {"start": start, "target": target, "work_p99": p99,
           "path": [v for _, v in path], "at": [round(at, 1) for at, _ in path],
           "steps_to_reach": None if reached is None else reached[0],
           "seconds_to_reach": None if reached is None else reached[1],
           "direction_changes": flips, "final": path[-1][1]}
    log(f"  converge from {start:g} s: {out}")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=6000, help="messages (default 6000)")
    parser.add_argument("--consumers", type=int, default=12, help="consumer threads (default 12)")
    parser.add_argument("--heartbeating", type=int, default=None,
                        help="of the consumers, how many heartbeat (default half)")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="messages sent per second (default 100, well below what the"
                        " consumers can finish)")
    parser.add_argument("--history", type=int, default=20000,
                        help="yesterday's finished messages the advice starts from (default 20000)")
    parser.add_argument("--runs", type=int, default=1,
                        help="runs of each set-up (default 1; the draws are the same, the timing"
                        " differs)")
    parser.add_argument("--only", default=None,
                        help="comma-separated set-ups to run (default all)")
    parser.add_argument("--mix", type=_mixes, default=DEFAULT_MIX,
                        help="the types of the queue (default rare-slow: 0.5%% slow, which a p99"
                        " of the whole queue misses; common-slow: 3%% slow; three-types: 2%%"
                        " medium and 0.5%% slow; bimodal: fast 40 ms median / 150 ms p99 and"
                        " slow 600 ms / 2.5 s, half each; lognormal: one type, median 0.1 s,"
                        " sigma 0.5; pareto: one type, alpha 1.5, median 0.05 s; with --seconds"
                        " a comma-separated list)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="a timed run of each configuration (the matrix of --mix x --backlog"
                        " x --failure x --seeds x set-ups, in one process): this many seconds,"
                        f" then no new failures and up to {DRAIN_MAX:g} s for the failed work to"
                        " come back; set-ups default to " + ", ".join(TIMED_SETUPS))
    parser.add_argument("--backlog", default=None,
                        help="with --seconds: comma-separated backlogs to keep visible (e.g. 50,5)"
                        " instead of sending at --rate")
    parser.add_argument("--failure", default="crash",
                        help="with --seconds: comma-separated kinds of failure, crash (the process"
                        " dies) and/or hang (the consumer lives on and neither deletes nor"
                        " heartbeats the message); default crash")
    parser.add_argument("--seeds", default="1",
                        help="with --seconds: comma-separated seeds of the draws (default 1)")
    parser.add_argument("--fail-share", type=float, default=0.05,
                        help="share of deliveries that crash or hang (default 0.05)")
    parser.add_argument("--no-detect-crashes", dest="detect_crashes", action="store_false",
                        help="consumers do not register: a crashed consumer's leases lapse")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 80 messages, shorter slow jobs, two set-ups")


def _mixes(value: str) -> str:
    known = sorted(MIXES) + sorted(SHAPES)
    if bad := [m for m in value.split(",") if m not in known]:
        raise argparse.ArgumentTypeError(f"unknown mix(es) {bad}; known: {', '.join(known)}")
    return value


def _workload(args: argparse.Namespace) -> Workload:
    if args.seconds is not None:
        raise SystemExit("--seconds: see run_timed")
    if "," in args.mix:
        raise SystemExit("--mix: a list needs --seconds")
    if args.mix in SHAPES:
        shape: dict[str, Any] = dict(SHAPES[args.mix])
        size = (dict(messages=80, consumers=6, heartbeating=3, rate=40, history=400)
                if args.quick else
                dict(messages=int(args.messages * args.scale), consumers=args.consumers,
                     heartbeating=(args.consumers // 2 if args.heartbeating is None
                                   else args.heartbeating),
                     rate=args.rate, history=args.history))
        return Workload(**shape, **size, sigma=shape.get("fast_sigma", 0.4),
                        crash_share=args.fail_share,
                        detect_crashes=args.detect_crashes)
    if args.quick:
        return Workload(messages=80, slow_share=0.05, fast_median=0.02, slow_median=0.3,
                        sigma=0.3, crash_share=0.05, consumers=6, heartbeating=3, rate=40,
                        history=400, detect_crashes=args.detect_crashes)
    slow_share, slow_median, medium_share, medium_median = MIXES[args.mix]
    return Workload(messages=int(args.messages * args.scale), slow_share=slow_share,
                    medium_share=medium_share, medium_median=medium_median,
                    fast_median=0.02, slow_median=slow_median, sigma=0.4, crash_share=0.05,
                    consumers=args.consumers,
                    heartbeating=(args.consumers // 2 if args.heartbeating is None
                                  else args.heartbeating),
                    rate=args.rate, history=args.history, detect_crashes=args.detect_crashes)


def run(args: argparse.Namespace) -> int:
    if args.seconds is not None:
        return run_timed(args)
    w = _workload(args)
    setups: Sequence[str] = ("sqs-default", "per-type") if args.quick else SETUPS
    if args.only:
        setups = [s for s in args.only.split(",") if s]
        if unknown := set(setups) - set(SETUPS):
            raise SystemExit(f"--only: unknown set-up(s) {sorted(unknown)}; known: {SETUPS}")
    runs = max(1, args.runs)
    out = Path(args.out) if args.out else DEFAULT_OUT

    def log(line: str) -> None:
        if not args.quiet:
            print(line, flush=True)

    log(f"tuning: {w.messages} messages ({w.describe()}), {w.consumers} consumers,"
        f" {w.crash_share:.0%} of deliveries crash; set-ups: {', '.join(setups)}")
    rows = []
    machine: dict[str, Any] = {}
    for n in range(1, runs + 1):
        for setup in setups:
            with db.scratch_database(args.dsn, f"{args.database}_tuning", keep=args.keep) as dsn:
                migrate(dsn)
                if not machine:
                    with db.connect(dsn) as conn:
                        machine = machine_info(conn)
                outcome = run_setup(dsn, setup, w, log)
            row = {"run": n, **outcome.row()}
            rows.append(row)
            log(f"  {setup} (run {n}): {row}")
    rows.sort(key=lambda r: (SETUPS.index(r["setup"]), r["run"]))
    convergence = []
    # the tuner's runs do not depend on the mix: with the default one only
    if not args.quick and not args.only and args.mix == DEFAULT_MIX:
        for n in range(1, runs + 1):
            for label, start in CONVERGE_STARTS.items():
                name = f"{args.database}_tuning"
                with db.scratch_database(args.dsn, name, keep=args.keep) as dsn:
                    migrate(dsn)
                    convergence.append({"run": n, "label": label, **converge(dsn, start, log)})
    table = markdown_table(
        ["set-up", "run", "timeout(s)", "predicted duplicates / million", "duplicates",
         "dead-lettered", "crashes", "crash to redelivery mean s", "p99 s", "throughput msg/s"],
        [[r["setup"], r["run"], r["timeouts"], _fmt(r["predicted_duplicates_per_million"]),
          r["duplicates"], r["dead_lettered"], r["crashes"],
          _fmt(r["recovery_mean_s"]), _fmt(r["recovery_p99_s"]), _fmt(r["throughput_per_s"])]
         for r in rows],
        "lrlrrrrrrr",
    )
    groups = [f"{t}/{k}" for t in w.kinds() for k in ("heartbeat", "no heartbeat")]
    by_type = markdown_table(
        ["set-up", "run"] + [f"{g}: crashes, mean / p99 s" for g in groups],
        [[r["setup"], r["run"]] + [_group(r["recovery_by"].get(g)) for g in groups]
         for r in rows],
        "lr" + "r" * len(groups),
    )
    md = (f"# Visibility timeout set-ups on one mixed queue\n\n"
          f"`{getattr(args, 'command_line', 'python -m bench tuning')}`\n\n"
          f"{machine_line(machine)}\n\n"
          f"{w.messages} messages, {w.describe()};"
          f" sent at {w.rate:g} per second; {w.consumers} consumers, {w.heartbeating} of which"
          f" heartbeat (lease {HEARTBEAT_LEASE:g} s, renewed every third of it) and the others"
          f" never do;"
          f" {w.crash_share:.0%} of deliveries crash part way;"
          + (f" each consumer registers as workers do and a crash ends its session, so its"
             f" lease ends once a reap (every {REAP_INTERVAL / w.consumers:.2g} s, as"
             f" {w.consumers} workers reaping every {REAP_INTERVAL:g} s) has found it gone for"
             f" the grace period (2 s), or lapses first;" if w.detect_crashes else
             " consumers do not register (`--no-detect-crashes`): a crashed one's lease"
             " lapses;")
          + f" max_receive_count {MAX_RECEIVES}"
          f" with a dead-letter queue; {sum(t != 'fast' for t in w.types())}"
          f" {'slow and medium' if w.medium_share else 'slow'} messages in"
          f" the run. The advice starts from {w.history} finished messages of yesterday (the same"
          f" distributions, another draw); best-fixed is 6 x p99 of the whole queue's"
          f" distribution (p99 {w.quantile(0.99):.3g} s), equal-risk the fixed timeout of the"
          f" per-type leases' predicted risk (both from the distributions, not a sample)."
          f"\n\n{table}\n\nCrash to redelivery by the crashed message's type and the kind of"
          f" consumer that crashed (a crash whose message another consumer already held and"
          f" finished has no redelivery):\n\n{by_type}\n")
    if convergence:
        conv = markdown_table(
            ["start", "run", "target at the end", "path (s)", "steps to within 25%",
             "seconds to within 25%", "direction changes"],
            [[f"{c['label']} ({c['start']:g} s)", c["run"], _fmt(c["target"]),
              " -> ".join(f"{v:g}" for v in c["path"]), c["steps_to_reach"] if
              c["steps_to_reach"] is not None else "not reached", _fmt(c["seconds_to_reach"]),
              c["direction_changes"]] for c in convergence],
            "lrrlrrr",
        )
        md += (f"\nThe tuner from a bad start (`auto_tune`, `queue_pg.tune_interval` 1 s, sweep"
               f" every 0.5 s, 8 consumers that never heartbeat; one type, lognormal median"
               f" {CONVERGE_MEDIAN:g} s, sigma {CONVERGE_SIGMA:g}: p99"
               f" {CONVERGE_MEDIAN * math.exp(2.3263 * CONVERGE_SIGMA):.2f} s; {CONVERGE_SECONDS:g}"
               f" s each):\n\n{conv}\n")
    name = RESULT_NAME if args.mix == DEFAULT_MIX else f"{RESULT_NAME}-{args.mix}"
    write_results(out, name, {"workload": asdict(w), "machine": machine, "rows": rows,
                                     "convergence": convergence}, md)
    log(md)
    return 0


def _group(g: dict[str, Any] | None) -> str:
    return "-" if not g else f"{g['crashes']}: {g['mean_s']:.2f} / {g['p99_s']:.2f}"


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


SCENARIO = Scenario(
    name="tuning",
    help="visibility timeouts on a mixed queue: SQS default, best fixed, auto-tune, per type,"
    " routing",
    add_arguments=add_arguments,
    run=run,
)


def _timed_workload(mix: str, args: argparse.Namespace, backlog: int | None, failure: str,
                    seed: int) -> Workload:
    """A workload of ``mix`` for a timed run: messages enough for the run, the draws of ``seed``."""
    heartbeating = 0 if args.heartbeating is None else args.heartbeating
    size = dict(messages=max(args.messages, 50_000), consumers=args.consumers,
                heartbeating=heartbeating, rate=args.rate, history=args.history,
                crash_share=args.fail_share, detect_crashes=args.detect_crashes, seed=seed,
                failure=failure, backlog=backlog, seconds=args.seconds)
    if mix in SHAPES:
        shape: dict[str, Any] = dict(SHAPES[mix])
        return Workload(**shape, **size, sigma=shape.get("fast_sigma", 0.4))
    slow_share, slow_median, medium_share, medium_median = MIXES[mix]
    return Workload(slow_share=slow_share, medium_share=medium_share, medium_median=medium_median,
                    fast_median=0.02, slow_median=slow_median, sigma=0.4, **size)


def run_timed(args: argparse.Namespace) -> int:
    """The matrix: each mix x backlog x failure x seed x set-up for ``args.seconds`` seconds, in
    this process; the results are written again after every configuration (a run cut short keeps
    what it measured). The summary pools the seeds: duplicates per 1,000 finished messages, wasted
    work (seconds of finished runs whose delete was refused, as a share of all work), and the
    mean and p99 of failure-to-redelivery."""
    setups: Sequence[str] = TIMED_SETUPS
    if args.only:
        setups = [s for s in args.only.split(",") if s]
        if unknown := set(setups) - set(SETUPS):
            raise SystemExit(f"--only: unknown set-up(s) {sorted(unknown)}; known: {SETUPS}")
    mixes = args.mix.split(",")
    backlogs: list[int | None] = ([int(b) for b in args.backlog.split(",")] if args.backlog
                                  else [None])
    failures = args.failure.split(",")
    if bad := set(failures) - {"crash", "hang"}:
        raise SystemExit(f"--failure: unknown {sorted(bad)}; known: crash, hang")
    seeds = [int(x) for x in args.seeds.split(",")]
    out = Path(args.out) if args.out else DEFAULT_OUT
    name = f"{RESULT_NAME}-timed-" + "-".join(mixes)

    def log(line: str) -> None:
        if not args.quiet:
            print(line, flush=True)

    rows: list[dict[str, Any]] = []
    machine: dict[str, Any] = {}
    for mix, backlog, failure in itertools.product(mixes, backlogs, failures):
        for seed in seeds:
            w = _timed_workload(mix, args, backlog, failure, seed)
            for setup in setups:
                with db.scratch_database(args.dsn, f"{args.database}_tuning",
                                         keep=args.keep) as dsn:
                    migrate(dsn)
                    if not machine:
                        with db.connect(dsn) as conn:
                            machine = machine_info(conn)
                    outcome = run_setup(dsn, setup, w, log)
                row = {"mix": mix, "backlog": backlog, "failure": failure, "seed": seed,
                       **outcome.row(), "recovery": outcome.recovery}
                rows.append(row)
                log(f"  {mix} backlog {backlog} {failure} seed {seed} {setup}: "
                    f"leases {row['timeouts']}, {row['duplicates']} duplicates,"
                    f" {row['crashes']} failed, recovery mean {_fmt(row['recovery_mean_s'])}"
                    f" p99 {_fmt(row['recovery_p99_s'])}, {row['messages']} finished")
                md = _timed_markdown(args, rows, machine)
                write_results(out, name, {"machine": machine, "rows": rows}, md)
    log(_timed_markdown(args, rows, machine))
    return 0


def _pooled_by_type(rows: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Type of the failed message -> (failures, mean failure-to-redelivery), the seeds pooled."""
    pooled: dict[str, list[float]] = {}  #: type -> [count, sum]
    for r in rows:
        for key, g in r["recovery_by"].items():
            acc = pooled.setdefault(key.split("/")[0], [0.0, 0.0])
            acc[0] += g["crashes"]
            acc[1] += g["crashes"] * g["mean_s"]
    return {t: (n, total / n) for t, (n, total) in sorted(pooled.items()) if n}


def _by_type(rows: list[dict[str, Any]]) -> str:
    """Mean failure-to-redelivery per type of the failed message, the seeds pooled."""
    return ", ".join(f"{t} {mean:.2f} ({n:.0f})"
                     for t, (n, mean) in _pooled_by_type(rows).items()) or "-"


def _share_weighted(rows: list[dict[str, Any]], shares: dict[str, float]) -> float | None:
    """The per-type means weighted by the mix's shares of the types instead of by how many
    failures happened to fall on each: the expected recovery of a failure that picks its type
    as the work does (a few dozen failures a run split 56/44 would otherwise tilt the mean)."""
    pooled = _pooled_by_type(rows)
    if not pooled or set(shares) - set(pooled):
        return None
    return sum(share * pooled[t][1] for t, share in shares.items())


def _timed_markdown(args: argparse.Namespace, rows: list[dict[str, Any]],
                    machine: dict[str, Any]) -> str:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["mix"], r["backlog"], r["failure"], r["setup"]), []).append(r)
    table = []
    for (mix, backlog, failure, setup), rs in groups.items():
        finished = sum(r["messages"] for r in rs)
        dups = sum(r["duplicates"] for r in rs)
        work = sum(r["work_s"] for r in rs)
        rec = [x for r in rs for x in r["recovery"]]
        leases = sorted({r["timeouts"] for r in rs})
        dpm = [r["predicted_duplicates_per_million"] for r in rs
               if r["predicted_duplicates_per_million"] is not None]
        shares = _timed_workload(mix, args, backlog, failure, 1).shares()
        table.append([mix, "-" if backlog is None else backlog, failure, setup,
                      " / ".join(leases), f"{max(dpm):.3g}" if dpm else "-", len(rs),
                      finished, dups, f"{1000 * dups / finished:.2f}" if finished else "-",
                      f"{100 * sum(r['wasted_s'] for r in rs) / work:.2f} %" if work else "-",
                      sum(r["crashes"] for r in rs), sum(r["unrecovered"] for r in rs),
                      _fmt(statistics.fmean(rec) if rec else None),
                      _fmt(_p99(rec) if rec else None), _fmt(_share_weighted(rs, shares)),
                      _by_type(rs)])
    body = markdown_table(
        ["mix", "backlog", "failure", "set-up", "lease(s)", "predicted dup / million", "seeds",
         "finished", "duplicates", "dup / 1,000", "wasted work", "failed", "not back",
         "recovery mean s", "p99 s", "mean s, types weighted by the mix", "mean s by type"],
        table, "lrllllrrrrrrrrrrl")
    return (f"# Visibility timeout set-ups at equal duplicate risk (timed runs)\n\n"
            f"`{getattr(args, 'command_line', 'python -m bench tuning')}`\n\n"
            f"{machine_line(machine)}\n\n"
            f"{args.seconds:g} s a configuration (then no new failures, and up to {DRAIN_MAX:g} s"
            f" for the failed work to come back), {args.consumers} consumers,"
            f" {args.fail_share:.0%} of deliveries fail part way; a hang leaves the consumer's"
            f" session alive (only the lease ends it), a crash ends it (a reap ends its leases);"
            f" seeds pooled. Recovery: seconds from the failure to the message's next delivery;"
            f" types weighted by the mix: each type's mean weighted by its share of the work."
            f" Wasted work: seconds of finished runs whose delete was refused (their lease had"
            f" lapsed), as a share of all the work.\n\n{body}\n")
