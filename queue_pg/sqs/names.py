"""Queue names, URLs and ARNs: SQS's forms <-> queue_pg's names.

queue_pg names allow no dot, and SQS requires FIFO queue names to end in ``.fifo``: the
endpoint stores ``orders.fifo`` as queue_pg queue ``orders-fifo`` and shows a FIFO queue named
``x-fifo`` as ``x.fifo``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from queue_pg.errors import QueueNotFound
from queue_pg.types import QueueConfig

ACCOUNT = "000000000000"
REGION = "us-east-1"


def to_queue_pg(sqs_name: str) -> str:
    return sqs_name[: -len(".fifo")] + "-fifo" if sqs_name.endswith(".fifo") else sqs_name


def to_sqs(config: QueueConfig) -> str:
    return sqs_name(config.name, config.fifo)


def sqs_name(name: str, fifo: bool) -> str:
    """The SQS name of queue_pg queue ``name`` (``fifo``: whether it is a FIFO queue)."""
    return name[: -len("-fifo")] + ".fifo" if fifo and name.endswith("-fifo") else name


def arn(sqs_name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{sqs_name}"


def from_arn(value: str) -> str:
    """The queue_pg name of a queue ARN (any region or account: there is one of each here)."""
    parts = value.split(":")
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"]:
        raise QueueNotFound(f"{value!r} is not a queue ARN (arn:aws:sqs:REGION:ACCOUNT:NAME)")
    return to_queue_pg(parts[5])


def url(base: str, sqs_name: str) -> str:
    return f"{base.rstrip('/')}/{ACCOUNT}/{sqs_name}"


def from_url(value: str) -> str:
    """The queue_pg name of a queue URL: its last path segment."""
    path = urlsplit(value).path.rstrip("/")
    name = path.rsplit("/", 1)[-1]
    if not name:
        raise QueueNotFound(f"QueueUrl {value!r} names no queue")
    return to_queue_pg(name)
