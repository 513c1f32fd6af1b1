"""Many consumers at once, threads and processes, against one queue with short leases.

Each consumer records every lease it is handed (server times from the Message) and what became
of it: deleted, refused as stale, found gone, released, or dropped by a "crash". The checks then
run against those records and the server's history:

- every message sent was deleted exactly once, and the queue is empty;
- no message was ever held by two live leases: for each message, its receives are numbered
  1, 2, 3, ... with no gap or repeat, and each began at or after the previous lease ended
  (its visible_until, or the moment its holder released it);
- every successful delete used the message's last receipt;
- refused deletes are StaleReceipt, and the queue's stale_receipts equals the refusals;
- lease_expiries equals the redeliveries that followed a lapse (per message too, in the history).
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

import psycopg
import pytest

from queue_pg import Client, MessageNotFound, OverLimit, StaleReceipt

LEASE = 0.5  # seconds: every receive asks for this visibility timeout
MESSAGES = 2000
DEADLINE = 45.0  # seconds a consumer may run before it gives up (the test then fails)


@dataclass
class Lease:
    """One receive of one message, as its consumer saw it."""

    id: int
    receipt: str
    receive_count: int
    start: datetime  # server time of the receive: visible_until - LEASE
    end: datetime  # when the lease ends: visible_until, or as its holder last set it
    released: bool = False  # ended on purpose by change_visibility(0)
    outcome: str = "dropped"  # deleted | gone | StaleReceipt | dropped (crashed) | released


@dataclass
class Tally:
    leases: list[Lease] = field(default_factory=list)
    stale: int = 0  # StaleReceipt refusals, from delete or change_visibility


def consume(client: Client, queue: str, seed: int) -> Tally:
    """Receive and settle until the queue is empty; act out crashes, slowness and releases."""
    rng = random.Random(seed)
    tally = Tally()
    deferred: list[tuple[float, Lease]] = []  # deletes of "slow" workers, due at a time

    def delete(lease: Lease) -> None:
        try:
            lease.outcome = "deleted" if client.delete(queue, lease.receipt) else "gone"
        except StaleReceipt:
            lease.outcome = "StaleReceipt"
            tally.stale += 1

    def change(lease: Lease, timeout: float) -> bool:
        try:
            lease.end = client.change_visibility(queue, lease.receipt, timeout)
            return True
        except StaleReceipt:
            lease.outcome = "StaleReceipt"
            tally.stale += 1
        except MessageNotFound:
            lease.outcome = "gone"
        return False

    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        now = time.monotonic()
        for item in [d for d in deferred if d[0] <= now]:
            deferred.remove(item)
            delete(item[1])
        got = client.receive(queue, rng.randint(1, 5), visibility_timeout=LEASE)
        if not got:
            if not deferred and _remaining(client, queue) == 0:
                return tally
            time.sleep(0.01)
            continue
        for m in got:
            assert m.receipt is not None
            lease = Lease(
                m.id,
                m.receipt,
                m.receive_count,
                m.visible_until - timedelta(seconds=LEASE),
                m.visible_until,
            )
            tally.leases.append(lease)
            roll = rng.random()
            if roll < 0.06:
                pass  # crash: the message comes back when the lease lapses
            elif roll < 0.24:  # too slow: deletes after the lease has lapsed
                deferred.append((time.monotonic() + rng.uniform(0.55, 0.9), lease))
            elif roll < 0.27:  # gives the message back at once
                if change(lease, 0):
                    lease.released = True
                    lease.outcome = "released"
            elif roll < 0.30:  # heartbeat: extends the lease, then deletes within it
                if change(lease, 1.0):
                    deferred.append((time.monotonic() + 0.3, lease))
            else:
                delete(lease)
    raise AssertionError(f"consumer {seed} still busy after {DEADLINE} s")


def _remaining(client: Client, queue: str) -> int:
    s = client.stats(queue)
    return s.visible + s.in_flight + s.delayed


def consume_in_process(dsn: str, queue: str, seed: int) -> Tally:
    """A consumer process with a Client of its own (multiprocessing spawn target)."""
    with Client(dsn, max_size=2, sweep_interval=None) as client:
        return consume(client, queue, seed)


def check_history(dsn: str, queue: str, sent: list[int], tallies: list[Tally]) -> None:
    leases = [lease for t in tallies for lease in t.leases]
    by_id: dict[int, list[Lease]] = defaultdict(list)
    for lease in leases:
        by_id[lease.id].append(lease)
    assert set(by_id) == set(sent)

    lapse_redeliveries: dict[int, int] = {}
    for mid, ls in by_id.items():
        ls.sort(key=lambda x: x.receive_count)
        # each receive handed out once, numbered without gaps: no two consumers got one lease
        assert [x.receive_count for x in ls] == list(range(1, len(ls) + 1)), mid
        assert len({x.receipt for x in ls}) == len(ls)
        for prev, cur in pairwise(ls):
            # never two live leases at once: a receive only after the previous lease ended
            assert cur.start >= prev.end, (mid, prev, cur)
        # exactly one successful delete, with the last receipt
        deleted = [x for x in ls if x.outcome == "deleted"]
        assert len(deleted) == 1, (mid, ls)
        assert deleted[0] is ls[-1], (mid, ls)
        # a refused or gone delete was by an earlier holder
        for x in ls[:-1]:
            assert x.outcome in ("StaleReceipt", "gone", "dropped", "released"), (mid, x)
        lapse_redeliveries[mid] = sum(1 for prev in ls[:-1] if not prev.released)

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT message_id, outcome, receive_count, lease_expiries"
            " FROM queue_pg.message_history WHERE queue = %s",
            (queue,),
        ).fetchall()
        left = conn.execute("SELECT count(*) FROM queue_pg.messages").fetchone()
        stats = conn.execute(
            "SELECT visible, in_flight, delayed, stale_receipts, lease_expiries"
            " FROM queue_pg.stats(%s)",
            (queue,),
        ).fetchone()
    assert left == (0,)
    assert Counter(r[1] for r in rows) == {"deleted": len(sent)}
    assert Counter(r[0] for r in rows) == Counter(sent)  # one 'deleted' row per message
    for mid, _, receive_count, lease_expiries in rows:
        assert receive_count == len(by_id[mid]), mid
        assert lease_expiries == lapse_redeliveries[mid], mid
    stale = sum(t.stale for t in tallies)
    assert stats == (0, 0, 0, stale, sum(lapse_redeliveries.values()))
    # the scenario really exercised what it claims to
    outcomes = Counter(x.outcome for x in leases)
    assert outcomes["dropped"] > 0 and outcomes["released"] > 0
    assert stale > 0 and sum(lapse_redeliveries.values()) > 0
    assert outcomes["deleted"] == len(sent)


@pytest.fixture
def loaded(client: Client) -> tuple[str, list[int]]:
    client.create_queue("work", visibility_timeout=LEASE)
    sent = client.send_batch("work", [{"n": i} for i in range(MESSAGES)])
    return "work", sent


def test_threads_share_the_work_without_double_leases(
    clean: str, loaded: tuple[str, list[int]]
) -> None:
    queue, sent = loaded
    tallies: list[Tally] = []
    errors: list[BaseException] = []
    with Client(clean, min_size=8, max_size=8, sweep_interval=None) as shared:

        def run(seed: int) -> None:
            try:
                tallies.append(consume(shared, queue, seed))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(seed,)) for seed in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    assert len(tallies) == 8
    check_history(clean, queue, sent, tallies)


@pytest.mark.slow
def test_processes_share_the_work_without_double_leases(
    clean: str, loaded: tuple[str, list[int]]
) -> None:
    queue, sent = loaded
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        tallies = pool.starmap(consume_in_process, [(clean, queue, 100 + i) for i in range(4)])
    assert all(t.leases for t in tallies)  # each process did part of the work
    check_history(clean, queue, sent, tallies)


def test_sixteen_threads_racing_for_one_visible_message(clean: str) -> None:
    with Client(clean, min_size=16, max_size=16, sweep_interval=None) as client:
        client.create_queue("race")
        barrier = threading.Barrier(16)
        for round_no in range(5):
            mid = client.send("race", round_no)
            results: list[Any] = [None] * 16

            def grab(i: int, results: list[Any] = results) -> None:
                barrier.wait()
                results[i] = client.receive("race", 10, visibility_timeout=30)

            threads = [threading.Thread(target=grab, args=(i,)) for i in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            winners = [r for r in results if r]
            assert all(r is not None for r in results)
            assert len(winners) == 1, results
            assert [m.id for m in winners[0]] == [mid]
            assert client.delete("race", winners[0][0].receipt) is True


def test_in_flight_limit_holds_under_concurrent_receivers(clean: str, client: Client) -> None:
    limit = 5
    client.create_queue("capped", in_flight_limit=limit, visibility_timeout=LEASE)
    client.send_batch("capped", list(range(300)))
    seen: list[int] = []
    over = Counter[str]()
    stop = threading.Event()

    def watch() -> None:  # samples live leases: received, not deleted, lease not lapsed
        with psycopg.connect(clean, autocommit=True) as c:
            while not stop.is_set():
                row = c.execute(
                    "SELECT count(*) FROM queue_pg.messages m JOIN queue_pg.queues q"
                    " ON q.id = m.queue_id WHERE q.name = 'capped'"
                    " AND m.visible_at > now() AND m.last_received_at IS NOT NULL"
                ).fetchone()
                assert row is not None
                seen.append(row[0])

    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            drain(seed)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def drain(seed: int) -> None:
        rng = random.Random(seed)
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            try:
                got = client.receive("capped", rng.randint(1, 3), visibility_timeout=LEASE)
            except OverLimit:
                over["short"] += 1
                got = client.receive("capped", 1, visibility_timeout=LEASE, wait=0.05)
            if not got and _remaining(client, "capped") == 0:
                return
            for m in got:
                time.sleep(rng.uniform(0, 0.01))
                if rng.random() < 0.05:
                    continue  # crash: the lease lapses
                client.delete("capped", m.receipt or "")

    watcher = threading.Thread(target=watch)
    watcher.start()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    watcher.join()
    if errors:
        raise errors[0]
    assert _remaining(client, "capped") == 0
    assert max(seen) <= limit
    assert max(seen) == limit and over["short"] > 0  # the limit was reached and enforced
