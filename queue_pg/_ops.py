"""The statement builders: SQL text + parameters per operation, and which decoder reads the rows.

Client and AsyncClient only execute a :class:`Call` and hand the rows to its ``decode`` (from
:mod:`queue_pg.decode`), so the
SQL each method sends is written once, here. Calls use named arguments with explicit casts, so a
Python int always resolves the same function overload and an out-of-range number becomes
PostgreSQL's 22003 (-> InvalidParameter) instead of "function does not exist". There is no
validation here beyond types (a str where a number is due, ``delay=True``, ``max_messages=1.5``:
InvalidParameter before any round trip): ranges and rules are the SQL functions' job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from psycopg import sql
from psycopg.abc import QueryNoTemplate
from psycopg.types.json import Jsonb

from queue_pg.decode import (
    Columns,
    Rows,
    as_bool,
    as_datetime,
    as_int,
    as_int_or_none,
    as_str,
    delete_result,
    grant_info,
    ids,
    many,
    message,
    nothing,
    one,
    queue_config,
    queue_stats,
    redrive_task,
    stored_result,
)
from queue_pg.errors import InvalidParameter
from queue_pg.types import (
    JSON,
    DeleteResult,
    Grant,
    Message,
    MessageDetails,
    QueueConfig,
    QueueStats,
    RedriveAllow,
    RedriveTask,
    Seconds,
    StoredResult,
    flag,
    integer,
    seconds_or_none,
    text,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One statement to run and how to turn its result (column names, tuple rows) into T."""

    query: QueryNoTemplate
    params: Mapping[str, Any]
    decode: Callable[[Columns, Rows], T]


# --- queue settings -------------------------------------------------------------------------

# SQL type of each setting: the cast makes the call resolve exactly one signature; the Python
# type each must have is checked by _CHECKS.
_SETTING_TYPES: dict[str, str] = {
    "visibility_timeout": "float8",
    "message_ttl": "float8",
    "delay": "float8",
    "max_message_size": "int",
    "receive_wait": "float8",
    "max_lease": "float8",
    "dead_letter_queue": "text",
    "max_receive_count": "int",
    "in_flight_limit": "int",
    "history": "bool",
    "history_retention": "float8",
    "fifo": "bool",
    "fair": "bool",
    "content_dedup": "bool",
    "dedup_window": "float8",
    "lease_durability": "text",
}
SETTINGS: frozenset[str] = frozenset(_SETTING_TYPES)
_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "float8": seconds_or_none, "int": integer, "text": text, "bool": flag,
}


def _settings_sql(settings: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Named-argument list for the given settings; unknown names are a TypeError (a signature
    error, like any Python call with a wrong keyword, and they never reach the SQL text)."""
    unknown = set(settings) - SETTINGS
    if unknown:
        raise TypeError(f"unknown queue setting(s): {', '.join(sorted(unknown))}")
    parts: list[str] = []
    params: dict[str, Any] = {}
    for key in sorted(settings):
        value = _CHECKS[_SETTING_TYPES[key]](settings[key], key)
        parts.append(f", {key} => %({key})s::{_SETTING_TYPES[key]}")
        params[key] = value
    return "".join(parts), params


def create_queue(name: str, settings: Mapping[str, Any]) -> Call[QueueConfig]:
    args, params = _settings_sql(settings)
    return Call(
        f"select * from queue_pg.create_queue(%(name)s{args})",
        {"name": text(name, "name"), **params},
        one(queue_config),
    )


def alter_queue(
    name: str, settings: Mapping[str, Any], clear: Iterable[str] | None = None
) -> Call[QueueConfig]:
    args, params = _settings_sql(settings)
    if clear is not None:
        args += ", clear => %(clear)s::text[]"
        params["clear"] = [text(c, "clear") for c in _iterable(clear, "clear")]
    return Call(
        f"select * from queue_pg.alter_queue(%(name)s{args})",
        {"name": text(name, "name"), **params},
        one(queue_config),
    )


def drop_queue(name: str, if_exists: bool = False) -> Call[bool]:
    return Call(
        "select queue_pg.drop_queue(%(name)s, if_exists => %(if_exists)s::bool) as result",
        {"name": text(name, "name"), "if_exists": flag(if_exists, "if_exists")},
        as_bool,
    )


def list_queues() -> Call[list[QueueConfig]]:
    return Call("select * from queue_pg.list_queues()", {}, many(queue_config))


def get_queue(name: str) -> Call[QueueConfig]:
    return Call(
        "select * from queue_pg.get_queue(%(name)s)", {"name": text(name, "name")},
        one(queue_config),
    )


# --- messages -------------------------------------------------------------------------------


def _jsonb(value: JSON | None) -> Jsonb | None:
    """SQL NULL for None ("not given"), jsonb otherwise (SQL checks what it must be)."""
    return None if value is None else Jsonb(value)


def _iterable(value: Iterable[Any], name: str) -> Iterable[Any]:
    """``value`` when it is an iterable other than a str (whose letters would be taken for
    items), else InvalidParameter."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidParameter(f"{name} must be a list, not {type(value).__name__}")
    return value


def send(
    queue: str,
    body: JSON,
    delay: Seconds | None = None,
    ttl: Seconds | None = None,
    attributes: Mapping[str, Any] | None = None,
    debounce: bool = False,
    group: str | None = None,
    dedup_id: str | None = None,
) -> Call[int]:
    """``debounce``: the send commits at once (the client's own connection), so SQL may skip
    a NOTIFY that another went out just before (see queue_pg._wake)."""
    return Call(
        "select queue_pg.send(%(queue)s, %(body)s::jsonb, delay => %(delay)s::float8,"
        " ttl => %(ttl)s::float8, attributes => %(attributes)s::jsonb,"
        " debounce => %(debounce)s::boolean, \"group\" => %(group)s::text,"
        " dedup_id => %(dedup_id)s::text) as result",
        {
            "queue": text(queue, "queue"),
            "body": Jsonb(body),
            "delay": seconds_or_none(delay, "delay"),
            "ttl": seconds_or_none(ttl, "ttl"),
            "attributes": _jsonb(attributes),
            "debounce": debounce,
            "group": None if group is None else text(group, "group"),
            "dedup_id": text(dedup_id, "dedup_id"),
        },
        as_int,
    )


def send_batch(
    queue: str,
    bodies: Iterable[JSON],
    delay: Seconds | None = None,
    ttl: Seconds | None = None,
    attributes: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
    debounce: bool = False,
    group: str | Sequence[str | None] | None = None,
    dedup_ids: Sequence[str | None] | None = None,
) -> Call[list[int]]:
    """``attributes`` is one mapping for every message, or a list parallel to ``bodies`` (SQL
    checks the lengths match); so is ``group``, one name or a list. ``debounce`` as for
    :func:`send`."""
    # One jsonb array each, unpacked in SQL: psycopg dumps a list of Jsonb as a text[] literal
    # element by element, which dominated the client's time on large batches.
    body_list = list(_iterable(bodies, "bodies"))
    attrs: list[Mapping[str, Any] | None] | None
    if attributes is None:
        attrs = None
    elif isinstance(attributes, Mapping):
        attrs = [attributes] * len(body_list)
    else:
        attrs = list(_iterable(attributes, "attributes"))
    groups: list[str | None] | None
    if group is None:
        groups = None
    elif isinstance(group, str):
        groups = [group] * len(body_list)
    else:
        groups = [None if g is None else text(g, "group") for g in _iterable(group, "group")]
    return Call(
        "select s.id from queue_pg.send_batch(%(queue)s,"
        " array(select e from jsonb_array_elements(%(bodies)s::jsonb) with ordinality a(e, i)"
        " order by i),"
        " delay => %(delay)s::float8, ttl => %(ttl)s::float8,"
        " attributes => case when %(attributes)s::jsonb is not null then array("
        "select nullif(e, 'null') from jsonb_array_elements(%(attributes)s::jsonb)"
        " with ordinality a(e, i) order by i) end,"
        " debounce => %(debounce)s::boolean, \"group\" => %(group)s::text[],"
        " dedup_ids => %(dedup_ids)s::text[])"
        " with ordinality as s(id, n) order by s.n",
        {
            "queue": text(queue, "queue"),
            "bodies": Jsonb(body_list),
            "delay": seconds_or_none(delay, "delay"),
            "ttl": seconds_or_none(ttl, "ttl"),
            "attributes": None if attrs is None else Jsonb(attrs),
            "debounce": debounce,
            "group": groups,
            "dedup_ids": None if dedup_ids is None else [
                text(d, f"dedup_ids[{i}]") for i, d in enumerate(_iterable(dedup_ids, "dedup_ids"))
            ],
        },
        ids,
    )


def receive(
    queue: str,
    max_messages: int = 1,
    visibility_timeout: Seconds | None = None,
    wait: Seconds | None = None,
    delete: Sequence[str] | None = None,
    consumer: int | None = None,
) -> Call[list[Message]]:
    """One receive attempt that never sleeps in the server (``poll => false``): the clients
    wait on LISTEN between attempts. SQL still checks ``wait`` and, when it is > 0, answers a
    reached in_flight_limit with nothing instead of OverLimit. ``delete``: receipts deleted
    first in the same transaction (only the first attempt of a long poll carries them).
    ``consumer``: the id register_consumer gave, recorded with each lease."""
    return Call(
        "select * from queue_pg._receive(%(queue)s, %(max_messages)s::int,"
        " %(visibility_timeout)s::float8, %(wait)s::float8, false, %(delete)b::text[],"
        " %(consumer)s::int)",
        {
            "queue": text(queue, "queue"),
            "max_messages": integer(max_messages, "max_messages"),
            "visibility_timeout": seconds_or_none(visibility_timeout, "visibility_timeout"),
            "wait": seconds_or_none(wait, "wait"),
            "delete": _receipts(delete, "delete") if delete else None,
            "consumer": None if consumer is None else integer(consumer, "consumer"),
        },
        many(message),
    )


def register_consumer(name: str | None = None, adopt: int | None = None,
                      session: bool = True) -> Call[int | None]:
    """``session``: the connection is a session of the caller's own for the consumer's life
    (direct, or a session pooler's); False behind a transaction pooler (heartbeats only)."""
    return Call(
        "select queue_pg.register_consumer(%(name)s::text, %(adopt)s::int, %(session)s::boolean)"
        " as result",
        {"name": None if name is None else text(name, "name"),
         "adopt": None if adopt is None else integer(adopt, "adopt"),
         "session": bool(session)},
        as_int_or_none,
    )


def consumer_heartbeat(consumer: int) -> Call[bool]:
    return Call("select queue_pg.consumer_heartbeat(%(consumer)s::int) as result",
                {"consumer": integer(consumer, "consumer")}, as_bool)


def _beat_and_reap(columns: Columns, rows: Rows) -> tuple[bool, int]:
    return bool(rows[0][0]), int(rows[0][1])


def pulse(consumer: int) -> Call[tuple[bool, int]]:
    """A worker's second: its heartbeat (False: reaped, register again), then a reap (the
    leases it ended), in one round trip."""
    return Call("select queue_pg.consumer_heartbeat(%(consumer)s::int) as beat,"
                " queue_pg.reap_consumers() as reaped",
                {"consumer": integer(consumer, "consumer")}, _beat_and_reap)


def reap_consumers() -> Call[int]:
    return Call("select queue_pg.reap_consumers() as result", {}, as_int)


def _receipts(receipts: Iterable[str], name: str) -> list[str]:
    """A list of receipts (strings); the types checked in one pass at C speed."""
    found = list(_iterable(receipts, name))
    if not set(map(type, found)) <= {str}:
        bad = next(r for r in found if not isinstance(r, str))
        text(bad, f"{name}[{found.index(bad)}]")
    return found


def delete(queue: str, receipt: str) -> Call[bool]:
    return Call(
        "select queue_pg.delete_message(%(queue)s, %(receipt)s::text) as result",
        {"queue": text(queue, "queue"), "receipt": text(receipt, "receipt")},
        as_bool,
    )


def delete_batch(queue: str, receipts: Iterable[str]) -> Call[list[DeleteResult]]:
    return Call(
        "select * from queue_pg.delete_batch(%(queue)s, %(receipts)b::text[])",
        {"queue": text(queue, "queue"), "receipts": _receipts(receipts, "receipts")},
        many(delete_result),
    )


def change_visibility(
    queue: str, receipt: str, timeout: Seconds, release: bool = False
) -> Call[datetime]:
    return Call(
        "select queue_pg.change_visibility(%(queue)s, %(receipt)s::text,"
        " %(timeout)s::float8, release => %(release)s::boolean) as result",
        {"queue": text(queue, "queue"), "receipt": text(receipt, "receipt"),
         "timeout": seconds_or_none(timeout, "timeout"), "release": flag(release, "release")},
        as_datetime,
    )


def update(
    queue: str,
    receipt: str,
    body: JSON | None = None,
    visibility_timeout: Seconds | None = 0,
    attributes: Mapping[str, JSON] | None = None,
) -> Call[Message]:
    """``body=None`` keeps the body, ``visibility_timeout=None`` the lease (SQL NULL =
    unchanged); ``attributes`` are merged into the message's."""
    return Call(
        "select * from queue_pg.update_message(%(queue)s, %(receipt)s::text,"
        " body => %(body)s::jsonb, visibility_timeout => %(visibility_timeout)s::float8,"
        " attributes => %(attributes)s::jsonb)",
        {
            "queue": text(queue, "queue"),
            "receipt": text(receipt, "receipt"),
            "body": _jsonb(body),
            "visibility_timeout": seconds_or_none(visibility_timeout, "visibility_timeout"),
            "attributes": _jsonb(attributes),
        },
        one(message),
    )


def dead_letter(queue: str, receipt: str, reason: str | None = None) -> Call[bool]:
    return Call(
        "select queue_pg.dead_letter(%(queue)s, %(receipt)s::text, %(reason)s::text) as result",
        {"queue": text(queue, "queue"), "receipt": text(receipt, "receipt"),
         "reason": text(reason, "reason")},
        as_bool,
    )


def complete_task(queue: str, receipt: str, result: JSON, ttl: Seconds) -> Call[bool]:
    return Call(
        "select queue_pg.complete_task(%(queue)s, %(receipt)s::text, %(result)s::jsonb,"
        " %(ttl)s::float8) as result",
        {"queue": text(queue, "queue"), "receipt": text(receipt, "receipt"),
         "result": Jsonb(result), "ttl": seconds_or_none(ttl, "ttl")},
        as_bool,
    )


def complete_step(queue: str, receipt: str, result: JSON, ttl: Seconds | None) -> Call[bool]:
    return Call(
        "select queue_pg.complete_step(%(queue)s, %(receipt)s::text, %(result)s::jsonb,"
        " %(ttl)s::float8) as result",
        {"queue": text(queue, "queue"), "receipt": text(receipt, "receipt"),
         "result": Jsonb(result), "ttl": seconds_or_none(ttl, "ttl")},
        as_bool,
    )


def _chord_ids(columns: Columns, rows: Rows) -> tuple[int, list[int]]:
    chord, members = rows[0]
    return int(chord), [int(i) for i in members]


def send_chord(
    members: Sequence[Mapping[str, Any]], callback_queue: str, callback: Mapping[str, Any]
) -> Call[tuple[int, list[int]]]:
    return Call(
        "select chord_id, message_ids from queue_pg.send_chord(%(members)s::jsonb,"
        " %(callback_queue)s::text, %(callback)s::jsonb)",
        {"members": Jsonb(list(members)), "callback_queue": text(callback_queue, "queue"),
         "callback": Jsonb(dict(callback))},
        _chord_ids,
    )


def fail_task(queue: str, receipt: str, reason: str, ttl: Seconds) -> Call[bool]:
    return Call(
        "select queue_pg.fail_task(%(queue)s, %(receipt)s::text, %(reason)s::text,"
        " %(ttl)s::float8) as result",
        {"queue": text(queue, "queue"), "receipt": text(receipt, "receipt"),
         "reason": text(reason, "reason"), "ttl": seconds_or_none(ttl, "ttl")},
        as_bool,
    )


def task_result(queue: str, id: int) -> Call[StoredResult]:
    return Call(
        "select * from queue_pg.task_result(%(queue)s, %(id)s::bigint)",
        {"queue": text(queue, "queue"), "id": integer(id, "id")},
        one(stored_result),
    )


def task_result_channel(queue: str) -> Call[str]:
    return Call(
        "select queue_pg.task_result_channel(%(queue)s) as result",
        {"queue": text(queue, "queue")}, as_str,
    )


def peek(queue: str, n: int = 1) -> Call[list[Message]]:
    return Call(
        "select * from queue_pg.peek(%(queue)s, %(n)s::int)",
        {"queue": text(queue, "queue"), "n": integer(n, "n")},
        many(message),
    )


def message_groups(queue: str, receipts: Sequence[str]) -> Call[dict[str, str | None]]:
    return Call(
        "select receipt, \"group\" from queue_pg.message_groups(%(queue)s, %(receipts)s::text[])",
        {"queue": text(queue, "queue"),
         "receipts": [text(r, f"receipts[{i}]") for i, r in enumerate(receipts)]},
        lambda _columns, rows: {str(r[0]): r[1] for r in rows},
    )


def message_details(queue: str, receipts: Sequence[str]) -> Call[dict[str, MessageDetails]]:
    return Call(
        "select receipt, \"group\", dedup_id, sequence"
        " from queue_pg.message_details(%(queue)s, %(receipts)s::text[])",
        {"queue": text(queue, "queue"),
         "receipts": [text(r, f"receipts[{i}]") for i, r in enumerate(receipts)]},
        lambda _columns, rows: {str(r[0]): MessageDetails(r[1], r[2], r[3]) for r in rows},
    )


def purge(queue: str) -> Call[int]:
    return Call(
        "select queue_pg.purge(%(queue)s) as result", {"queue": text(queue, "queue")}, as_int
    )


def sweep() -> Call[int]:
    return Call("select queue_pg.sweep() as result", {}, as_int)


def stats(queue: str, exact: bool = False) -> Call[QueueStats]:
    return Call(
        "select * from queue_pg.stats(%(queue)s, exact => %(exact)s)",
        {"queue": text(queue, "queue"), "exact": bool(exact)},
        one(queue_stats),
    )


def redrive(dlq: str, to: str | None = None, limit: int | None = None) -> Call[int]:
    return Call(
        'select queue_pg.redrive(%(dlq)s, "to" => %(to)s::text,'
        ' "limit" => %(limit)s::int) as result',
        {"dlq": text(dlq, "dlq"), "to": text(to, "to"),
         "limit": integer(limit, "limit")},
        as_int,
    )


def cancel_message(queue: str, id: int, terminate: bool = False) -> Call[bool]:
    return Call(
        "select queue_pg.cancel_message(%(queue)s, %(id)s::bigint, %(terminate)s::boolean)"
        " as result",
        {"queue": text(queue, "queue"), "id": integer(id, "id"), "terminate": bool(terminate)},
        as_bool,
    )


def redrive_message(dlq: str, id: int, to: str | None = None) -> Call[bool]:
    return Call(
        'select queue_pg.redrive_message(%(dlq)s, %(id)s::bigint, "to" => %(to)s::text) as result',
        {"dlq": text(dlq, "dlq"), "id": integer(id, "id"), "to": text(to, "to")},
        as_bool,
    )


def start_redrive(dlq: str, to: str | None = None, rate: float | None = None) -> Call[int]:
    """``rate``: messages a second, a number (not a duration)."""
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)):
        raise InvalidParameter(f"rate = {rate!r:.40} is not a number of messages a second"
                               f" ({type(rate).__name__})")
    return Call(
        'select queue_pg.start_redrive(%(dlq)s, "to" => %(to)s::text,'
        " rate => %(rate)s::float8) as result",
        {"dlq": text(dlq, "dlq"), "to": text(to, "to"),
         "rate": None if rate is None else float(rate)},
        as_int,
    )


def _redrive_allow(columns: Columns, rows: Rows) -> RedriveAllow:
    policy = rows[0][0]
    sources = policy.get("sources")
    return RedriveAllow(policy["permission"], None if sources is None else tuple(sources))


def set_redrive_allow(
    queue: str, permission: str, sources: Sequence[str] | None = None
) -> Call[RedriveAllow]:
    return Call(
        "select queue_pg.set_redrive_allow(%(queue)s, %(permission)s,"
        " %(sources)s::text[]) as result",
        {"queue": text(queue, "queue"), "permission": text(permission, "permission"),
         "sources": None if sources is None
         else [text(q, f"sources[{i}]") for i, q in enumerate(sources)]},
        _redrive_allow,
    )


def redrive_allow(queue: str) -> Call[RedriveAllow]:
    return Call(
        "select queue_pg.redrive_allow(%(queue)s) as result", {"queue": text(queue, "queue")},
        _redrive_allow,
    )


def list_redrives(dlq: str | None = None) -> Call[list[RedriveTask]]:
    return Call(
        "select * from queue_pg.list_redrives(%(dlq)s::text)", {"dlq": text(dlq, "dlq")},
        many(redrive_task),
    )


def cancel_redrive(task: int) -> Call[RedriveTask]:
    return Call(
        "select * from queue_pg.cancel_redrive(%(task)s::bigint)",
        {"task": integer(task, "task")}, one(redrive_task),
    )


def redrive_step(max_rows: int = 1000) -> Call[int]:
    return Call(
        "select queue_pg.redrive_step(%(max_rows)s::int) as result",
        {"max_rows": integer(max_rows, "max_rows")}, as_int,
    )


def channel(queue: str) -> Call[str]:
    return Call(
        "select queue_pg.channel(%(queue)s) as result", {"queue": text(queue, "queue")}, as_str
    )


# --- access ---------------------------------------------------------------------------------


def _grant_params(queue: str, role: str, privilege: str) -> dict[str, str]:
    return {"queue": text(queue, "queue"), "role": text(role, "role"),
            "privilege": text(privilege, "privilege")}


def grant(queue: str, role: str, privilege: str) -> Call[bool]:
    return Call(
        "select queue_pg.grant(%(queue)s, %(role)s::text, %(privilege)s::text) as result",
        _grant_params(queue, role, privilege),
        as_bool,
    )


def revoke(queue: str, role: str, privilege: str) -> Call[bool]:
    return Call(
        "select queue_pg.revoke(%(queue)s, %(role)s::text, %(privilege)s::text) as result",
        _grant_params(queue, role, privilege),
        as_bool,
    )


def list_grants(queue: str | None = None) -> Call[list[Grant]]:
    return Call(
        "select * from queue_pg.list_grants(%(queue)s::text)",
        {"queue": text(queue, "queue")},
        many(grant_info),
    )


# --- LISTEN ---------------------------------------------------------------------------------


def listen(channel: str) -> Call[None]:
    """LISTEN takes no bind parameters: the channel is quoted as an identifier."""
    return Call(sql.SQL("LISTEN {}").format(sql.Identifier(channel)), {}, nothing)


def unlisten(channel: str) -> Call[None]:
    return Call(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)), {}, nothing)
