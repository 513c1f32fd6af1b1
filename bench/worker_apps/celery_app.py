"""Celery on Redis: the no-op task, run by
``celery -A bench.worker_apps.celery_app worker --pool threads``."""

from __future__ import annotations

import os

from celery import Celery  # type: ignore[import-untyped]

from bench.worker_apps import QUEUE, REDIS_ENV, stamp

app = Celery("bench", broker=os.environ.get(REDIS_ENV, "redis://127.0.0.1:6379/0"))
app.conf.task_default_queue = QUEUE
app.conf.broker_connection_retry_on_startup = True


@app.task(name="bench.noop", ignore_result=True)
def noop(n: int | None = None, t: float | None = None) -> None:
    stamp(t)
