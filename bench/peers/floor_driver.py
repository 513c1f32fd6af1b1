"""The floor: the least a queue of this design can do per message, from Python, on PostgreSQL.

Not a product: a yardstick. A queue that leases by ``FOR UPDATE SKIP LOCKED`` and a
``visible_at`` pushed forward, durably, must at least write each claimed row once (a non-HOT
update: the lease end is indexed, or the next claim could not skip it) and delete it once when
done. This driver does exactly that and nothing else, on a table shaped like PGMQ's queue table
(a primary key and an index on the lease end, the body as jsonb), with statements prepared on
the server on first use (psycopg ``prepare=True``), one plain connection, no plpgsql, no
receipts (a handle is the bare id), no history, no counters. ``floor`` settles the previous
batch and claims the next in one statement, as queue_pg's ``receive(delete=…)`` does;
``floor_plain`` in two transactions, as queue_pg's ``delete_batch`` + ``receive``.

What a system reaches beside the floor is what its features and its client cost; what the floor
reaches beside a peer bounds any ratio to that peer this design can reach on the machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg
from psycopg.types.json import Jsonb

from bench import db
from bench.peers import PAYLOAD_BYTES, Driver

VT_SECONDS = 30
TABLE = "floor_queue.messages"

_LEASE = (
    f"UPDATE {TABLE} t SET vt = clock_timestamp() + make_interval(secs => {VT_SECONDS}),"
    " read_ct = t.read_ct + 1"
    f" WHERE t.msg_id = ANY (ARRAY(SELECT msg_id FROM {TABLE} WHERE vt <= now()"
    " ORDER BY vt LIMIT {limit} FOR UPDATE SKIP LOCKED))"
    " RETURNING t.msg_id, t.read_ct, t.enqueued_at, t.vt, t.message"
)
_CLAIM = _LEASE.format(limit="%(n)s")
_DELETE = f"DELETE FROM {TABLE} WHERE msg_id = ANY(%(ids)s::bigint[])"
# One statement, the settled batch deleted before the claim scans: its LIMIT reads the delete's
# count, so the delete runs to its end first. Claim first, then delete, deadlocks: a claim that
# met another consumer's row just leased (an old version in its snapshot) keeps the lock it took
# to recheck it, and that consumer's delete of the row then waits for it.
_CYCLE = (f"WITH settled AS ({_DELETE} RETURNING 1) "
          + _LEASE.format(limit="(SELECT %(n)s::integer + 0 * count(*)::integer FROM settled)"))


class Floor(Driver):
    name: ClassVar[str] = "floor"
    label: ClassVar[str] = "floor"
    combined: ClassVar[bool] = True

    @classmethod
    def version(cls) -> str | None:
        return None

    @classmethod
    def install(cls, dsn: str) -> dict[str, Any]:
        with db.connect(dsn) as conn:
            conn.execute("CREATE SCHEMA IF NOT EXISTS floor_queue")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {TABLE} ("
                " msg_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                " read_ct integer NOT NULL DEFAULT 0,"
                " enqueued_at timestamptz NOT NULL DEFAULT now(),"
                " vt timestamptz NOT NULL DEFAULT clock_timestamp(),"
                " message jsonb NOT NULL)"
            )
            conn.execute(f"CREATE INDEX IF NOT EXISTS floor_vt ON {TABLE} (vt)")
        return {"install": "one table (primary key, index on the lease end), no functions"}

    @classmethod
    def fill(cls, dsn: str, count: int, start: int = 0) -> None:
        with db.connect(dsn) as conn:
            conn.execute(
                f"INSERT INTO {TABLE} (message) SELECT jsonb_build_object('n', g, 'payload',"
                " repeat('x', %s)) FROM generate_series(%s::bigint, %s::bigint) g ORDER BY g",
                [PAYLOAD_BYTES, start, start + count - 1],
            )

    @classmethod
    def depth(cls, conn: psycopg.Connection[Any]) -> int:
        return db.count(conn, f"SELECT count(*) FROM {TABLE}")

    @classmethod
    def purge(cls, conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"TRUNCATE {TABLE}")

    @classmethod
    def tables(cls) -> list[str]:
        return [TABLE]

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.conn = psycopg.connect(dsn, autocommit=True)

    def send(self, bodies: Sequence[dict[str, Any]]) -> None:
        self.conn.execute(f"INSERT INTO {TABLE} (message) SELECT unnest(%s::jsonb[])",
                          [[Jsonb(b) for b in bodies]], prepare=True)

    @classmethod
    def unsupported(cls, op: str, batch: int) -> str | None:
        return "the floor has no long poll" if op == "latency" else None

    def receive(self, n: int) -> list[Any]:
        rows = self.conn.execute(_CLAIM, {"n": n}, prepare=True).fetchall()
        return [r[0] for r in rows]

    def delete(self, handles: Sequence[Any]) -> None:
        self.conn.execute(_DELETE, {"ids": list(handles)}, prepare=True)

    def cycle(self, handles: Sequence[Any], n: int) -> list[Any]:
        if not self.combined:
            return super().cycle(handles, n)
        rows = self.conn.execute(_CYCLE, {"ids": list(handles), "n": n}, prepare=True).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        self.conn.close()


class FloorPlain(Floor):
    """The floor in two transactions: delete the finished batch, then claim the next."""

    name: ClassVar[str] = "floor_plain"
    label: ClassVar[str] = "floor plain"
    combined: ClassVar[bool] = False
