"""Consumers killed with SIGKILL at random points while messages keep coming.

Consumer processes kill themselves at chosen points (between a receive and its delete, inside a
heartbeat, inside a batch delete: a timer thread sends the SIGKILL while the call is running)
and the test kills others from outside at random moments; a supervisor replaces the dead. Then,
against the consumers' event logs and the server's history:

- every message sent was deleted exactly once (one 'deleted' history row, none left);
- each message's receives are numbered 1..k without gaps (no lease handed out twice);
- every redelivery came after the previous lease ended (its receive's or heartbeat's
  visible_until), and the history counts it as a lease expiry: the only redeliveries are lapses;
- every acknowledged delete was made with the message's last receipt.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import fault_agents
import psycopg
import pytest

from queue_pg import Client

pytestmark = pytest.mark.faults

LEASE = 1.5
MESSAGES = 1500
CONSUMERS = 4
DEADLINE = 75.0


def deleted_count(dsn: str, queue: str) -> int:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT count(*) FROM queue_pg.message_history WHERE queue = %s"
                        " AND outcome = 'deleted'", [queue]).fetchone()
    assert row is not None
    return int(row[0])


def test_sigkilled_consumers_lose_nothing_and_redeliver_only_lapsed_leases(
    clean: str, client: Client, tmp_path: Path
) -> None:
    queue = "killq"
    client.create_queue(queue, visibility_timeout=LEASE)
    sent: list[int] = []

    def produce() -> None:
        with Client(clean, max_size=1, sweep_interval=None) as producer:
            while len(sent) < MESSAGES:
                sent.extend(producer.send_batch(queue, [{"n": len(sent) + i} for i in range(50)]))
                time.sleep(0.02)

    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    seeds = iter(range(10_000))
    unexpected: list[tuple[int, int | None]] = []
    outside_kills = 0

    def spawn() -> None:
        p = ctx.Process(target=fault_agents.killable_consumer,
                        args=(clean, queue, LEASE, next(seeds), str(tmp_path), 0.03))
        p.start()
        procs.append(p)

    producer = threading.Thread(target=produce)
    producer.start()
    rng = random.Random(7)
    live: list[Any] = []
    for _ in range(CONSUMERS):
        spawn()
        live.append(procs[-1])
    deadline = time.monotonic() + DEADLINE
    next_outside = time.monotonic() + 1.0
    try:
        while time.monotonic() < deadline:
            for p in list(live):
                if not p.is_alive():
                    p.join()
                    live.remove(p)
                    if p.exitcode != -signal.SIGKILL:
                        unexpected.append((p.pid, p.exitcode))
                    spawn()
                    live.append(procs[-1])
            if time.monotonic() >= next_outside and live:  # a kill at no chosen point
                victim = rng.choice(live)
                if victim.pid is not None:
                    with open(tmp_path / f"consumer-{victim.pid}.jsonl", "a") as f:
                        f.write(f'{{"e": "kill", "point": "from outside", "pid": {victim.pid}}}\n')
                    os.kill(victim.pid, signal.SIGKILL)
                    outside_kills += 1
                next_outside = time.monotonic() + rng.uniform(0.8, 1.6)
            if len(sent) >= MESSAGES and deleted_count(clean, queue) == len(sent):
                break
            time.sleep(0.05)
    finally:
        producer.join()
        for p in live:
            p.kill()
        for p in procs:
            p.join(10)
    assert not unexpected, f"consumers that died of something else: {unexpected}"
    assert deleted_count(clean, queue) == len(sent), "not everything was deleted before the deadline"

    events = list(fault_agents.read_events(tmp_path))
    kills = Counter(e["point"] for e in events if e["e"] == "kill")
    leases: dict[int, list[dict[str, Any]]] = defaultdict(list)
    extended: dict[str, datetime] = {}
    acked: dict[int, list[str]] = defaultdict(list)
    for e in events:
        if e["e"] == "received":
            leases[e["id"]].append(e)
        elif e["e"] == "heartbeat":
            extended[e["receipt"]] = datetime.fromisoformat(e["until"])
        elif e["e"] == "deleted":
            acked[e["id"]].append(e["receipt"])

    with psycopg.connect(clean) as c:
        history = {r[0]: r[1:] for r in c.execute(
            "SELECT message_id, outcome, receive_count, lease_expiries, first_received_at,"
            " last_received_at FROM queue_pg.message_history WHERE queue = %s", [queue])}
        left = c.execute("SELECT count(*) FROM queue_pg.messages").fetchone()
        rows = c.execute("SELECT count(*) FROM queue_pg.message_history WHERE queue = %s",
                         [queue]).fetchone()
    assert left == (0,)
    assert rows == (len(sent),)  # one history row per message: deleted exactly once
    assert set(history) == set(sent)

    redelivered = Counter[str]()
    unlogged = 0  # receives granted to a process killed from outside before it logged them
    for mid in sent:
        outcome, receive_count, lease_expiries, _, _ = history[mid]
        assert outcome == "deleted"
        ls = sorted(leases[mid], key=lambda x: x["n"])
        numbers = [x["n"] for x in ls]
        # no receive number handed out twice, none beyond what the server counted
        assert len(set(numbers)) == len(numbers) and set(numbers) <= set(range(1, receive_count + 1)), (mid, ls)
        unlogged += receive_count - len(ls)
        # the only redeliveries are of leases that lapsed: counted as such by the server ...
        assert lease_expiries == receive_count - 1, (mid, ls)
        redelivered["holder SIGKILLed inside a receive"] += receive_count - len(ls)
        for prev, cur in pairwise(ls):
            if cur["n"] != prev["n"] + 1:
                continue  # a lease in between was never logged
            # ... and each began after the previous lease's end as its holder last knew it
            until = datetime.fromisoformat(prev["until"])
            end = max(until, extended.get(prev["receipt"], until))
            began = datetime.fromisoformat(cur["until"]).timestamp() - LEASE  # server time
            assert began >= end.timestamp() - 0.001, (mid, prev, cur)
            killed = any(e["e"] == "kill" and e["pid"] == prev["pid"] for e in events)
            redelivered["holder SIGKILLed" if killed else "holder too slow"] += 1
        # an acknowledged delete used the last receipt; earlier holders never deleted it
        assert all(r == ls[-1]["receipt"] for r in acked[mid]), (mid, acked[mid], ls)
        assert len(acked[mid]) <= 1

    # only a kill from outside can land inside a receive (after its commit, before its messages
    # are logged), and each kills one receive at most: a batch of up to MAX_BATCH messages
    assert unlogged <= fault_agents.MAX_BATCH * outside_kills, (unlogged, outside_kills)
    injected = sum(kills.values())
    assert kills["between receive and delete"] > 0 and kills["inside a heartbeat"] > 0
    assert kills["inside a batch delete"] > 0 and outside_kills > 0
    duplicates = sum(redelivered.values())
    print(f"\n[faults] SIGKILL consumers: {injected} kills ({dict(kills)}), {len(procs)} consumer"
          f" processes, sent {len(sent)}, deleted {len(history)}, lost 0, duplicates"
          f" {duplicates} ({dict(redelivered)}; each after its lease lapsed),"
          f" deletes acknowledged {sum(map(len, acked.values()))}")
