"""PgQueuer through its ``Queries`` API on asyncpg (the driver its documentation leads with).

PgQueuer is a job runner: a "message" is a job of entrypoint ``bench`` whose payload is the JSON
body as bytes. ``Queries.enqueue`` sends (lists for a batch), ``Queries.dequeue`` claims
(``FOR UPDATE SKIP LOCKED``, status -> picked) and ``Queries.log_jobs(..., "successful")``
settles: the calls its own QueueManager makes around a job. Its client is asyncio-only, so each
process runs them on one event loop.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar

import psycopg

from bench import db
from bench.peers import PAYLOAD_BYTES, QUEUE, AsyncLoop, Driver

HEARTBEAT_TIMEOUT = timedelta(seconds=30)


def connect_kwargs(dsn: str) -> dict[str, Any]:
    """asyncpg takes no libpq key=value string: the DSN's parts as its keyword arguments."""
    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(dsn)
    names = {"host": "host", "port": "port", "user": "user", "password": "password",
             "dbname": "database"}
    kwargs: dict[str, Any] = {k: p[n] for n, k in names.items() if p.get(n) is not None}
    if "port" in kwargs:
        kwargs["port"] = int(kwargs["port"])
    return kwargs


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


class PgQueuer(Driver):
    name: ClassVar[str] = "pgqueuer"
    label: ClassVar[str] = "PgQueuer"
    distribution: ClassVar[str | None] = "pgqueuer"

    @classmethod
    def available(cls) -> bool:
        import asyncpg  # type: ignore[import-untyped]  # noqa: F401
        import pgqueuer  # noqa: F401

        return True

    @classmethod
    def install(cls, dsn: str) -> dict[str, Any]:
        async def go() -> None:
            import asyncpg
            from pgqueuer import Queries
            from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver

            conn = await asyncpg.connect(**connect_kwargs(dsn))
            try:
                await Queries(AsyncpgDriver(conn)).install()
            finally:
                await conn.close()

        loop = AsyncLoop()
        try:
            loop.run(go())
        finally:
            loop.close()
        return {"install": "pgqueuer Queries.install()", "driver": "asyncpg"}

    @classmethod
    def fill(cls, dsn: str, count: int, start: int = 0) -> None:
        # Setup, not measured: PgQueuer's columns written directly from generate_series.
        with db.connect(dsn) as conn:
            conn.execute(
                "INSERT INTO pgqueuer (priority, entrypoint, payload, status, execute_after)"
                " SELECT 0, %s, convert_to(jsonb_build_object('n', g, 'payload',"
                " repeat('x', %s))::text, 'UTF8'), 'queued', now()"
                " FROM generate_series(%s::bigint, %s::bigint) AS g ORDER BY g",
                [QUEUE, PAYLOAD_BYTES, start, start + count - 1],
            )

    @classmethod
    def depth(cls, conn: psycopg.Connection[Any]) -> int:
        return db.count(conn, "SELECT count(*) FROM pgqueuer")

    @classmethod
    def purge(cls, conn: psycopg.Connection[Any]) -> None:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log")

    @classmethod
    def tables(cls) -> list[str]:
        return ["pgqueuer", "pgqueuer_log", "pgqueuer_statistics"]

    def __init__(self, dsn: str) -> None:
        import asyncpg
        from pgqueuer import Queries
        from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
        from pgqueuer.ports.repository import EntrypointExecutionParameter

        super().__init__(dsn)
        self.aio = AsyncLoop()
        self.conn = self.aio.run(asyncpg.connect(**connect_kwargs(dsn)))
        self.queries = Queries(AsyncpgDriver(self.conn))
        self.entrypoints = {QUEUE: EntrypointExecutionParameter(concurrency_limit=0)}
        self.qm_id = uuid.uuid4()

    def send(self, bodies: Sequence[dict[str, Any]]) -> None:
        if len(bodies) == 1:
            self.aio.run(self.queries.enqueue(QUEUE, _encode(bodies[0])))
        else:
            n = len(bodies)
            self.aio.run(
                self.queries.enqueue([QUEUE] * n, [_encode(b) for b in bodies], [0] * n)
            )

    def _dequeue(self, n: int) -> list[Any]:
        return self.aio.run(
            self.queries.dequeue(
                batch_size=n,
                entrypoints=self.entrypoints,  # type: ignore[arg-type]
                queue_manager_id=self.qm_id,  # type: ignore[arg-type]
                global_concurrency_limit=None,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
            )
        )

    def receive(self, n: int) -> list[Any]:
        return self._dequeue(n)

    def delete(self, handles: Sequence[Any]) -> None:
        self.aio.run(self.queries.log_jobs([(job, "successful", None) for job in handles]))

    def close(self) -> None:
        self.aio.run(self.conn.close())
        self.aio.close()

    @classmethod
    def unsupported(cls, op: str, batch: int) -> str | None:
        if op == "latency":
            return "job runner, no receive call: see the worker scenario"
        return None
