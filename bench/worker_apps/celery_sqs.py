"""Celery on its ``sqs://`` transport (kombu, boto3): the no-op task of ``python -m bench sqs``,
run by ``celery -A bench.worker_apps.celery_sqs worker --pool solo`` against ``queue-pg sqs`` and
against moto's server alike. The broker comes from ``$BENCH_SQS_BROKER``
(sqs://KEY:SECRET@HOST:PORT); the task stamps a file under ``$BENCH_WORKER_STAMPS``."""

from __future__ import annotations

import os

from celery import Celery  # type: ignore[import-untyped]

from bench.worker_apps import stamp

#: The sqs:// broker URL (the same settings for every server).
BROKER_ENV = "BENCH_SQS_BROKER"
QUEUE = "bench-celery"

app = Celery("bench_sqs", broker=os.environ.get(BROKER_ENV, "sqs://x:y@127.0.0.1:1"))
app.conf.broker_transport_options = {
    "region": "us-east-1", "is_secure": False, "visibility_timeout": 60,
    "wait_time_seconds": 1, "polling_interval": 0,
}
app.conf.task_default_queue = QUEUE
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_prefetch_multiplier = 10  # up to 10 messages a ReceiveMessage


@app.task(name="bench.sqs_noop", ignore_result=True)
def noop(n: int | None = None) -> None:
    stamp()
