"""queue_pg through its public ``queue_pg.Client`` (one connection per process, no sweeps).

The cycle uses the fastest public call, ``Client.receive(…, delete=previous receipts)``: the
finished batch is deleted and the next received in one round trip and one transaction.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg

from bench import db
from bench.peers import PAYLOAD_BYTES, QUEUE, Driver

#: Set (to anything) by ``bench send --dedup``: every send carries a dedup id of its own.
DEDUP_ENV = "QUEUE_PG_BENCH_DEDUP"


class QueuePg(Driver):
    name: ClassVar[str] = "queue_pg"
    label: ClassVar[str] = "queue_pg"

    @classmethod
    def version(cls) -> str | None:
        import queue_pg

        return getattr(queue_pg, "__version__", None)

    @classmethod
    def install(cls, dsn: str) -> dict[str, Any]:
        how = db.install(dsn)
        with db.connect(dsn) as conn:
            conn.execute("SELECT queue_pg.create_queue(%s)", [QUEUE])
        return {"install": how}

    @classmethod
    def fill(cls, dsn: str, count: int, start: int = 0) -> None:
        with db.connect(dsn) as conn:
            db.fill(conn, QUEUE, count, payload_bytes=PAYLOAD_BYTES, start=start)

    @classmethod
    def depth(cls, conn: psycopg.Connection[Any]) -> int:
        return db.count(conn, "SELECT count(*) FROM queue_pg.messages m JOIN queue_pg.queues q"
                              " ON q.id = m.queue_id WHERE q.name = %s", [QUEUE])

    @classmethod
    def purge(cls, conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT queue_pg.purge(%s)", [QUEUE])

    @classmethod
    def tables(cls) -> list[str]:
        return ["queue_pg.messages", "queue_pg.in_flight", "queue_pg.message_history"]

    def __init__(self, dsn: str) -> None:
        from queue_pg import Client

        super().__init__(dsn)
        self.client = Client(dsn, min_size=1, max_size=2, sweep_interval=None)
        # unique per process and cell, so no send is a duplicate: the cost of the claim alone
        self.dedup = f"{uuid.uuid4().hex[:12]}-" if os.environ.get(DEDUP_ENV) else None

    def send(self, bodies: Sequence[dict[str, Any]]) -> None:
        if self.dedup is None:
            if len(bodies) == 1:
                self.client.send(QUEUE, bodies[0])
            else:
                self.client.send_batch(QUEUE, bodies)
        elif len(bodies) == 1:
            self.client.send(QUEUE, bodies[0], dedup_id=f"{self.dedup}{bodies[0]['n']}")
        else:
            self.client.send_batch(QUEUE, bodies,
                                   dedup_ids=[f"{self.dedup}{b['n']}" for b in bodies])

    def receive(self, n: int) -> list[Any]:
        return [m.receipt for m in self.client.receive(QUEUE, n)]

    def delete(self, handles: Sequence[Any]) -> None:
        if len(handles) == 1:
            self.client.delete(QUEUE, handles[0])
        else:
            self.client.delete_batch(QUEUE, handles)

    def cycle(self, handles: Sequence[Any], n: int) -> list[Any]:
        # the finished batch is deleted in the same call and transaction as the next receive
        return [m.receipt for m in self.client.receive(QUEUE, n, delete=list(handles))]

    def receive_wait(self, n: int, wait: float) -> list[tuple[Any, dict[str, Any]]]:
        return [(m.receipt, m.body) for m in self.client.receive(QUEUE, n, wait=wait)]

    def close(self) -> None:
        self.client.close()


class QueuePgPlain(QueuePg):
    """queue_pg as most users write the loop: ``delete_batch`` of the finished batch, then
    ``receive`` (two round trips and two transactions a batch)."""

    name: ClassVar[str] = "queue_pg_plain"
    label: ClassVar[str] = "queue_pg receive + delete_batch"

    def cycle(self, handles: Sequence[Any], n: int) -> list[Any]:
        if handles:
            self.delete(handles)
        return self.receive(n)


class QueuePgRelaxed(QueuePg):
    """queue_pg on a queue with ``lease_durability => 'relaxed'``: a receive that owns its
    transaction commits without waiting for the WAL flush. Compare it with the peers run at
    ``synchronous_commit = off`` (``pgmq_nosync``), not with their durable runs."""

    name: ClassVar[str] = "queue_pg_relaxed"
    label: ClassVar[str] = "queue_pg relaxed"

    @classmethod
    def install(cls, dsn: str) -> dict[str, Any]:
        how = db.install(dsn)
        with db.connect(dsn) as conn:
            conn.execute("SELECT queue_pg.create_queue(%s, lease_durability => 'relaxed')", [QUEUE])
        return {"install": how, "lease_durability": "relaxed"}
