"""A Celery app on Celery's own ``sqs://`` broker transport, pointed at the endpoint by
environment: ``QP_SQS_BROKER`` (sqs://KEY:SECRET@HOST:PORT) and ``QP_SQS_OUT`` (a file each run
of a task appends a line to). ``slow`` sleeps on its first run so a test can kill the worker
while it holds the message."""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery  # type: ignore[import-untyped]

app = Celery("sqs_apps", broker=os.environ["QP_SQS_BROKER"])
app.conf.broker_transport_options = {
    "region": "us-east-1", "is_secure": False, "visibility_timeout": 3,
    "wait_time_seconds": 1, "polling_interval": 0.2,
}
app.conf.task_default_queue = "celery-sqs"
app.conf.task_acks_late = True
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_prefetch_multiplier = 1
OUT = Path(os.environ["QP_SQS_OUT"])


def _note(line: str) -> None:
    with OUT.open("a") as f:
        f.write(line + "\n")


@app.task(name="sqs_apps.add", ignore_result=True)
def add(a: int, b: int) -> None:
    _note(f"add {a + b}")


@app.task(name="sqs_apps.slow", ignore_result=True)
def slow(tag: str) -> None:
    first = not any(line.startswith(f"start {tag}") for line in
                    (OUT.read_text().splitlines() if OUT.exists() else []))
    _note(f"start {tag}")
    if first:
        time.sleep(600)  # killed here
    _note(f"done {tag}")
