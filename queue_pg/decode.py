"""Decoding results: tuple rows into the dataclasses of :mod:`queue_pg.types`, jsonb into Python.

Rows are matched to the dataclass fields by column name once per result (a dict per row was a
third of the client's CPU on a receive of 10). The clients' own connections load jsonb with
:class:`JsonbLoader`, which never raises for one value.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any, TypeVar

from psycopg.abc import Buffer
from psycopg.adapt import AdaptersMap, Loader
from psycopg.pq import ExecStatus, Format
from psycopg.pq.abc import PGresult
from psycopg.types.json import JsonbLoader as _PsycopgJsonbLoader

from queue_pg.types import (
    DeleteResult,
    Grant,
    Message,
    QueueConfig,
    QueueStats,
    RedriveTask,
    StoredResult,
    UndecodableBody,
)

__all__ = [
    "Columns",
    "JsonbLoader",
    "Row",
    "Rows",
    "as_bool",
    "as_datetime",
    "as_int",
    "as_str",
    "columns",
    "delete_result",
    "fast_jsonb",
    "grant_info",
    "ids",
    "many",
    "message",
    "nothing",
    "one",
    "queue_config",
    "queue_stats",
    "redrive_task",
    "stored_result",
]

D = TypeVar("D")

Row = tuple[Any, ...]
Rows = Sequence[Row]
Columns = tuple[str, ...]


def columns(result: PGresult | None) -> Columns | None:
    """The column names of a result that has rows, else None (LISTEN, UNLISTEN).

    Read from the result itself: ``cursor.description`` builds a Column object per column on
    every call."""
    if result is None or result.status != ExecStatus.TUPLES_OK:
        return None
    return tuple((result.fname(i) or b"").decode() for i in range(result.nfields))


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


def record(cls: type[D]) -> Callable[[Columns], Callable[[Row], D]]:
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


message = record(Message)
queue_config = record(QueueConfig)
queue_stats = record(QueueStats)
delete_result = record(DeleteResult)
grant_info = record(Grant)
redrive_task = record(RedriveTask)
stored_result = record(StoredResult)


# --- jsonb ----------------------------------------------------------------------------------

_JSONB_OID = 3802
_raw_decode = json.JSONDecoder().raw_decode


class JsonbLoader(Loader):
    """psycopg's jsonb loader calls ``json.loads`` on bytes, which sniffs the encoding, decodes
    with surrogatepass and matches whitespace on both sides: three quarters of its time on a
    small body. PostgreSQL's jsonb text is UTF-8 with no whitespace around the value, so one
    ``raw_decode`` of the decoded text gives the same value; anything else goes to
    ``json.loads``, so values stay its own.

    It never raises: a value Python refuses (nesting past the recursion limit; an integer of
    more digits than ``sys.get_int_max_str_digits()``, which is what jsonb makes of ``1e5000``)
    loads as :class:`UndecodableBody`, so one such message does not take the rows received
    with it down."""

    def load(self, data: Buffer) -> Any:
        text = bytes(data).decode("utf-8", "surrogatepass")
        try:
            try:
                value, end = _raw_decode(text)
            except ValueError:
                return json.loads(text)
            return value if end == len(text) else json.loads(text)
        except (ValueError, RecursionError, MemoryError) as exc:
            return _undecodable(text, exc)


def _undecodable(text: str, exc: BaseException) -> UndecodableBody:
    return UndecodableBody(text, f"{type(exc).__name__}: {str(exc)[:200]}")


def fast_jsonb(adapters: AdaptersMap) -> None:
    """Load jsonb with :class:`JsonbLoader` on a connection of the client's own pool, unless
    jsonb loading was customised (``psycopg.types.json.set_json_loads``): that is kept. A
    caller's connection is never changed."""
    if adapters.get_loader(_JSONB_OID, Format.TEXT) is _PsycopgJsonbLoader:
        adapters.register_loader(_JSONB_OID, JsonbLoader)


def one(record: Callable[[Columns], Callable[[Row], D]]) -> Callable[[Columns, Rows], D]:
    def decode(columns: Columns, rows: Rows) -> D:
        if len(rows) != 1:
            raise RuntimeError(f"queue_pg: expected one row, got {len(rows)}")
        return record(columns)(rows[0])

    return decode


def many(
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


def as_int(columns: Columns, rows: Rows) -> int:
    return int(_scalar(columns, rows))


def as_int_or_none(columns: Columns, rows: Rows) -> int | None:
    value = _scalar(columns, rows)
    return None if value is None else int(value)


def as_bool(columns: Columns, rows: Rows) -> bool:
    return bool(_scalar(columns, rows))


def as_str(columns: Columns, rows: Rows) -> str:
    return str(_scalar(columns, rows))


def as_datetime(columns: Columns, rows: Rows) -> datetime:
    value = _scalar(columns, rows)
    assert isinstance(value, datetime)
    return value


def ids(columns: Columns, rows: Rows) -> list[int]:
    return [int(r[0]) for r in rows]


def nothing(columns: Columns, rows: Rows) -> None:
    return None
