"""A ``max_running`` task for tests/test_task_limits.py, run by worker processes
(``python -m queue_pg.jobs.worker_cli limits_app``); each run records its start and end in
``worker_runs`` (tests/worker_app.py), so a test counts concurrency from what really ran."""

from __future__ import annotations

import time

from worker_app import record

from queue_pg import task
from queue_pg.jobs.worker import Job

QUEUE = "lim"


@task(queue=QUEUE, name="lim.slow", bind=True, max_running=2)
def slow(job: Job, key: str, seconds: float) -> None:
    record(job, "start", key)
    time.sleep(seconds)
    record(job, "done", key)
