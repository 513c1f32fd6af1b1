"""Typed values the clients return; plain frozen dataclasses so they are safe to share and compare.

Field names are the SQL column names (type ``queue_pg.message``, ``queue_info``, view
``queue_stats``), so decoding is a lookup by name and the two layers cannot drift apart silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeAlias, TypedDict

__all__ = [
    "JSON",
    "DeleteResult",
    "Grant",
    "Message",
    "QueueConfig",
    "QueueSettings",
    "QueueStats",
    "Seconds",
    "seconds",
    "seconds_or_none",
]

#: A JSON value as psycopg loads jsonb: dict, list, str, int, float, bool or None.
JSON: TypeAlias = Any

#: A duration: seconds as a number, or a timedelta. The SQL API takes float8 seconds.
Seconds: TypeAlias = float | int | timedelta


def seconds(value: Seconds) -> float:
    """Convert a duration to the float seconds the SQL functions take (no range checks: SQL's)."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value)


def seconds_or_none(value: Seconds | None) -> float | None:
    """Like seconds(), but None stays None (SQL NULL: the queue's default)."""
    return None if value is None else seconds(value)


@dataclass(frozen=True, slots=True)
class Message:
    """A message as receive / peek / update return it.

    ``receipt`` is None from peek. ``visible_until`` is the lease expiry after a receive (the time
    the message becomes visible again). ``expires_at`` is None for a queue whose message_ttl is
    NULL (never).
    """

    id: int
    queue: str
    body: JSON
    attributes: dict[str, Any] | None
    receipt: str | None
    receive_count: int
    enqueued_at: datetime
    first_received_at: datetime | None
    visible_until: datetime
    expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """A queue's row in ``queue_pg.queues``: its defaults. Durations are float seconds."""

    name: str
    visibility_timeout: float
    message_ttl: float | None
    delay: float
    max_message_size: int
    receive_wait: float
    max_lease: float
    dead_letter_queue: str | None
    max_receive_count: int | None
    in_flight_limit: int | None
    history: bool
    history_retention: float
    created_at: datetime


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One row of the ``queue_pg.queue_stats`` view.

    ``stale_receipts`` counts refused stale receipts (a sign the visibility timeout is too short);
    ``lease_expiries`` counts leases that lapsed and led to a redelivery.
    ``oldest_visible_age`` is in seconds, None when nothing is visible.
    """

    queue: str
    visible: int
    in_flight: int
    delayed: int
    dead_lettered: int
    oldest_visible_age: float | None
    stale_receipts: int
    lease_expiries: int


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """One entry of delete_batch.

    ``deleted`` is False both for a message already gone (a safe retry) and for a refusal;
    ``error`` tells them apart: None, or the error class name (``"StaleReceipt"``,
    ``"InvalidReceipt"``).
    """

    receipt: str
    deleted: bool
    error: str | None


@dataclass(frozen=True, slots=True)
class Grant:
    """One per-queue grant (``list_grants``): ``role`` may ``privilege`` (send, receive, manage)
    on ``queue``, and so may every role that has the privileges of ``role``."""

    queue: str
    role: str
    privilege: str
    granted_at: datetime


class QueueSettings(TypedDict, total=False):
    """Keyword settings of create_queue / alter_queue (the issue's settings table).

    A key that is absent is not sent, so SQL's default (create) or "unchanged" (alter) applies.
    A key given as None is sent as NULL: for create_queue ``message_ttl=None`` means never
    expire; for alter_queue NULL means unchanged, use ``clear=[...]`` to set a setting to NULL.
    """

    visibility_timeout: Seconds
    message_ttl: Seconds | None
    delay: Seconds
    max_message_size: int
    receive_wait: Seconds
    max_lease: Seconds
    dead_letter_queue: str | None
    max_receive_count: int | None
    in_flight_limit: int | None
    history: bool
    history_retention: Seconds
