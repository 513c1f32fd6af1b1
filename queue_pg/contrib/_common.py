"""What the Django and Flask integrations share: queues from settings, libpq DSNs from
connection parameters, and the worker command's options and launch (those of ``queue-pg worker``,
so defaults and ranges are written once, in :mod:`queue_pg.jobs.worker_cli`)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

import click
import psycopg

from queue_pg import _ops
from queue_pg.client import execute as _execute
from queue_pg.dsn import safe_dsn
from queue_pg.errors import QueueAlreadyExists, translating

__all__ = ["ensure_queues", "libpq_dsn_from_params", "run_worker_from_options", "worker_defaults",
           "worker_options"]

logger = logging.getLogger("queue_pg.worker")

#: ``queue-pg worker`` parameters that an integration supplies itself.
_OWN = frozenset({"modules", "dsn"})


def libpq_dsn_from_params(params: Mapping[str, Any]) -> str:
    """A libpq DSN from psycopg connect() keyword arguments, dropping those that are not libpq's
    (cursor_factory, context, prepare_threshold, ...)."""
    keywords = {d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults()}
    return psycopg.conninfo.make_conninfo(
        "", **{k: v for k, v in params.items() if k in keywords and v not in (None, "")}
    )


def installed(conn: psycopg.Connection[Any]) -> bool:
    """Whether schema queue_pg is installed in the connection's database."""
    row = conn.execute("SELECT to_regclass('queue_pg.queues') IS NOT NULL").fetchone()
    return bool(row and row[0])


def ensure_queues(
    conn: psycopg.Connection[Any], queues: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Create each queue with its settings, or bring an existing one to them (settings not
    named stay as they are). In order: name a dead-letter queue before the queues that use it.
    Each queue is its own transaction (a savepoint inside the caller's). Returns the names."""
    for name, settings in queues.items():
        try:
            with translating(), conn.transaction():
                _execute(conn, _ops.create_queue(name, dict(settings)))
        except QueueAlreadyExists:
            with translating(), conn.transaction():
                _execute(conn, _ops.alter_queue(name, dict(settings)))
    return list(queues)


def worker_options() -> list[click.Parameter]:
    """The options of ``queue-pg worker`` but MODULES and --dsn (the framework knows both)."""
    from queue_pg.jobs.worker_cli import worker_command

    return [p for p in worker_command.params if p.name not in _OWN]


def worker_defaults() -> dict[str, Any]:
    """Each option's default value, as ``queue-pg worker`` would receive it."""
    from queue_pg.jobs.worker_cli import worker_command

    ctx = worker_command.make_context("worker", ["-"], resilient_parsing=True)
    return {k: v for k, v in ctx.params.items() if k not in _OWN}


def run_worker_from_options(
    modules: tuple[str, ...], dsn: str, options: Mapping[str, Any], *, source: str
) -> None:
    """Run workers as ``queue-pg worker`` does, given its parsed options; ``modules`` are
    imported first in every worker process (a framework's set-up module, then the tasks)."""
    from queue_pg.jobs.processes import Supervisor as _Supervisor
    from queue_pg.jobs.processes import WorkerConfig, run_worker
    from queue_pg.jobs.processes import import_tasks as _import
    from queue_pg.jobs.processes import setup_logging as _setup_logging
    from queue_pg.jobs.tasks import registry

    opts = dict(options)
    processes = int(opts.pop("processes"))
    queues = tuple(opts.pop("queues") or ())
    _setup_logging(opts["log_level"])
    _import(modules)
    chosen = queues or tuple(registry.queues())
    if not chosen:
        raise click.UsageError("no tasks registered and no --queue")
    config = WorkerConfig(modules=modules, queues=chosen, dsn=dsn, **opts)
    logger.info(
        "queue_pg worker: %d process(es) x %d thread(s) on %s; %d task(s); %s (%s)",
        processes, config.concurrency, ", ".join(chosen), len(registry.tasks), safe_dsn(dsn),
        source,
    )
    if processes == 1:
        run_worker(config)
    else:
        sys.exit(_Supervisor(config, processes).run())
