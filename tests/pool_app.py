"""Tasks for the process-pool tests (``Worker(..., pool="processes")``): the children import
this module. Each run writes a row to ``pool_runs`` of ``$POOL_APP_DSN`` (event, attempt, the
child's pid), so a test sees what a child did before it was killed."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from queue_pg import task
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.job import BaseJob, TaskTimeout
from queue_pg.jobs.tasks import registry
from tests import run_log

QUEUE = "pool"
#: The default registry: ``queue-pg worker tests.pool_app`` finds them there.
REG = registry
FAST = Backoff(base=0.05, cap=0.05)

RUNS_DDL = run_log.ddl("pool_runs")


def record(job: BaseJob, event: str, key: str, **data: Any) -> None:
    run_log.record(os.environ["POOL_APP_DSN"], "pool_runs", job, event, key, **data)


@task(queue=QUEUE, name="pool.double", bind=True, registry=REG, store_result=True)
def double(job: BaseJob, key: str, x: int) -> int:
    record(job, "done", key)
    return x * 2


@task(queue=QUEUE, name="pool.forever", bind=True, registry=REG, retries=1, time_limit=1.0,
      backoff=FAST)
def forever(job: BaseJob, key: str) -> None:
    """Sleeps in a C call that catches nothing: only a kill stops it."""
    record(job, "start", key)
    while True:
        try:
            time.sleep(3600)
        except BaseException:  # deaf to any soft limit
            continue


@task(queue=QUEUE, name="pool.soft", bind=True, registry=REG, retries=0, timeout=0.5,
      time_limit=5.0, backoff=FAST)
def soft(job: BaseJob, key: str) -> None:
    """Sleeps past its soft limit: TaskTimeout raised inside time.sleep, caught, recorded."""
    record(job, "start", key)
    try:
        time.sleep(30)
    except TaskTimeout:
        record(job, "soft limit", key)
        raise


@task(queue=QUEUE, name="pool.hang", bind=True, registry=REG, retries=1, backoff=FAST)
def hang(job: BaseJob, key: str) -> str:
    """Hangs on its first attempt (deaf to anything but a kill), finishes on the next."""
    record(job, "start", key)
    while job.receive_count == 1:
        try:
            time.sleep(3600)
        except BaseException:
            continue
    record(job, "done", key)
    return "done"


@task(queue=QUEUE, name="pool.exit", bind=True, registry=REG, retries=1, backoff=FAST)
def exit_now(job: BaseJob, key: str) -> None:
    record(job, "start", key)
    os._exit(3)


@task(queue=QUEUE, name="pool.self_kill", bind=True, registry=REG, retries=0, backoff=FAST)
def self_kill(job: BaseJob, key: str) -> None:
    record(job, "start", key)
    os.kill(os.getpid(), signal.SIGKILL)


@task(queue=QUEUE, name="pool.sleep", bind=True, registry=REG, retries=0, backoff=FAST)
def sleep(job: BaseJob, key: str, seconds: float) -> None:
    record(job, "start", key)
    time.sleep(seconds)
    record(job, "done", key)


@task(queue=QUEUE, name="pool.resume", bind=True, registry=REG, retries=2, backoff=FAST)
def resume(job: BaseJob, key: str) -> str:
    """Checkpoints (through the parent), then dies once: the next attempt resumes."""
    state = job.state or {}
    record(job, "resume", key, state=state)
    if not state:
        job.checkpoint({"step": 1})
        record(job, "saved", key)
        os._exit(1)
    return "resumed"


@task(queue=QUEUE, name="pool.aresume", bind=True, registry=REG, retries=2, backoff=FAST)
async def aresume(job: BaseJob, key: str) -> str:
    """An async task in a child: awaits its checkpoint, then dies once; the next attempt
    resumes from it."""
    state = job.state or {}
    record(job, "resume", key, state=state)
    if not state:
        await job.checkpoint({"step": 1})  # type: ignore[attr-defined]
        record(job, "saved", key)
        os._exit(1)
    await asyncio.sleep(0)
    return "resumed"


@task(queue=QUEUE, name="pool.boom", bind=True, registry=REG, retries=0, backoff=FAST)
def boom(job: BaseJob, key: str) -> None:
    raise KeyError(f"no such thing: {key}")
