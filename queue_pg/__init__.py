"""queue_pg: a message queue inside PostgreSQL with Amazon SQS / Azure Queue style leases.

The SQL functions in schema ``queue_pg`` are the product; :class:`Client` and
:class:`AsyncClient` are thin typed layers over them.
"""

from __future__ import annotations

import logging
from importlib import metadata as _metadata
from typing import Any

from queue_pg import plain as _plain
from queue_pg.aio import AsyncClient
from queue_pg.client import Client
from queue_pg.dsn import safe_dsn
from queue_pg.errors import (
    AccessDenied,
    ConsumerNotFound,
    GroupRequired,
    InvalidParameter,
    InvalidReceipt,
    InvalidSchedule,
    LeaseLimitExceeded,
    MessageNotFound,
    MessageTooLarge,
    NoDeadLetterQueue,
    OverLimit,
    QueueAlreadyExists,
    QueueError,
    QueueInUse,
    QueueNotFound,
    ReadOnlyServer,
    RedriveInProgress,
    RedriveTaskNotFound,
    SchemaMissing,
    ServerUnavailable,
    StaleReceipt,
)
from queue_pg.jobs.aio_worker import AsyncWorker
from queue_pg.jobs.backoff import Backoff
from queue_pg.jobs.canvas import Signature, chain, chord, group
from queue_pg.jobs.job import AsyncJob, Job, LeaseLost, Reject, current_job
from queue_pg.jobs.tasks import TaskFailed, TaskResult
from queue_pg.jobs.tasks import task as task
from queue_pg.jobs.worker import Worker
from queue_pg.types import (
    DeleteResult,
    Grant,
    Message,
    MessageDetails,
    QueueConfig,
    QueueSettings,
    QueueStats,
    RedriveAllow,
    RedriveTask,
    Seconds,
    StoredResult,
    UndecodableBody,
)

try:  # the version lives in pyproject.toml only
    __version__ = _metadata.version("queue-pg")
except _metadata.PackageNotFoundError:  # a checkout on sys.path, not installed
    __version__ = "0+unknown"

__all__ = [
    "AccessDenied",
    "AsyncClient",
    "AsyncJob",
    "AsyncWorker",
    "Backoff",
    "Client",
    "ConsumerNotFound",
    "DeleteResult",
    "Grant",
    "GroupRequired",
    "InvalidParameter",
    "InvalidReceipt",
    "InvalidSchedule",
    "Job",
    "LeaseLimitExceeded",
    "LeaseLost",
    "Message",
    "MessageDetails",
    "MessageNotFound",
    "MessageTooLarge",
    "NoDeadLetterQueue",
    "OverLimit",
    "QueueAlreadyExists",
    "QueueConfig",
    "QueueError",
    "QueueInUse",
    "QueueNotFound",
    "QueueSettings",
    "QueueStats",
    "ReadOnlyServer",
    "RedriveAllow",
    "RedriveInProgress",
    "RedriveTask",
    "RedriveTaskNotFound",
    "Reject",
    "SchemaMissing",
    "Seconds",
    "ServerUnavailable",
    "Signature",
    "StaleReceipt",
    "StoredResult",
    "TaskFailed",
    "TaskResult",
    "UndecodableBody",
    "Worker",
    "__version__",
    "chain",
    "chord",
    "connect",
    "current_job",
    "group",
    "task",
]

logger = logging.getLogger("queue_pg")
_plain.install()  # every queue_pg log line shows hostile strings escaped


def connect(dsn: str | None = None, **kwargs: Any) -> Client:
    """A Client for ``dsn``, else ``$QUEUE_PG_DSN``, else the embedded server (started or reused).

    Logs (INFO, logger ``queue_pg``) which database it picked, without the password.
    ``kwargs`` go to :class:`Client` (min_size, max_size, sweep_interval, pool_timeout,
    reconnect_max).
    """
    from queue_pg.embedded import resolve_dsn

    resolved, origin = resolve_dsn(dsn)
    logger.info("queue_pg: using %s (%s)", safe_dsn(resolved), origin)
    return Client(resolved, **kwargs)
