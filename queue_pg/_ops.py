"""The I/O-free half of both clients: SQL text + parameters per operation, and row decoders.

Client and AsyncClient only execute a :class:`Call` and hand the rows to its ``decode``, so the
SQL each method sends is written once, here. Calls use named arguments with explicit casts, so a
Python int always resolves the same function overload and an out-of-range number becomes
PostgreSQL's 22003 (-> InvalidParameter) instead of "function does not exist". There is no
validation here beyond type conversion: ranges and rules are the SQL functions' job.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Generic, TypeVar

from psycopg import sql
from psycopg.abc import Buffer, QueryNoTemplate
from psycopg.adapt import AdaptersMap, Loader
from psycopg.pq import ExecStatus, Format
from psycopg.pq.abc import PGresult
from psycopg.types.json import Jsonb, JsonbLoader

from queue_pg.types import (
    JSON,
    DeleteResult,
    Grant,
    Message,
    QueueConfig,
    QueueStats,
    Seconds,
    seconds,
    seconds_or_none,
)

T = TypeVar("T")
D = TypeVar("D")

Row = tuple[Any, ...]
Rows = Sequence[Row]
Columns = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One statement to run and how to turn its result (column names, tuple rows) into T."""

    query: QueryNoTemplate
    params: Mapping[str, Any]
    decode: Callable[[Columns, Rows], T]


def columns(result: PGresult | None) -> Columns | None:
    """The column names of a result that has rows, else None (LISTEN, UNLISTEN).

    Read from the result itself: ``cursor.description`` builds a Column object per column on
    every call."""
    if result is None or result.status != ExecStatus.TUPLES_OK:
        return None
    return tuple((result.fname(i) or b"").decode() for i in range(result.nfields))


# --- decoders -------------------------------------------------------------------------------
# Tuple rows, matched to the dataclass fields by column name once per result: a dict per row
# was a third of the client's CPU on a receive of 10.


def _slot_setter(cls: type[D], names: tuple[str, ...]) -> Callable[[Row], D]:
    """``cls(*row)`` for a frozen slots dataclass (no __post_init__), at half the cost.

    A frozen dataclass's __init__ sets each field through ``object.__setattr__``, which looks the
    name up again on every call: a tenth of the client's CPU on a receive of 100. Calling each
    slot's own setter builds the same object (equal, still frozen) without the lookup.
    The function is generated once per class, as dataclasses generates __init__.
    """
    setters = {f"_set{i}": getattr(cls, n).__set__ for i, n in enumerate(names)}
    body = "".join(f"    _set{i}(obj, row[{i}])\n" for i in range(len(names)))
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls, **setters}
    exec(f"def build(row):\n    obj = _new(_cls)\n{body}    return obj\n", namespace)
    build: Callable[[Row], D] = namespace["build"]
    return build


def _record(cls: type[D]) -> Callable[[Columns], Callable[[Row], D]]:
    """Given a result's columns, a builder of ``cls`` from one row. Columns in field order
    (the SQL functions return them so) build positionally; a schema newer than this client may
    add columns, which are ignored."""
    names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    slotted = "__slots__" in vars(cls) and not hasattr(cls, "__post_init__")
    positional = _slot_setter(cls, names) if slotted else (lambda row: cls(*row))

    def builder(columns: Columns) -> Callable[[Row], D]:
        if columns == names:
            return positional
        try:
            index = [columns.index(n) for n in names]
        except ValueError:
            missing = [n for n in names if n not in columns]
            raise RuntimeError(
                f"queue_pg: the server's result lacks {cls.__name__} column(s) {missing}"
                " (schema older than this client? run migrate)"
            ) from None
        return lambda row: cls(*[row[i] for i in index])

    return builder


message = _record(Message)
queue_config = _record(QueueConfig)
queue_stats = _record(QueueStats)
delete_result = _record(DeleteResult)
grant_info = _record(Grant)


# --- jsonb ----------------------------------------------------------------------------------

_JSONB_OID = 3802
_raw_decode = json.JSONDecoder().raw_decode


class _JsonbLoader(Loader):
    """psycopg's jsonb loader calls ``json.loads`` on bytes, which sniffs the encoding, decodes
    with surrogatepass and matches whitespace on both sides: three quarters of its time on a
    small body. PostgreSQL's jsonb text is UTF-8 with no whitespace around the value, so one
    ``raw_decode`` of the decoded text gives the same value; anything else goes to
    ``json.loads``, so values and errors stay its own."""

    def load(self, data: Buffer) -> Any:
        text = bytes(data).decode("utf-8", "surrogatepass")
        try:
            value, end = _raw_decode(text)
        except ValueError:
            return json.loads(text)
        return value if end == len(text) else json.loads(text)


def fast_jsonb(adapters: AdaptersMap) -> None:
    """Load jsonb with :class:`_JsonbLoader` on a connection of the client's own pool, unless
    jsonb loading was customised (``psycopg.types.json.set_json_loads``): that is kept. A
    caller's connection is never changed."""
    if adapters.get_loader(_JSONB_OID, Format.TEXT) is JsonbLoader:
        adapters.register_loader(_JSONB_OID, _JsonbLoader)


def _one(record: Callable[[Columns], Callable[[Row], D]]) -> Callable[[Columns, Rows], D]:
    def decode(columns: Columns, rows: Rows) -> D:
        if len(rows) != 1:
            raise RuntimeError(f"queue_pg: expected one row, got {len(rows)}")
        return record(columns)(rows[0])

    return decode


def _many(
    record: Callable[[Columns], Callable[[Row], D]],
) -> Callable[[Columns, Rows], list[D]]:
    def decode(columns: Columns, rows: Rows) -> list[D]:
        if not rows:
            return []
        build = record(columns)
        return [build(r) for r in rows]

    return decode


def _scalar(columns: Columns, rows: Rows) -> Any:
    # Every scalar call below selects one column named "result".
    return rows[0][0]


def _int(columns: Columns, rows: Rows) -> int:
    return int(_scalar(columns, rows))


def _bool(columns: Columns, rows: Rows) -> bool:
    return bool(_scalar(columns, rows))


def _str(columns: Columns, rows: Rows) -> str:
    return str(_scalar(columns, rows))


def _datetime(columns: Columns, rows: Rows) -> datetime:
    value = _scalar(columns, rows)
    assert isinstance(value, datetime)
    return value


def _ids(columns: Columns, rows: Rows) -> list[int]:
    return [int(r[0]) for r in rows]


def _nothing(columns: Columns, rows: Rows) -> None:
    return None


# --- queue settings -------------------------------------------------------------------------

# SQL type of each setting: the cast makes the call resolve exactly one signature.
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
}
SETTINGS: frozenset[str] = frozenset(_SETTING_TYPES)
_DURATIONS = frozenset(k for k, t in _SETTING_TYPES.items() if t == "float8")


def _settings_sql(settings: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Named-argument list for the given settings; unknown names are a TypeError (a signature
    error, like any Python call with a wrong keyword, and they never reach the SQL text)."""
    unknown = set(settings) - SETTINGS
    if unknown:
        raise TypeError(f"unknown queue setting(s): {', '.join(sorted(unknown))}")
    parts: list[str] = []
    params: dict[str, Any] = {}
    for key in sorted(settings):
        value = settings[key]
        if key in _DURATIONS:
            value = seconds_or_none(value)
        parts.append(f", {key} => %({key})s::{_SETTING_TYPES[key]}")
        params[key] = value
    return "".join(parts), params


def create_queue(name: str, settings: Mapping[str, Any]) -> Call[QueueConfig]:
    args, params = _settings_sql(settings)
    return Call(
        f"select * from queue_pg.create_queue(%(name)s{args})",
        {"name": name, **params},
        _one(queue_config),
    )


def alter_queue(
    name: str, settings: Mapping[str, Any], clear: Iterable[str] | None = None
) -> Call[QueueConfig]:
    args, params = _settings_sql(settings)
    if clear is not None:
        args += ", clear => %(clear)s::text[]"
        params["clear"] = list(clear)
    return Call(
        f"select * from queue_pg.alter_queue(%(name)s{args})",
        {"name": name, **params},
        _one(queue_config),
    )


def drop_queue(name: str, if_exists: bool = False) -> Call[bool]:
    return Call(
        "select queue_pg.drop_queue(%(name)s, if_exists => %(if_exists)s::bool) as result",
        {"name": name, "if_exists": if_exists},
        _bool,
    )


def list_queues() -> Call[list[QueueConfig]]:
    return Call("select * from queue_pg.list_queues()", {}, _many(queue_config))


def get_queue(name: str) -> Call[QueueConfig]:
    return Call("select * from queue_pg.get_queue(%(name)s)", {"name": name}, _one(queue_config))


# --- messages -------------------------------------------------------------------------------


def _jsonb(value: JSON | None) -> Jsonb | None:
    """SQL NULL for None (attributes "not given"), jsonb otherwise."""
    return None if value is None else Jsonb(value)


def send(
    queue: str,
    body: JSON,
    delay: Seconds | None = None,
    ttl: Seconds | None = None,
    attributes: Mapping[str, Any] | None = None,
    debounce: bool = False,
) -> Call[int]:
    """``debounce``: the send commits at once (the client's own connection), so SQL may skip
    a NOTIFY that another went out just before (see queue_pg._wake)."""
    return Call(
        "select queue_pg.send(%(queue)s, %(body)s::jsonb, delay => %(delay)s::float8,"
        " ttl => %(ttl)s::float8, attributes => %(attributes)s::jsonb,"
        " debounce => %(debounce)s::boolean) as result",
        {
            "queue": queue,
            "body": Jsonb(body),
            "delay": seconds_or_none(delay),
            "ttl": seconds_or_none(ttl),
            "attributes": _jsonb(attributes),
            "debounce": debounce,
        },
        _int,
    )


def send_batch(
    queue: str,
    bodies: Iterable[JSON],
    delay: Seconds | None = None,
    ttl: Seconds | None = None,
    attributes: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
    debounce: bool = False,
) -> Call[list[int]]:
    """``attributes`` is one mapping for every message, or a list parallel to ``bodies`` (SQL
    checks the lengths match). ``debounce`` as for :func:`send`."""
    # One jsonb array each, unpacked in SQL: psycopg dumps a list of Jsonb as a text[] literal
    # element by element, which dominated the client's time on large batches.
    body_list = list(bodies)
    attrs: list[Mapping[str, Any] | None] | None
    if attributes is None:
        attrs = None
    elif isinstance(attributes, Mapping):
        attrs = [attributes] * len(body_list)
    else:
        attrs = list(attributes)
    return Call(
        "select s.id from queue_pg.send_batch(%(queue)s,"
        " array(select e from jsonb_array_elements(%(bodies)s::jsonb) with ordinality a(e, i)"
        " order by i),"
        " delay => %(delay)s::float8, ttl => %(ttl)s::float8,"
        " attributes => case when %(attributes)s::jsonb is not null then array("
        "select nullif(e, 'null') from jsonb_array_elements(%(attributes)s::jsonb)"
        " with ordinality a(e, i) order by i) end,"
        " debounce => %(debounce)s::boolean)"
        " with ordinality as s(id, n) order by s.n",
        {
            "queue": queue,
            "bodies": Jsonb(body_list),
            "delay": seconds_or_none(delay),
            "ttl": seconds_or_none(ttl),
            "attributes": None if attrs is None else Jsonb(attrs),
            "debounce": debounce,
        },
        _ids,
    )


def receive(
    queue: str,
    max_messages: int = 1,
    visibility_timeout: Seconds | None = None,
    wait: Seconds | None = None,
    delete: Sequence[str] | None = None,
) -> Call[list[Message]]:
    """One receive attempt that never sleeps in the server (``poll => false``): the clients
    wait on LISTEN between attempts. SQL still checks ``wait`` and, when it is > 0, answers a
    reached in_flight_limit with nothing instead of OverLimit. ``delete``: receipts deleted
    first in the same transaction (only the first attempt of a long poll carries them)."""
    return Call(
        "select * from queue_pg._receive(%(queue)s, %(max_messages)s::int,"
        " %(visibility_timeout)s::float8, %(wait)s::float8, false, %(delete)b::text[])",
        {
            "queue": queue,
            "max_messages": max_messages,
            "visibility_timeout": seconds_or_none(visibility_timeout),
            "wait": seconds_or_none(wait),
            "delete": list(delete) if delete else None,
        },
        _many(message),
    )


def delete(queue: str, receipt: str) -> Call[bool]:
    return Call(
        "select queue_pg.delete_message(%(queue)s, %(receipt)s::text) as result",
        {"queue": queue, "receipt": receipt},
        _bool,
    )


def delete_batch(queue: str, receipts: Iterable[str]) -> Call[list[DeleteResult]]:
    return Call(
        "select * from queue_pg.delete_batch(%(queue)s, %(receipts)b::text[])",
        {"queue": queue, "receipts": list(receipts)},
        _many(delete_result),
    )


def change_visibility(
    queue: str, receipt: str, timeout: Seconds, release: bool = False
) -> Call[datetime]:
    return Call(
        "select queue_pg.change_visibility(%(queue)s, %(receipt)s::text,"
        " %(timeout)s::float8, release => %(release)s::boolean) as result",
        {"queue": queue, "receipt": receipt, "timeout": seconds(timeout), "release": release},
        _datetime,
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
            "queue": queue,
            "receipt": receipt,
            "body": _jsonb(body),
            "visibility_timeout": seconds_or_none(visibility_timeout),
            "attributes": _jsonb(attributes),
        },
        _one(message),
    )


def dead_letter(queue: str, receipt: str, reason: str | None = None) -> Call[bool]:
    return Call(
        "select queue_pg.dead_letter(%(queue)s, %(receipt)s::text, %(reason)s::text) as result",
        {"queue": queue, "receipt": receipt, "reason": reason},
        _bool,
    )


def peek(queue: str, n: int = 1) -> Call[list[Message]]:
    return Call(
        "select * from queue_pg.peek(%(queue)s, %(n)s::int)",
        {"queue": queue, "n": n},
        _many(message),
    )


def purge(queue: str) -> Call[int]:
    return Call("select queue_pg.purge(%(queue)s) as result", {"queue": queue}, _int)


def sweep() -> Call[int]:
    return Call("select queue_pg.sweep() as result", {}, _int)


def stats(queue: str) -> Call[QueueStats]:
    return Call("select * from queue_pg.stats(%(queue)s)", {"queue": queue}, _one(queue_stats))


def redrive(dlq: str, to: str | None = None, limit: int | None = None) -> Call[int]:
    return Call(
        'select queue_pg.redrive(%(dlq)s, "to" => %(to)s::text,'
        ' "limit" => %(limit)s::int) as result',
        {"dlq": dlq, "to": to, "limit": limit},
        _int,
    )


def channel(queue: str) -> Call[str]:
    return Call("select queue_pg.channel(%(queue)s) as result", {"queue": queue}, _str)


# --- access ---------------------------------------------------------------------------------


def grant(queue: str, role: str, privilege: str) -> Call[bool]:
    return Call(
        "select queue_pg.grant(%(queue)s, %(role)s::text, %(privilege)s::text) as result",
        {"queue": queue, "role": role, "privilege": privilege},
        _bool,
    )


def revoke(queue: str, role: str, privilege: str) -> Call[bool]:
    return Call(
        "select queue_pg.revoke(%(queue)s, %(role)s::text, %(privilege)s::text) as result",
        {"queue": queue, "role": role, "privilege": privilege},
        _bool,
    )


def list_grants(queue: str | None = None) -> Call[list[Grant]]:
    return Call(
        "select * from queue_pg.list_grants(%(queue)s::text)", {"queue": queue}, _many(grant_info)
    )


# --- LISTEN ---------------------------------------------------------------------------------


def listen(channel: str) -> Call[None]:
    """LISTEN takes no bind parameters: the channel is quoted as an identifier."""
    return Call(sql.SQL("LISTEN {}").format(sql.Identifier(channel)), {}, _nothing)


def unlisten(channel: str) -> Call[None]:
    return Call(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)), {}, _nothing)


#: How often a long poll re-checks without a NOTIFY: a delayed message coming due or a lapsed
#: lease sends none, so without this a waiter would miss them until its deadline.
RECHECK_INTERVAL = 1.0

#: After a NOTIFY wakes a long poll, one more attempt this long after it even when nothing was
#: found: sends committed right after the notifying one may have skipped theirs (debounce, 2 ms
#: in SQL) and committed after the attempt that the notify caused.
FOLLOW_UP = 0.01
