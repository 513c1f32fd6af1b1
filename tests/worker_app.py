"""Tasks for the worker tests: their subprocesses run ``python -m queue_pg.jobs.worker_cli worker_app``.

Every task writes what it does to the table ``worker_runs`` of ``$QUEUE_PG_DSN`` (one row per
event, with the worker's pid and the attempt), so a test can see runs of processes it killed.
"""

from __future__ import annotations

import os
import time
from typing import Any

from queue_pg import task
from queue_pg.jobs.worker import Backoff, Job
from tests import run_log

QUEUE = "wq"

RUNS_DDL = run_log.ddl("worker_runs")


def record(job: Job, event: str, key: str, **data: Any) -> None:
    run_log.record(os.environ["QUEUE_PG_DSN"], "worker_runs", job, event, key, **data)


@task(queue=QUEUE, name="noop", bind=True)
def noop(job: Job, key: str) -> None:
    record(job, "done", key)


@task(queue=QUEUE, name="slow", bind=True)
def slow(job: Job, key: str, seconds: float) -> None:
    """Sleeps without checking its lease: only the heartbeat keeps it."""
    record(job, "start", key)
    time.sleep(seconds)
    record(job, "done", key)


@task(queue=QUEUE, name="fail", bind=True, backoff=Backoff(base=0.2, cap=5.0, jitter=0.5))
def fail(job: Job, key: str) -> None:
    record(job, "start", key)
    raise ValueError(f"boom {key}")


@task(queue=QUEUE, name="chunked", bind=True)
def chunked(job: Job, key: str, chunks: int, seconds: float) -> None:
    """Does ``chunks`` steps, saving its progress after each: a redelivery resumes."""
    first = (job.state or {}).get("next", 0)
    record(job, "resume", key, first=first)
    for i in range(first, chunks):
        record(job, "chunk", key, chunk=i)
        time.sleep(seconds)
        job.checkpoint({"next": i + 1})
    record(job, "done", key)
