"""PgQueuer: the no-op entrypoint, run by ``pgq run bench.worker_apps.pgq:create``."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from bench.worker_apps import DSN_ENV, QUEUE, stamp


@asynccontextmanager
async def create() -> AsyncIterator[Any]:
    """The factory ``pgq run`` calls: a PgQueuer on asyncpg with one async entrypoint."""
    import asyncpg  # type: ignore[import-untyped]
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job

    from bench.peers.pgqueuer_driver import connect_kwargs

    conn = await asyncpg.connect(**connect_kwargs(os.environ[DSN_ENV]))
    pgq = PgQueuer.from_asyncpg_connection(conn)

    @pgq.entrypoint(QUEUE)
    async def noop(job: Job) -> None:
        body = json.loads(job.payload) if job.payload else {}
        stamp(body.get("t"))

    try:
        yield pgq
    finally:
        await conn.close()
