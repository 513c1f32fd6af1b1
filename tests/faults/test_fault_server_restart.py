"""The PostgreSQL server crashes (``pg_ctl stop -m immediate``) and restarts under load.

The server is this test's own embedded one (never the shared server). Two producers, a consumer
and a queue_pg.Worker run through three crashes. Afterwards:

- no acknowledged send is lost: each id a producer got back is still queued or was deleted;
- no acknowledged delete is undone: each is gone from the queue and in the history as deleted;
- every client and the worker reconnected on their own (the pools with backoff) and said so in
  their logs: a warning when the server went away, an info line when it was back;
- the worker handled messages after the last restart.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from pathlib import Path
from typing import Any

import fault_agents
import psycopg
import pytest

from queue_pg import Client
from queue_pg.embedded import EmbeddedServer
from queue_pg.install import migrate

pytestmark = pytest.mark.faults

RUN = 20.0  # seconds of load
CRASHES = (4.0, 9.0, 14.0)  # seconds into the run
DOWN = 1.5  # seconds the server stays down


def test_immediate_shutdown_loses_no_acknowledged_operation(
    own_server: EmbeddedServer, tmp_path: Path
) -> None:
    dsn = own_server.dsn
    migrate(dsn)
    queue = "crashq"
    with Client(dsn, sweep_interval=None) as c:
        c.create_queue(queue, visibility_timeout=2)

    ctx = multiprocessing.get_context("spawn")
    folder = str(tmp_path)
    procs: list[Any] = [
        ctx.Process(target=fault_agents.steady_producer, args=(dsn, queue, 1, folder, RUN)),
        ctx.Process(target=fault_agents.steady_producer, args=(dsn, queue, 2, folder, RUN)),
        ctx.Process(target=fault_agents.steady_consumer, args=(dsn, queue, 3, folder, RUN)),
    ]
    worker = ctx.Process(target=fault_agents.worker_consumer, args=(dsn, queue, folder))
    for p in [*procs, worker]:
        p.start()
    start = time.monotonic()
    restarted_at = 0.0
    try:
        for at in CRASHES:
            time.sleep(max(0.0, start + at - time.monotonic()))
            own_server.stop("immediate")
            time.sleep(DOWN)
            own_server.start()
            restarted_at = time.time()
        for p in procs:
            p.join(RUN + 60)
        # The consumer may have drained the queue while the worker was backing off: give the
        # worker work of its own, and wait (bounded) until it has done some since the last crash.
        with Client(dsn, sweep_interval=None) as c:
            c.send_batch(queue, [{"after": i} for i in range(5)])
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and not any(
            e["e"] == "handled" and e["t"] > restarted_at for e in fault_agents.read_events(tmp_path)
        ):
            time.sleep(0.2)
        time.sleep(1.0)  # let it settle what it is running
        worker.terminate()  # SIGTERM: a graceful stop
        worker.join(30)
    finally:
        for p in [*procs, worker]:
            if p.is_alive():
                p.kill()
                p.join(5)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert worker.exitcode == 0

    events = list(fault_agents.read_events(tmp_path))
    assert sum(e["e"] == "done" for e in events) == 4  # every process ended its run normally
    sent = [e["id"] for e in events if e["e"] == "sent"]
    deleted = [e["id"] for e in events if e["e"] == "deleted"]
    handled = [e for e in events if e["e"] == "handled"]
    errors = Counter(e["error"] for e in events if e["e"] == "error")

    with psycopg.connect(own_server.dsn) as c:
        queued = {r[0] for r in c.execute(
            "SELECT m.id FROM queue_pg.messages m JOIN queue_pg.queues q ON q.id = m.queue_id"
            " WHERE q.name = %s", [queue])}
        finished = {r[0] for r in c.execute(
            "SELECT message_id FROM queue_pg.message_history WHERE queue = %s"
            " AND outcome = 'deleted'", [queue])}
        all_ids = {r[0] for r in c.execute("SELECT id FROM queue_pg.messages")} | finished
    assert not queued & finished
    lost_sends = set(sent) - queued - finished
    undone_deletes = set(deleted) & queued
    assert not lost_sends, f"acknowledged sends lost: {sorted(lost_sends)[:20]}"
    assert not undone_deletes, f"acknowledged deletes undone: {sorted(undone_deletes)[:20]}"
    assert set(deleted) <= finished
    assert len(sent) == len(set(sent)) and set(sent) <= all_ids
    # the load really ran through the crashes
    assert len(sent) > 200 and deleted and handled and errors
    assert any(e["t"] > restarted_at for e in handled), "the worker did nothing after the last restart"
    assert any(e["t"] > restarted_at for e in events if e["e"] == "sent")

    for name in ("producer-1", "producer-2", "consumer-3"):
        text = (tmp_path / f"{name}.log").read_text()
        assert "queue_pg.client WARNING queue_pg client: lost the database" in text, name
        assert "queue_pg.client INFO queue_pg client: working again" in text, name
    text = (tmp_path / "worker.log").read_text()
    assert "queue_pg.worker WARNING worker: lost the database" in text
    assert "queue_pg.worker INFO worker: working again" in text
    assert "stopped:" in text  # the SIGTERM stop, after the outages

    twice = Counter(e["id"] for e in [*handled, *({"id": d} for d in deleted)])
    duplicates = sum(n - 1 for n in twice.values() if n > 1)
    print(f"\n[faults] server crash (-m immediate) x{len(CRASHES)}: acknowledged sends"
          f" {len(sent)}, failed sends/receives while down {dict(errors)}, deleted"
          f" {len(finished)} ({len(deleted)} acknowledged by the consumer, {len(handled)} handled"
          f" by the worker), still queued {len(queued)}, lost 0, deletes undone 0, duplicates"
          f" {duplicates} (a delete or lease the crash cut off: the message came back)")
