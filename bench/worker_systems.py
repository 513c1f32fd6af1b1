"""The job runners ``python -m bench worker`` compares: how to install each, fill its backlog,
send one job, and start its own worker entry point with P processes of C workers each.

Every system runs the same no-op job (:mod:`bench.worker_apps`) with its default settings
except the concurrency. The PostgreSQL systems each get a scratch database of their own, so its
``pg_stat_database`` counts only their transactions; Celery and RQ use Redis.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any, ClassVar

from bench import db
from bench.peers import AsyncLoop
from bench.worker_apps import DSN_ENV, QUEUE, REDIS_ENV

__all__ = ["DEFAULT_REDIS", "SYSTEMS", "System", "redis_missing"]

DEFAULT_REDIS = "redis://127.0.0.1:6379/11"
#: The task name of the queue_pg and Celery apps.
TASK = "bench.noop"


def redis_missing(url: str) -> str | None:
    """Why Redis cannot be used (None: it answers)."""
    try:
        import redis
    except ImportError:
        return "the redis package is not installed (pip install queue_pg[bench])"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except Exception as exc:
        return f"no Redis at {url}: {type(exc).__name__}"
    return None


class System:
    """One job runner; ``target`` is its scratch database DSN or its Redis URL."""

    name: ClassVar[str]
    label: ClassVar[str]
    distribution: ClassVar[str]
    postgres: ClassVar[bool] = True
    #: jobs of a throughput run, as a share of --jobs (a slow system needs fewer for a rate)
    share: ClassVar[float] = 1.0
    note: ClassVar[str] = ""

    def __init__(self, target: str) -> None:
        self.target = target

    @classmethod
    def version(cls) -> str:
        import importlib.metadata

        return importlib.metadata.version(cls.distribution)

    @classmethod
    def missing(cls, redis_url: str) -> str | None:
        return None

    def env(self) -> dict[str, str]:
        return {DSN_ENV if self.postgres else REDIS_ENV: self.target}

    def install(self) -> None:
        """Make the queue (empty)."""

    def fill(self, count: int) -> None:
        """``count`` jobs waiting (setup, not measured)."""
        raise NotImplementedError

    def sender(self) -> tuple[Callable[[float], None], Callable[[], None]]:
        """(send one job stamped ``t``, close)."""
        raise NotImplementedError

    def commands(self, processes: int, concurrency: int) -> list[list[str]]:
        """The worker command lines (each runs as a process group of its own)."""
        raise NotImplementedError


class QueuePgSystem(System):
    name = "queue_pg"
    label = "queue_pg Worker"
    distribution = "queue_pg"

    def install(self) -> None:
        db.install(self.target)
        with db.connect(self.target) as conn:
            conn.execute("SELECT queue_pg.create_queue(%s)", [QUEUE])

    def fill(self, count: int) -> None:
        with db.connect(self.target) as conn:
            for start in range(0, count, 10_000):  # send_batch takes up to 10,000
                n = min(10_000, count - start)
                conn.execute(
                    "SELECT count(*) FROM queue_pg.send_batch(%s, ARRAY("
                    " SELECT jsonb_build_object('task', %s::text, 'args', '[]'::jsonb,"
                    " 'kwargs', jsonb_build_object('n', g))"
                    " FROM generate_series(1, %s) AS g ORDER BY g), attributes =>"
                    " array_fill(jsonb_build_object('type', %s::text), ARRAY[%s]))",
                    [QUEUE, TASK, n, TASK, n])
            conn.execute("VACUUM ANALYZE queue_pg.messages")

    def sender(self) -> tuple[Callable[[float], None], Callable[[], None]]:
        from queue_pg import Client
        from queue_pg.jobs.tasks import Registry, Task

        client = Client(self.target, min_size=1, max_size=1, sweep_interval=None)
        task = Task(lambda **kw: None, queue=QUEUE, name=TASK, registry=Registry())
        def send(t: float) -> None:
            task.send(kwargs={"t": t}, client=client)

        return send, client.close

    def commands(self, processes: int, concurrency: int) -> list[list[str]]:
        return [[sys.executable, "-m", "queue_pg.jobs.worker_cli", "bench.worker_apps.qpg",
                 "-c", str(concurrency), "-p", str(processes), "--dsn", self.target,
                 "--log-level", "WARNING"]]


class PgQueuerSystem(System):
    name = "pgqueuer"
    label = "PgQueuer"
    distribution = "pgqueuer"
    note = ("async def entrypoint, `pgq run` defaults (batch 10, no per-process limit: its"
            " --max-concurrent-tasks must be at least twice the batch, so it cannot say 8 or 16;"
            " only the process count changes), run through the command's function"
            " (bench/worker_apps/pgq_run.py: its --log-level parsing fails with the Typer"
            " installed here)")

    def install(self) -> None:
        from bench.peers.pgqueuer_driver import PgQueuer

        PgQueuer.install(self.target)

    def fill(self, count: int) -> None:
        with db.connect(self.target) as conn:
            conn.execute(
                "INSERT INTO pgqueuer (priority, entrypoint, payload, status, execute_after)"
                " SELECT 0, %s, convert_to(jsonb_build_object('n', g)::text, 'UTF8'),"
                " 'queued', now() FROM generate_series(1, %s) AS g ORDER BY g",
                [QUEUE, count])
            conn.execute("VACUUM ANALYZE pgqueuer")

    def sender(self) -> tuple[Callable[[float], None], Callable[[], None]]:
        import asyncpg  # type: ignore[import-untyped]
        from pgqueuer import Queries
        from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver

        from bench.peers.pgqueuer_driver import connect_kwargs

        aio = AsyncLoop()
        conn = aio.run(asyncpg.connect(**connect_kwargs(self.target)))
        queries = Queries(AsyncpgDriver(conn))

        def send(t: float) -> None:
            aio.run(queries.enqueue(QUEUE, json.dumps({"t": t}).encode()))

        def close() -> None:
            aio.run(conn.close())
            aio.close()

        return send, close

    def commands(self, processes: int, concurrency: int) -> list[list[str]]:
        return [[sys.executable, "-m", "bench.worker_apps.pgq_run"] for _ in range(processes)]


class ProcrastinateSystem(System):
    name = "procrastinate"
    label = "Procrastinate"
    distribution = "procrastinate"
    share = 0.25

    def _app(self) -> Any:
        from bench.worker_apps import procr

        return procr.make(self.target)

    def _run(self, fn: Callable[[Any], Any]) -> None:
        aio, app = AsyncLoop(), self._app()

        async def go() -> None:
            await app.open_async()
            try:
                await fn(app)
            finally:
                await app.close_async()

        try:
            aio.run(go())
        finally:
            aio.close()

    def install(self) -> None:
        self._run(lambda app: app.schema_manager.apply_schema_async())

    def fill(self, count: int) -> None:
        async def defer(app: Any) -> None:
            deferrer = app.configure_task(QUEUE, queue=QUEUE)
            for start in range(0, count, 5000):
                n = min(5000, count - start)
                await deferrer.batch_defer_async(*({"n": i} for i in range(n)))

        self._run(defer)
        with db.connect(self.target) as conn:
            conn.execute("VACUUM ANALYZE procrastinate_jobs")

    def sender(self) -> tuple[Callable[[float], None], Callable[[], None]]:
        aio, app = AsyncLoop(), self._app()
        aio.run(app.open_async())

        def close() -> None:
            aio.run(app.close_async())
            aio.close()

        deferrer = app.configure_task(QUEUE, queue=QUEUE)
        return (lambda t: aio.run(deferrer.defer_async(t=t))), close

    def commands(self, processes: int, concurrency: int) -> list[list[str]]:
        return [[sys.executable, "-m", "procrastinate", "--app=bench.worker_apps.procr.app",
                 "worker", "-q", QUEUE, "-c", str(concurrency)] for _ in range(processes)]


class CelerySystem(System):
    name = "celery"
    label = "Celery on Redis (threads)"
    distribution = "celery"
    postgres = False
    share = 0.5

    @classmethod
    def missing(cls, redis_url: str) -> str | None:
        return redis_missing(redis_url)

    def _app(self) -> Any:
        os.environ[REDIS_ENV] = self.target
        from bench.worker_apps import celery_app

        celery_app.app.conf.broker_url = self.target
        return celery_app

    def install(self) -> None:
        import redis

        r = redis.Redis.from_url(self.target)
        r.delete(QUEUE, "unacked", "unacked_index")

    def fill(self, count: int) -> None:
        noop = self._app().noop
        with noop.app.producer_or_acquire() as producer:
            for i in range(count):
                noop.apply_async(kwargs={"n": i}, producer=producer)

    def sender(self) -> tuple[Callable[[float], None], Callable[[], None]]:
        noop = self._app().noop
        return (lambda t: noop.apply_async(kwargs={"t": t})), (lambda: None)

    def commands(self, processes: int, concurrency: int) -> list[list[str]]:
        return [[sys.executable, "-m", "celery", "-A", "bench.worker_apps.celery_app", "worker",
                 "--pool", "threads", "-c", str(concurrency), "-Q", QUEUE, "-n",
                 f"bench{i}@%h", "--loglevel", "WARNING"] for i in range(processes)]


class RqSystem(System):
    name = "rq"
    label = "RQ on Redis"
    distribution = "rq"
    postgres = False
    share = 0.02
    note = "no threads: one `rq worker` per process, a fork per job"

    @classmethod
    def missing(cls, redis_url: str) -> str | None:
        return redis_missing(redis_url)

    def _queue(self) -> Any:
        import redis
        from rq import Queue

        return Queue(QUEUE, connection=redis.Redis.from_url(self.target))

    def install(self) -> None:
        self._queue().empty()

    def fill(self, count: int) -> None:
        from rq import Queue

        from bench.worker_apps.rq_app import noop

        q = self._queue()
        q.enqueue_many([Queue.prepare_data(noop, kwargs={"n": i}) for i in range(count)])

    def sender(self) -> tuple[Callable[[float], None], Callable[[], None]]:
        from bench.worker_apps.rq_app import noop

        q = self._queue()
        return (lambda t: q.enqueue(noop, t=t)), (lambda: None)

    def commands(self, processes: int, concurrency: int) -> list[list[str]]:
        return [[sys.executable, "-m", "rq.cli", "worker", "-u", self.target, QUEUE]
                for _ in range(processes)]


SYSTEMS: tuple[type[System], ...] = (
    QueuePgSystem, PgQueuerSystem, ProcrastinateSystem, CelerySystem, RqSystem,
)
