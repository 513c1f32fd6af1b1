"""Queue names, URLs and ARNs: SQS's forms <-> queue_pg's names.

queue_pg names allow no dot, and SQS requires FIFO queue names to end in ``.fifo``: the
endpoint stores ``orders.fifo`` as queue_pg queue ``orders-fifo`` and shows a FIFO queue named
``x-fifo`` as ``x.fifo``.
"""

from __future__ import annotations

import uuid
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


def url_name(value: str) -> str:
    """The SQS name in a queue URL: its last path segment."""
    name = urlsplit(value).path.rstrip("/").rsplit("/", 1)[-1]
    if not name:
        raise QueueNotFound(f"QueueUrl {value!r} names no queue")
    return name


def from_url(value: str) -> str:
    """The queue_pg name of a queue URL."""
    return to_queue_pg(url_name(value))


#: The high 64 bits of every MessageId: "queuepg" in hex, with the UUID version nibble 8 (custom).
_ID_HIGH = 0x7175_6575_6570_8067
#: Variant bits 10 (RFC 9562) over the low 64 bits; the 62 below them hold the message id.
_ID_VARIANT = 0b10 << 62
_ID_BITS = (1 << 62) - 1
#: The first three groups of every MessageId: _ID_HIGH as a UUID spells it.
_ID_HEAD = str(uuid.UUID(int=_ID_HIGH << 64))[:19]


def message_id(msg_id: int) -> str:
    """SQS's MessageId: a UUID-shaped string made of queue_pg's message id (unique across
    queues: one sequence), so it needs no table and reads back with :func:`message_id_of`."""
    if not 0 <= msg_id <= _ID_BITS:
        return str(msg_id)  # past 2**62 ids: not reached by a bigint sequence in practice
    low = f"{_ID_VARIANT | msg_id:016x}"  # as str(uuid.UUID(...)) spells it, without the object
    return f"{_ID_HEAD}{low[:4]}-{low[4:]}"


def message_id_of(value: str) -> int | None:
    """queue_pg's message id of a MessageId this endpoint made; None for any other string."""
    try:
        n = uuid.UUID(value).int
    except ValueError:
        return int(value) if value.isdigit() else None
    if n >> 64 != _ID_HIGH or (n >> 62) & 0b11 != 0b10:
        return None
    return n & _ID_BITS


def sequence_number(msg_id: int) -> str:
    """A FIFO message's SequenceNumber: its id (ids order a group), 20 digits as SQS's are."""
    return f"{msg_id:020d}"


def is_fifo_url(value: object) -> bool:
    """Whether a QueueUrl names a FIFO queue (SQS requires their names to end in .fifo)."""
    return isinstance(value, str) and urlsplit(value).path.rstrip("/").endswith(".fifo")
