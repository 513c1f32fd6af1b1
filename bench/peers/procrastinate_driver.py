"""Procrastinate through its ``App`` and ``JobManager`` on psycopg (asyncio).

Procrastinate is a job runner: a "message" is a job of task ``bench`` whose keyword arguments
are the JSON body. ``Task.defer_async`` / ``Task.batch_defer_async`` send; the worker's own
calls claim and settle: ``JobManager.fetch_job`` (one job a call: there is no batch fetch) and
``JobManager.finish_job(..., delete_job=True)`` (one job a call), so cycle batches above 1 are
"n/a". Its client is asyncio-first, so each process runs these calls on one event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg

from bench import db
from bench.peers import QUEUE, AsyncLoop, Driver, bodies


def make_app(dsn: str, max_size: int = 2) -> Any:
    """A Procrastinate app on ``dsn`` with the no-op task ``bench`` (queue ``bench``)."""
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=max_size)
    )

    @app.task(name=QUEUE, queue=QUEUE)
    def bench(**kwargs: Any) -> None:
        """No-op: the benchmark measures the queue, not the work."""

    return app


class Procrastinate(Driver):
    name: ClassVar[str] = "procrastinate"
    label: ClassVar[str] = "Procrastinate"
    distribution: ClassVar[str | None] = "procrastinate"

    @classmethod
    def available(cls) -> bool:
        import procrastinate  # noqa: F401

        return True

    @classmethod
    def _with_app(cls, dsn: str, fn: Any) -> Any:
        aio = AsyncLoop()
        app = make_app(dsn)

        async def go() -> Any:
            await app.open_async()
            try:
                return await fn(app)
            finally:
                await app.close_async()

        try:
            return aio.run(go())
        finally:
            aio.close()

    @classmethod
    def install(cls, dsn: str) -> dict[str, Any]:
        async def apply(app: Any) -> None:
            await app.schema_manager.apply_schema_async()

        cls._with_app(dsn, apply)
        return {"install": "procrastinate SchemaManager.apply_schema_async()"}

    @classmethod
    def fill(cls, dsn: str, count: int, start: int = 0) -> None:
        async def defer(app: Any) -> None:
            task = app.tasks[QUEUE]
            done = 0
            while done < count:
                size = min(5000, count - done)
                await task.batch_defer_async(*bodies(start + done, size))
                done += size

        cls._with_app(dsn, defer)

    @classmethod
    def depth(cls, conn: psycopg.Connection[Any]) -> int:
        return db.count(
            conn, "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')")

    @classmethod
    def purge(cls, conn: psycopg.Connection[Any]) -> None:
        conn.execute("TRUNCATE procrastinate_jobs CASCADE")

    @classmethod
    def tables(cls) -> list[str]:
        return ["procrastinate_jobs", "procrastinate_events", "procrastinate_workers"]

    @classmethod
    def unsupported(cls, op: str, batch: int) -> str | None:
        if op == "cycle" and batch > 1:
            return "fetch_job claims one job a call"
        if op == "latency":
            return "job runner, no receive call: see the worker scenario"
        return None

    def __init__(self, dsn: str) -> None:
        from procrastinate.jobs import Status

        super().__init__(dsn)
        self.aio = AsyncLoop()
        self.app = make_app(dsn)
        self.aio.run(self.app.open_async())
        self.task = self.app.tasks[QUEUE]
        self.manager = self.app.job_manager
        self.worker_id = self.aio.run(self.manager.register_worker())
        self.succeeded = Status.SUCCEEDED

    def send(self, bodies: Sequence[dict[str, Any]]) -> None:
        if len(bodies) == 1:
            self.aio.run(self.task.defer_async(**bodies[0]))
        else:
            self.aio.run(self.task.batch_defer_async(*bodies))

    def receive(self, n: int) -> list[Any]:
        job = self.aio.run(self.manager.fetch_job(queues=[QUEUE], worker_id=self.worker_id))
        return [] if job is None else [job]

    def delete(self, handles: Sequence[Any]) -> None:
        for job in handles:
            self.aio.run(self.manager.finish_job(job, self.succeeded, delete_job=True))

    def close(self) -> None:
        try:
            self.aio.run(self.manager.unregister_worker(self.worker_id))
            self.aio.run(self.app.close_async())
        finally:
            self.aio.close()
