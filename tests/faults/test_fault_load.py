"""A load run: 8 producer and 8 consumer processes for a fixed time on loopback.

Producers send single messages and batches; consumers delete most of what they receive and
give some back (a planned retry), so messages that are given back too often are dead-lettered.
At the end the counts reconcile exactly: sent = deleted + still queued + dead-lettered, and the
consumers' acknowledged deletes are the history's.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import fault_agents
import psycopg
import pytest

from queue_pg import Client

pytestmark = pytest.mark.faults

PRODUCERS = CONSUMERS = 8
RUN = 15.0


def test_eight_producers_eight_consumers_reconcile_exactly(
    clean: str, client: Client, tmp_path: Path
) -> None:
    client.create_queue("load-dlq")
    client.create_queue("load", visibility_timeout=5, dead_letter_queue="load-dlq",
                        max_receive_count=2)
    ctx = multiprocessing.get_context("spawn")
    folder = str(tmp_path)
    procs = [ctx.Process(target=fault_agents.load_producer, args=(clean, "load", i, folder, RUN))
             for i in range(PRODUCERS)]
    procs += [ctx.Process(target=fault_agents.load_consumer,
                          args=(clean, "load", 100 + i, folder, RUN + 1.0))
              for i in range(CONSUMERS)]
    started = time.monotonic()
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(RUN + 60)
    finally:  # none outlives the test, even a hung one
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    took = time.monotonic() - started
    assert [p.exitcode for p in procs] == [0] * len(procs)

    done = [e for e in fault_agents.read_events(tmp_path) if e["e"] == "done"]
    errors = [e for e in fault_agents.read_events(tmp_path) if e["e"] == "error"]
    assert len(done) == PRODUCERS + CONSUMERS and not errors, errors[:5]
    sent = sum(e.get("sent", 0) for e in done)
    acked_deletes = sum(e.get("deleted", 0) for e in done)
    released = sum(e.get("released", 0) for e in done)

    with psycopg.connect(clean) as c:
        deleted, = c.execute("SELECT count(*) FROM queue_pg.message_history"
                             " WHERE queue = 'load' AND outcome = 'deleted'").fetchone() or (0,)
        queued, = c.execute("SELECT count(*) FROM queue_pg.messages m JOIN queue_pg.queues q"
                            " ON q.id = m.queue_id WHERE q.name = 'load'").fetchone() or (0,)
        dead, = c.execute("SELECT count(*) FROM queue_pg.messages m JOIN queue_pg.queues q"
                          " ON q.id = m.queue_id WHERE q.name = 'load-dlq'"
                          " AND m.source_queue_id = (SELECT id FROM queue_pg.queues"
                          " WHERE name = 'load')").fetchone() or (0,)
        moved, = c.execute("SELECT count(*) FROM queue_pg.message_history"
                           " WHERE queue = 'load' AND outcome = 'dead_lettered'").fetchone() or (0,)
        other, = c.execute("SELECT count(*) FROM queue_pg.message_history WHERE queue = 'load'"
                           " AND outcome NOT IN ('deleted', 'dead_lettered')").fetchone() or (0,)
    assert sent == deleted + queued + dead, (sent, deleted, queued, dead)
    assert acked_deletes == deleted
    assert moved == dead and other == 0
    assert sent > 1000 and deleted > 0 and dead > 0  # the run did what it says
    print(f"\n[faults] load {PRODUCERS}+{CONSUMERS} processes, {RUN:.0f} s ({took:.1f} s with"
          f" start-up): sent {sent}, deleted {deleted}, still queued {queued}, dead-lettered"
          f" {dead}, released for retry {released}, lost 0 (sent = deleted + queued +"
          f" dead-lettered), errors 0, {sent / RUN:.0f} sends/s")
