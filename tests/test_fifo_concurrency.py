"""Many consumers on one FIFO queue, threads and processes, with short leases, releases and
"crashes" (leases left to lapse). From what each consumer was handed and the server's history:

- every message was deleted exactly once and the queue is empty;
- no group was ever held by two receives at once: a receive that took messages of a group began
  at or after every earlier receive's messages of that group ended (its delete, from the
  history; its release; its lapse);
- a receive takes a group's messages in send order, and exactly the first ones still in the
  queue when it began (those not deleted by then): per-group order is never broken;
- each group's messages were first delivered in send order.

Receives take up to 4 messages, so a group's messages often come several in one receive.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import psycopg
import pytest

from queue_pg import Client, MessageNotFound, StaleReceipt

LEASE = 0.4
GROUPS = 12
PER_GROUP = 25
DEADLINE = 60.0


@dataclass
class Lease:
    group: str
    seq: int
    id: int
    receipt: str
    start: datetime
    end: datetime  # visible_until, or when it was released; a delete's time comes from history
    take: int  # which receive handed it out (a consumer's seed and call number)
    deleted: bool = False


@dataclass
class Tally:
    leases: list[Lease] = field(default_factory=list)


def consume(client: Client, queue: str, seed: int) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    deadline = time.monotonic() + DEADLINE
    calls = 0
    while time.monotonic() < deadline:
        got = client.receive(queue, rng.randint(1, 4), visibility_timeout=LEASE)
        calls += 1
        if not got:
            s = client.stats(queue)  # one reading: three could each miss a lease that lapsed between
            if s.visible + s.in_flight + s.delayed == 0:
                return tally
            time.sleep(0.01)
            continue
        for m in got:
            lease = Lease(m.body["g"], m.body["i"], m.id, m.receipt or "",
                          m.visible_until - timedelta(seconds=LEASE), m.visible_until,
                          seed * 1_000_000 + calls)
            tally.leases.append(lease)
            roll = rng.random()
            time.sleep(rng.uniform(0, 0.01))
            if roll < 0.05:  # "crash": the lease lapses
                continue
            if roll < 0.10:  # give it back
                # a stall past the lease: someone else has it (stale) or deleted it (gone)
                with contextlib.suppress(StaleReceipt, MessageNotFound):
                    lease.end = client.change_visibility(queue, lease.receipt, 0)
                continue
            with contextlib.suppress(StaleReceipt):
                lease.deleted = client.delete(queue, lease.receipt)
    raise AssertionError("consumer ran out of time")


def consume_in_process(dsn: str, queue: str, seed: int) -> Tally:
    with Client(dsn, sweep_interval=None) as client:
        return consume(client, queue, seed)


def load(client: Client) -> None:
    client.create_queue("fifo", fifo=True, visibility_timeout=LEASE)
    rng = random.Random(7)
    nxt = dict.fromkeys(range(GROUPS), 0)
    while any(n < PER_GROUP for n in nxt.values()):  # batches that mix groups
        batch = []
        for _ in range(rng.randint(1, 8)):
            g = rng.choice([g for g, n in nxt.items() if n < PER_GROUP] or [0])
            if nxt[g] < PER_GROUP:
                batch.append((g, nxt[g]))
                nxt[g] += 1
        if batch:
            client.send_batch("fifo", [{"g": f"g{g}", "i": i} for g, i in batch],
                              group=[f"g{g}" for g, _ in batch])


def check(dsn: str, tallies: list[Tally]) -> None:
    leases = [lease for t in tallies for lease in t.leases]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT message_id, finished_at, outcome FROM queue_pg.message_history"
            " WHERE queue = 'fifo'").fetchall()
        left = conn.execute("SELECT count(*) FROM queue_pg.messages").fetchone()
        groups_left = conn.execute("SELECT count(*) FROM queue_pg.fifo_groups").fetchone()
    assert left == (0,) and groups_left == (0,)
    finished = {mid: at for mid, at, outcome in rows if outcome == "deleted"}
    assert len(rows) == len(finished) == GROUPS * PER_GROUP
    assert sum(lease.deleted for lease in leases) == GROUPS * PER_GROUP
    by_group: dict[str, list[Lease]] = defaultdict(list)
    for lease in leases:
        if lease.deleted:
            lease.end = finished[lease.id]
        by_group[lease.group].append(lease)
    assert len(by_group) == GROUPS
    together = 0  # receives that took several messages of one group
    for group, held in by_group.items():
        takes: dict[int, list[Lease]] = defaultdict(list)
        for lease in held:
            takes[lease.take].append(lease)
        ordered = sorted(takes.values(), key=lambda t: t[0].start)
        together += sum(len(take) > 1 for take in ordered)
        gone = {lease.seq: finished[lease.id] for lease in held if lease.deleted}
        ended = None
        for take in ordered:
            start = take[0].start
            assert all(lease.start == start for lease in take), take
            if ended is not None:
                assert start >= ended, (group, take)  # never held by two receives at once
            ended = max([ended or start, *(lease.end for lease in take)])
            seqs = [lease.seq for lease in take]
            left = sorted(seq for seq in range(PER_GROUP) if gone[seq] > start)
            assert seqs == left[:len(seqs)], (group, seqs, left)  # the first ones left, in order
        firsts = list(dict.fromkeys(lease.seq for take in ordered for lease in take))
        assert firsts == list(range(PER_GROUP)), group
    assert together > 0

def test_threads_keep_every_group_in_order_and_held_by_one(clean: str) -> None:
    with Client(clean, min_size=6, max_size=6, sweep_interval=None) as client:
        load(client)
        tallies: list[Tally] = []
        errors: list[BaseException] = []

        def run(seed: int) -> None:
            try:
                tallies.append(consume(client, "fifo", seed))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(seed,)) for seed in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    assert sum(1 for t in tallies if t.leases) >= 2  # the groups went in parallel
    check(clean, tallies)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [4])
def test_processes_keep_every_group_in_order_and_held_by_one(clean: str, workers: int) -> None:
    with Client(clean, sweep_interval=None) as client:
        load(client)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers) as pool:
        tallies = pool.starmap(consume_in_process, [(clean, "fifo", 50 + i) for i in range(workers)])
    check(clean, tallies)


def test_batches_over_many_groups_never_deadlock_with_deletes(clean: str) -> None:
    """A send_batch locks its groups' rows in sorted order and a delete_batch locks the groups of
    the heads it removes in the same order first: the two never wait on each other in a circle,
    whatever order the receipts come in."""
    import threading

    import psycopg

    from queue_pg import Client

    groups = [f"g{i:02d}" for i in range(12)]
    setup = Client(clean)
    setup.create_queue("fd", fifo=True, visibility_timeout=30)
    setup.send_batch("fd", [{"g": g} for g in groups], group=groups)
    setup.close()
    errors: list[BaseException] = []
    stop = threading.Event()

    def sender() -> None:
        c = Client(clean)
        try:
            while not stop.is_set():
                c.send_batch("fd", [{"g": g} for g in groups], group=groups)
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            c.close()

    def deleter() -> None:
        c = Client(clean)
        try:
            for _ in range(60):
                got = c.receive("fd", 10)
                # the receipts in the reverse order of their groups: the worst case for lock order
                got.sort(key=lambda m: m.body["g"], reverse=True)
                if got:
                    c.delete_batch("fd", [m.receipt for m in got])
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=sender) for _ in range(2)]
    threads += [threading.Thread(target=deleter) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads[2:]:
        t.join()
    stop.set()
    for t in threads[:2]:
        t.join()
    assert not [e for e in errors if isinstance(e, psycopg.errors.DeadlockDetected)], errors
    assert errors == []
