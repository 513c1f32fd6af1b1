"""The no-op job of ``python -m bench worker``, written once for every system it runs.

Each system's worker runs through its own entry point (``queue-pg worker``, ``pgq run``,
``procrastinate worker``, ``celery worker``, ``rq worker``) and imports one module of this
package: the same handler, :func:`stamp`, registered the way that system registers a task.
The handler notes when it started (and, for a latency run, how long after its send) in a file of
its process under ``$BENCH_WORKER_STAMPS``; the parent reads them when the run is over.
"""

from __future__ import annotations

import os
import time

__all__ = ["DSN_ENV", "QUEUE", "REDIS_ENV", "STAMPS_ENV", "stamp"]

#: Where the handler writes: one file per process.
STAMPS_ENV = "BENCH_WORKER_STAMPS"
#: The PostgreSQL DSN a PostgreSQL system's app connects to.
DSN_ENV = "BENCH_WORKER_DSN"
#: The Redis URL of Celery and RQ.
REDIS_ENV = "BENCH_WORKER_REDIS"
#: Queue (entrypoint, task name) of every system; Redis keys are named after it too.
QUEUE = "bench_worker"

_files: dict[int, int] = {}


def stamp(t: float | None = None) -> None:
    """The job: note its start (wall clock: the sender is another process) and, for a job sent
    at ``t``, its latency. One small O_APPEND write: atomic between threads."""
    now = time.time()
    pid = os.getpid()
    fd = _files.get(pid)
    if fd is None:
        path = os.path.join(os.environ[STAMPS_ENV], f"{pid}.txt")
        fd = _files[pid] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    line = f"{now:.6f}" if t is None else f"{now:.6f} {now - t:.6f}"
    os.write(fd, (line + "\n").encode())
