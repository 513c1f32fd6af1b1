"""PGMQ through its Python client ``pgmq.PGMQueue`` (psycopg, one pooled connection a process).

PGMQ itself is installed from the SQL script the ``pgmq`` wheel bundles (``pgmq/sql/pgmq.sql``,
``pgmq.install_pgmq_from_sql``): no C extension. A message is settled with ``delete`` (not
``archive``), as queue_pg's delete is. The long poll is ``read_with_poll``, which sleeps and
re-reads in the server; its interval is set to 10 ms (the client's default is 100 ms) to give
PGMQ its best latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg
from psycopg import sql

from bench import db
from bench.peers import PAYLOAD_BYTES, QUEUE, Driver

VT_SECONDS = 30
POLL_INTERVAL_MS = 10


class Pgmq(Driver):
    name: ClassVar[str] = "pgmq"
    label: ClassVar[str] = "PGMQ"
    distribution: ClassVar[str | None] = "pgmq"

    @classmethod
    def available(cls) -> bool:
        import pgmq  # noqa: F401

        return True

    @classmethod
    def install(cls, dsn: str) -> dict[str, Any]:
        from pgmq import install_pgmq_from_sql

        sql_version = install_pgmq_from_sql(dsn=dsn)
        with db.connect(dsn) as conn:
            conn.execute("SELECT pgmq.create(%s)", [QUEUE])
        return {"install": "pgmq.install_pgmq_from_sql (bundled pgmq.sql)", "sql": sql_version}

    @classmethod
    def fill(cls, dsn: str, count: int, start: int = 0) -> None:
        with db.connect(dsn) as conn:
            done = 0
            while done < count:
                size = min(10_000, count - done)
                lo = start + done
                conn.execute(
                    "SELECT count(*) FROM pgmq.send_batch(%s, ARRAY("
                    " SELECT jsonb_build_object('n', g, 'payload', repeat('x', %s))"
                    " FROM generate_series(%s::bigint, %s::bigint) AS g ORDER BY g))",
                    [QUEUE, PAYLOAD_BYTES, lo, lo + size - 1],
                )
                done += size

    @classmethod
    def depth(cls, conn: psycopg.Connection[Any]) -> int:
        return db.count(conn, f"SELECT count(*) FROM pgmq.q_{QUEUE}")

    @classmethod
    def purge(cls, conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT pgmq.purge_queue(%s)", [QUEUE])

    @classmethod
    def tables(cls) -> list[str]:
        return [f"pgmq.q_{QUEUE}", f"pgmq.a_{QUEUE}", "pgmq.meta"]

    def __init__(self, dsn: str) -> None:
        from pgmq import PGMQueue

        super().__init__(dsn)
        self.q = PGMQueue(conn_string=dsn, init_extension=False, pool_size=2)

    def send(self, bodies: Sequence[dict[str, Any]]) -> None:
        if len(bodies) == 1:
            self.q.send(QUEUE, bodies[0])
        else:
            self.q.send_batch(QUEUE, list(bodies))

    def receive(self, n: int) -> list[Any]:
        return [m.msg_id for m in self.q.read_batch(QUEUE, vt=VT_SECONDS, batch_size=n)]

    def delete(self, handles: Sequence[Any]) -> None:
        if len(handles) == 1:
            self.q.delete(QUEUE, handles[0])
        else:
            self.q.delete_batch(QUEUE, list(handles))

    def receive_wait(self, n: int, wait: float) -> list[tuple[Any, dict[str, Any]]]:
        msgs = self.q.read_with_poll(
            QUEUE,
            vt=VT_SECONDS,
            qty=n,
            max_poll_seconds=max(1, round(wait)),
            poll_interval_ms=POLL_INTERVAL_MS,
        )
        return [(m.msg_id, m.message) for m in msgs]

    def close(self) -> None:
        self.q.close()


class PgmqNoSync(Pgmq):
    """PGMQ with ``synchronous_commit = off`` for its scratch database (``ALTER DATABASE``, set
    before any client connects; the server's setting is not touched): no commit waits for the
    WAL flush. The peer to set beside queue_pg's ``lease_durability => 'relaxed'``."""

    name: ClassVar[str] = "pgmq_nosync"
    label: ClassVar[str] = "PGMQ sync off"

    @classmethod
    def install(cls, dsn: str) -> dict[str, Any]:
        info = super().install(dsn)
        with db.connect(dsn) as conn:
            name = conn.execute("SELECT current_database()").fetchone()
            assert name is not None
            conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off")
                         .format(sql.Identifier(name[0])))
        return {**info, "synchronous_commit": "off (ALTER DATABASE)"}


def leased_head(
    dsn: str, visible: int, in_flight: int, receives: int, max_messages: int, block: int
) -> dict[str, Any]:
    """PGMQ in the leased-head scenario: queue ``leased_head`` with ``in_flight`` messages read
    with a long visibility timeout ahead of ``visible`` ones, queue ``empty_head`` with the same
    visible ones only; after ``VACUUM ANALYZE``, ``read(qty=max_messages)`` + ``delete`` through
    the Python client, alternating blocks of ``block`` reads on the two queues."""
    import time

    from pgmq import PGMQueue, install_pgmq_from_sql

    from bench.report import LatencySummary

    install_pgmq_from_sql(dsn=dsn)
    queues = ("leased_head", "empty_head")
    with db.connect(dsn) as conn:
        for name, total in (("leased_head", visible + in_flight), ("empty_head", visible)):
            conn.execute("SELECT pgmq.create(%s)", [name])
            done = 0
            while done < total:
                size = min(10_000, total - done)
                conn.execute(
                    "SELECT count(*) FROM pgmq.send_batch(%s, ARRAY("
                    " SELECT jsonb_build_object('n', g, 'payload', repeat('x', %s))"
                    " FROM generate_series(%s::bigint, %s::bigint) AS g ORDER BY g))",
                    [name, PAYLOAD_BYTES, done, done + size - 1],
                )
                done += size
            if name == "leased_head":
                got = 0
                while got < in_flight:
                    row = conn.execute(
                        "SELECT count(*) FROM pgmq.read(%s, 43200, %s)",
                        [name, min(1000, in_flight - got)],
                    ).fetchone()
                    got += int(row[0]) if row else 0
        for name in queues:
            conn.execute(f"VACUUM ANALYZE pgmq.q_{name}")
    recv: dict[str, list[float]] = {q: [] for q in queues}
    q = PGMQueue(conn_string=dsn, init_extension=False, pool_size=1)
    try:
        for name in queues:  # warm-up
            for _ in range(20):
                msgs = q.read_batch(name, vt=VT_SECONDS, batch_size=max_messages)
                q.delete_batch(name, [m.msg_id for m in msgs])
        done_n, turn = 0, 0
        while done_n < receives:
            n = min(block, receives - done_n)
            for name in queues if turn % 2 == 0 else queues[::-1]:
                for _ in range(n):
                    t0 = time.perf_counter()
                    msgs = q.read_batch(name, vt=VT_SECONDS, batch_size=max_messages)
                    recv[name].append(time.perf_counter() - t0)
                    q.delete_batch(name, [m.msg_id for m in msgs])
            done_n += n
            turn += 1
    finally:
        q.close()
    lat = {name: LatencySummary.of(v) for name, v in recv.items()}
    return {
        "leased": lat["leased_head"],
        "empty": lat["empty_head"],
        "leased_p50_ms": lat["leased_head"].p50_ms,
        "ratio": lat["leased_head"].p50_ms / lat["empty_head"].p50_ms,
    }
