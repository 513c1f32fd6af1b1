"""``queue-pg worker myapp.tasks``: run the tasks of a module in worker threads and processes.

The main CLI registers :data:`worker_command`; ``python -m queue_pg.jobs.worker_cli`` runs it alone.
The processes themselves are :mod:`queue_pg.jobs.processes`.
"""

from __future__ import annotations

import logging
import sys

import click

from queue_pg.dsn import safe_dsn
from queue_pg.errors import QueueError
from queue_pg.jobs.processes import (
    Supervisor,
    WorkerConfig,
    import_tasks,
    run_worker,
    setup_logging,
)

__all__ = ["WorkerConfig", "run_worker", "worker_command"]

logger = logging.getLogger("queue_pg.worker")


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


@click.command("worker", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("modules", nargs=-1, required=True)
@click.option("-q", "--queue", "queues", multiple=True,
              help="Queue to work on (repeatable). Default: the queues of the imported tasks.")
@click.option("-c", "--concurrency", type=click.IntRange(1), default=4, show_default=True,
              help="Handler threads per process.")
@click.option("--pool", type=click.Choice(["threads", "processes"]), default="threads",
              show_default=True, help="Where tasks run: in the handler threads, or each"
              " thread's child process (killed at a task's hard time limit or on a revoke"
              " with --terminate, and replaced).")
@click.option("-p", "--processes", type=click.IntRange(1), default=1, show_default=True,
              help="Worker processes.")
@click.option("--dsn", metavar="DSN",
              help="PostgreSQL to use. Default: the main --dsn, $QUEUE_PG_DSN, else embedded.")
@click.option("--batch-size", type=click.IntRange(1, 1000),
              help="Most messages one receive takes. Default: --concurrency.")
@click.option("--visibility-timeout", type=click.FloatRange(0, min_open=True),
              help="Lease of a receive, renewed by heartbeats. Default: the queue's.")
@click.option("--heartbeat-interval", type=click.FloatRange(0, min_open=True),
              help="Seconds between lease renewals. Default: a third of the lease.")
@click.option("--grace-period", type=click.FloatRange(0), default=30.0, show_default=True,
              help="On SIGTERM / SIGINT, how long running jobs may finish.")
@click.option("--wait", type=float, default=20.0, show_default=True,
              help="Long-poll wait of a receive (0 to 20 seconds).")
@click.option("--backoff", "backoff_base", type=click.FloatRange(0), default=1.0,
              show_default=True, help="First retry delay; doubles per attempt.")
@click.option("--backoff-max", "backoff_cap", type=click.FloatRange(0), default=600.0,
              show_default=True, help="Longest retry delay.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--job-log-level", default="DEBUG", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Level of the line logged when each job starts and finishes.")
@click.option("--detect-crashes/--no-detect-crashes", default=True, show_default=True,
              help="Register as a consumer on a connection of its own, so that a crashed"
              " worker's leases end within seconds (by heartbeats behind a transaction pooler).")
@click.pass_context
def worker_command(
    ctx: click.Context,
    modules: tuple[str, ...],
    queues: tuple[str, ...],
    concurrency: int,
    pool: str,
    processes: int,
    dsn: str | None,
    batch_size: int | None,
    visibility_timeout: float | None,
    heartbeat_interval: float | None,
    grace_period: float,
    wait: float,
    backoff_base: float,
    backoff_cap: float,
    log_level: str,
    job_log_level: str,
    detect_crashes: bool,
) -> None:
    """Run the tasks of MODULES (e.g. myapp.tasks) until SIGTERM / Ctrl-C.

    The first signal stops receiving and lets running jobs finish within --grace-period; a
    second one exits at once (leases bring unfinished messages back).
    """
    from queue_pg.embedded import resolve_dsn

    setup_logging(log_level)
    try:
        tasks = import_tasks(modules)
    except ImportError as exc:
        raise click.ClickException(f"cannot import {exc.name or modules}: {exc}") from exc
    chosen = queues or tuple(tasks.queues())
    if not chosen:
        raise click.UsageError(f"no tasks registered by {', '.join(modules)} and no --queue")
    root = ctx.find_root()
    parent_dsn = root.params.get("dsn") if root is not ctx else None
    resolved, source = resolve_dsn(dsn or parent_dsn)
    config = WorkerConfig(
        modules=modules, queues=chosen, dsn=resolved, concurrency=concurrency,
        batch_size=batch_size, visibility_timeout=visibility_timeout,
        heartbeat_interval=heartbeat_interval, grace_period=grace_period, wait=wait,
        backoff_base=backoff_base, backoff_cap=backoff_cap, log_level=log_level,
        job_log_level=job_log_level, detect_crashes=detect_crashes, pool=pool,
    )
    logger.info(
        "queue-pg worker: %s x %s%s on %s; %s; %s (%s)",
        _n(processes, "process", "processes"), _n(concurrency, "thread"),
        " (a child process each)" if pool == "processes" else "", ", ".join(chosen),
        _n(len(tasks.tasks), "task"), safe_dsn(resolved), source,
    )
    if processes == 1:
        try:
            run_worker(config)
        except QueueError as exc:
            raise click.ClickException(str(exc)) from exc
        return
    sys.exit(Supervisor(config, processes).run())


if __name__ == "__main__":
    worker_command()
