"""Typed values the clients return; plain frozen dataclasses so they are safe to share and compare.

Field names are the SQL column names (type ``queue_pg.message``, ``queue_info``, view
``queue_stats``), so decoding is a lookup by name and the two layers cannot drift apart silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeAlias, TypedDict

from queue_pg.errors import InvalidParameter

__all__ = [
    "JSON",
    "DeleteResult",
    "Grant",
    "Message",
    "MessageDetails",
    "QueueConfig",
    "QueueSettings",
    "QueueStats",
    "RedriveAllow",
    "RedriveTask",
    "Seconds",
    "StoredResult",
    "UndecodableBody",
    "flag",
    "integer",
    "seconds",
    "seconds_or_none",
    "text",
]

#: A JSON value as psycopg loads jsonb: dict, list, str, int, float, bool or None.
JSON: TypeAlias = Any

#: A duration: seconds as a number, or a timedelta. The SQL API takes float8 seconds.
Seconds: TypeAlias = float | int | timedelta


def _refuse(name: str, value: object, expected: str) -> InvalidParameter:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return InvalidParameter(f"{name} = {shown} is not {expected} ({type(value).__name__})")


def seconds(value: Seconds, name: str = "duration") -> float:
    """A duration as the float seconds the SQL functions take. Only the type is checked here
    (a number, not a bool or a string, or a timedelta): ranges are SQL's."""
    kind = type(value)
    if kind is float or kind is int:  # the common case first: this runs on every call
        return float(value)  # type: ignore[arg-type]  # narrowed by the test above
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(name, value, "a number of seconds or a timedelta")
    return float(value)


def seconds_or_none(value: Seconds | None, name: str = "duration") -> float | None:
    """Like seconds(), but None stays None (SQL NULL: the queue's default)."""
    return None if value is None else seconds(value, name)


def _checker(kind: type, expected: str) -> Callable[[Any, str], Any]:
    """A check that a value is a ``kind`` (a bool is no int). None goes through: whether NULL
    is allowed is the SQL function's to say."""

    def check(value: Any, name: str) -> Any:
        if type(value) is kind or value is None:  # the common case first
            return value
        if isinstance(value, kind) and not isinstance(value, bool):  # a subclass, not a bool
            return value
        raise _refuse(name, value, expected)

    return check


# ``check(value, name)``: the value if its type fits, else InvalidParameter naming ``name``.
integer = _checker(int, "an integer")
text = _checker(str, "a string")
flag = _checker(bool, "True or False")


class UndecodableBody:
    """The body of a received message that this client cannot turn into Python (nested deeper
    than the interpreter's recursion allows, a number like ``1e5000``, an integer of more
    digits than ``sys.int_info`` lets ``int()`` read). ``text`` is the body's JSON as stored,
    ``error`` what decoding it raised. Only that message carries it: the rest of its batch
    decodes as usual; a Worker dead-letters it with the error as the reason.
    """

    __slots__ = ("error", "text")

    def __init__(self, text: str, error: str) -> None:
        self.text = text
        self.error = error

    def __repr__(self) -> str:
        return f"UndecodableBody({self.text[:40]!r}..., error={self.error!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UndecodableBody) and (self.text, self.error) == (
            other.text, other.error)

    def __hash__(self) -> int:
        return hash((self.text, self.error))


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
    fifo: bool
    fair: bool
    content_dedup: bool
    dedup_window: float
    lease_durability: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One row of the ``queue_pg.queue_stats`` view.

    ``stale_receipts`` counts refused stale receipts (a sign the visibility timeout is too short);
    ``lease_expiries`` counts leases that lapsed and led to a redelivery.
    ``oldest_visible_age`` is in seconds, None when nothing is visible.
    ``approximate``: some count passed 1,000, so the counts past 1,000 are estimates (the latest
    sample moved on by the flow counters), not a scan; ``stats(queue, exact=True)`` counts them.
    """

    queue: str
    visible: int
    in_flight: int
    delayed: int
    dead_lettered: int
    oldest_visible_age: float | None
    stale_receipts: int
    lease_expiries: int
    approximate: bool


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A task's result as ``queue_pg.task_result`` reads it: ``status`` is "SUCCESS"
    (``result``: the return value), "FAILURE" (``error``: why), "RETRY" (failed, waiting for
    its next attempt) or "PENDING" (none of these, or expired)."""

    status: str
    result: JSON
    error: str | None
    done_at: datetime | None
    expires_at: datetime | None


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
class MessageDetails:
    """What ``message_details`` says of a received message: its ``group``, the ``dedup_id`` its
    send claimed (given, or the body's SHA-256 on a content_dedup queue), and on a FIFO queue its
    ``sequence`` (the message id, which orders its group); None where there is none."""

    group: str | None
    dedup_id: str | None
    sequence: int | None


@dataclass(frozen=True, slots=True)
class RedriveAllow:
    """Which queues may name this one as their dead-letter queue (SQS's RedriveAllowPolicy):
    ``permission`` is ``allow_all`` (the default), ``deny_all`` or ``by_queue``, with ``sources``
    the queues allowed (``by_queue`` only)."""

    permission: str
    sources: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Grant:
    """One per-queue grant (``list_grants``): ``role`` may ``privilege`` (send, receive, manage)
    on ``queue``, and so may every role that has the privileges of ``role``."""

    queue: str
    role: str
    privilege: str
    granted_at: datetime


@dataclass(frozen=True, slots=True)
class RedriveTask:
    """A redrive task (``start_redrive``): dead-lettered messages of ``dlq`` moving back to the
    queue each came from (``target`` None) or to ``target``, at most ``rate`` a second.

    ``status`` is running, completed, cancelled or failed (``error`` says why); ``moved`` of
    ``to_move`` (the movable messages counted at the start) are back.
    """

    id: int
    dlq: str
    target: str | None
    rate: float | None
    status: str
    moved: int
    to_move: int
    started_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    error: str | None


class QueueSettings(TypedDict, total=False):
    """Keyword settings of create_queue / alter_queue.

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
    fifo: bool
    fair: bool
    content_dedup: bool
    dedup_window: Seconds
    lease_durability: str
