"""``queue-pg worker myapp.tasks``: run the tasks of a module in worker threads and processes.

The main CLI registers :data:`worker_command`; ``python -m queue_pg.worker_cli`` runs it alone.
With ``--processes N`` a supervisor starts N worker processes (multiprocessing, spawn: no
inherited connections or threads), forwards SIGTERM / SIGINT to them as SIGTERM, and restarts one
that dies; each process is a :class:`queue_pg.Worker` with ``--concurrency`` threads. A worker
process whose supervisor is gone (killed with SIGKILL, say) stops by itself, as on SIGTERM.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType

import click

from queue_pg.client import Client, _safe_dsn
from queue_pg.errors import QueueError
from queue_pg.tasks import Registry, registry
from queue_pg.worker import Backoff, Worker

__all__ = ["WorkerConfig", "run_worker", "worker_command"]

logger = logging.getLogger("queue_pg.worker")

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(processName)s %(name)s: %(message)s"
#: A child that fails this soon after its start cannot start (bad DSN, missing queue): the
#: supervisor stops instead of restarting it in a loop. A later death is restarted.
STARTUP_WINDOW = 5.0


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker process needs (picklable: it crosses a spawn)."""

    modules: tuple[str, ...]
    queues: tuple[str, ...]
    dsn: str
    concurrency: int
    batch_size: int | None
    visibility_timeout: float | None
    heartbeat_interval: float | None
    grace_period: float
    wait: float
    backoff_base: float
    backoff_cap: float
    log_level: str


def _import(modules: tuple[str, ...]) -> Registry:
    """Import the task modules (from the current folder too, as ``python -m`` would)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        importlib.import_module(name)
    return registry


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, force=True)
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)


def run_worker(config: WorkerConfig, *, child: bool = False) -> None:
    """One worker process: import the tasks, connect, run until stopped.

    A child of the supervisor ignores SIGINT (a terminal's Ctrl-C reaches the whole process
    group; the supervisor forwards it once, as SIGTERM).
    """
    _setup_logging(config.log_level)
    if child:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    tasks = _import(config.modules)
    with Client(config.dsn, min_size=1, max_size=config.concurrency + 2) as client:
        if tasks.client is None:
            tasks.set_client(client)  # tasks that enqueue tasks use the worker's pool
        worker = Worker(
            client, list(config.queues), tasks,
            concurrency=config.concurrency, batch_size=config.batch_size,
            visibility_timeout=config.visibility_timeout,
            heartbeat_interval=config.heartbeat_interval, grace_period=config.grace_period,
            wait=config.wait, backoff=Backoff(base=config.backoff_base, cap=config.backoff_cap),
        )
        worker.run(signals=(signal.SIGTERM,) if child else (signal.SIGTERM, signal.SIGINT))


def _stop_with_parent() -> None:
    """In a worker process: stop gracefully (as on SIGTERM) once the supervisor is gone.

    A supervisor killed without forwarding a stop (SIGKILL, the OOM killer, a test that kills
    only the process it started) would otherwise leave its workers running unsupervised for
    ever. The parent's sentinel becomes ready when the parent exits, however it exits.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        logger.error("supervisor (pid %s) is gone; stopping", parent.pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="queue_pg-parent-watch", daemon=True).start()


def _child_main(config: WorkerConfig) -> None:
    _stop_with_parent()
    try:
        run_worker(config, child=True)
    except QueueError as exc:  # a missing queue, say: one line, not a traceback per process
        logger.error("%s", exc)
        sys.exit(1)


class _Supervisor:
    """Starts N worker processes, forwards stop signals, restarts the ones that die."""

    def __init__(self, config: WorkerConfig, processes: int) -> None:
        self.config = config
        self.context = multiprocessing.get_context("spawn")
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.signals = 0
        self.n = processes

    def _spawn(self, i: int) -> multiprocessing.process.BaseProcess:
        p = self.context.Process(target=_child_main, args=(self.config,), name=f"worker-{i + 1}")
        p.start()
        return p

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1  # the second one reaches the children as a second SIGTERM: exit now
        for p in self.procs:
            if p.pid is not None and p.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.procs = [self._spawn(i) for i in range(self.n)]
        started = [time.monotonic()] * self.n
        told = 0
        while not (self.signals and all(p.exitcode is not None for p in self.procs)):
            if self.signals > told:
                told = self.signals
                logger.info("supervisor: stopping %d worker process(es)", self.n)
            for i, p in enumerate(self.procs):
                p.join(0.1 / self.n)
                if p.exitcode is None or self.signals:
                    continue
                if p.exitcode != 0 and time.monotonic() - started[i] < STARTUP_WINDOW:
                    logger.error("supervisor: %s failed at start (exit %s); stopping", p.name,
                                 p.exitcode)
                    self._on_signal(signal.SIGTERM, None)
                    break
                logger.error("supervisor: %s exited (%s); restarting it", p.name, p.exitcode)
                self.procs[i] = self._spawn(i)
                started[i] = time.monotonic()
        codes = [p.exitcode for p in self.procs]
        logger.info("supervisor: worker processes exited with %s", codes)
        # A child the forwarded stop reached while it was still starting dies of the signal
        # itself (its handler was not installed yet); it held no message, so that is clean too.
        stopped = (-signal.SIGTERM, -signal.SIGINT) if self.signals else ()
        return 0 if all(c == 0 or c in stopped for c in codes) else 1


@click.command("worker", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("modules", nargs=-1, required=True)
@click.option("-q", "--queue", "queues", multiple=True,
              help="Queue to work on (repeatable). Default: the queues of the imported tasks.")
@click.option("-c", "--concurrency", type=click.IntRange(1), default=4, show_default=True,
              help="Handler threads per process.")
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
@click.option("--wait", type=click.FloatRange(0, 20), default=20.0, show_default=True,
              help="Long-poll wait of a receive.")
@click.option("--backoff", "backoff_base", type=click.FloatRange(0), default=1.0,
              show_default=True, help="First retry delay; doubles per attempt.")
@click.option("--backoff-max", "backoff_cap", type=click.FloatRange(0), default=600.0,
              show_default=True, help="Longest retry delay.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.pass_context
def worker_command(
    ctx: click.Context,
    modules: tuple[str, ...],
    queues: tuple[str, ...],
    concurrency: int,
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
) -> None:
    """Run the tasks of MODULES (e.g. myapp.tasks) until SIGTERM / Ctrl-C.

    The first signal stops receiving and lets running jobs finish within --grace-period; a
    second one exits at once (leases bring unfinished messages back).
    """
    from queue_pg.embedded import resolve_dsn

    _setup_logging(log_level)
    try:
        tasks = _import(modules)
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
    )
    logger.info(
        "queue-pg worker: %s x %s on %s; %s; %s (%s)",
        _n(processes, "process", "processes"), _n(concurrency, "thread"), ", ".join(chosen),
        _n(len(tasks.tasks), "task"), _safe_dsn(resolved), source,
    )
    if processes == 1:
        try:
            run_worker(config)
        except QueueError as exc:
            raise click.ClickException(str(exc)) from exc
        return
    sys.exit(_Supervisor(config, processes).run())


if __name__ == "__main__":
    worker_command()
