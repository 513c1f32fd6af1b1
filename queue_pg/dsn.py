"""Connection strings: how queue_pg reads, merges and prints them."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import psycopg

__all__ = [
    "POOLERS", "checked_dsn", "libpq_dsn", "merge_conninfo", "pooler_of", "safe_dsn",
    "split_option", "sqlalchemy_url",
]

#: What may sit between the client and PostgreSQL: nothing ("none"), a pooler that gives each
#: client a server session for as long as it is connected ("session"), or one that lends a
#: server session per transaction ("transaction": no server-side prepared statements, no
#: session state, no LISTEN).
POOLERS = ("none", "session", "transaction")


def libpq_dsn(dsn: str) -> str:
    """Accept SQLAlchemy-style ``postgresql+psycopg://`` URLs too; libpq parses the rest.

    Letting libpq parse the DSN (rather than SQLAlchemy's URL parser) keeps every form psql
    accepts working: key=value strings, ``?host=/socket/dir``, multiple hosts, odd passwords.
    """
    return re.sub(r"^postgres(?:ql)?\+[A-Za-z0-9_]+://", "postgresql://", dsn.strip())


def checked_dsn(dsn: str) -> str:
    """``dsn`` as libpq takes it (SQLAlchemy-style URLs too); InvalidParameter in one line,
    with the forms it may take, when libpq cannot parse it (no traceback of psycopg's)."""
    from queue_pg.errors import InvalidParameter

    conninfo = libpq_dsn(dsn)
    try:
        psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise InvalidParameter(
            f"the DSN cannot be parsed: {str(exc).strip()}\nhint: give a URL"
            " (postgresql://user:password@host:5432/dbname) or key=value pairs"
            " (host=... port=... dbname=... user=...), with --dsn or QUEUE_PG_DSN"
        ) from None
    return conninfo


def merge_conninfo(conninfo: str, kwargs: Mapping[str, Any] | None) -> str:
    """A libpq DSN for a pool's server: its conninfo plus the connection-string kwargs."""
    not_conninfo = {"autocommit", "prepare_threshold", "row_factory", "cursor_factory", "context"}
    extra = {k: v for k, v in (kwargs or {}).items() if k not in not_conninfo}
    return psycopg.conninfo.make_conninfo(conninfo, **extra)


def safe_dsn(dsn: str) -> str:
    """The DSN without its password, for logs."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def split_option(dsn: str, key: str) -> tuple[str, str | None]:
    """``dsn`` without the queue_pg option ``key`` (libpq refuses keys it does not know), and
    the option's value: ``?key=value`` in a URL, ``key=value`` in a key/value string."""
    m = re.search(rf"([?&]){re.escape(key)}=([^&#]*)", dsn)
    if m is not None and "://" in dsn:
        rest = dsn[:m.start()] + (m.group(1) if dsn[m.end():m.end() + 1] == "&" else "")
        tail = dsn[m.end() + 1:] if dsn[m.end():m.end() + 1] == "&" else dsn[m.end():]
        return rest + tail, m.group(2)
    m = re.search(rf"(?:^|\s){re.escape(key)}\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn)
    if m is not None and "://" not in dsn:
        value = m.group(1)
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        return (dsn[:m.start()] + " " + dsn[m.end():]).strip(), value
    return dsn, None


def pooler_of(given: str | None, dsn: str | None) -> tuple[str | None, str]:
    """The DSN without its ``queue_pg_pooler`` option, and the pooler in front of the server:
    ``given`` (the client's argument), else the DSN's option, else ``QUEUE_PG_POOLER``, else
    "none". An unknown name is refused (InvalidParameter)."""
    from queue_pg.errors import InvalidParameter

    option = None
    if dsn is not None:
        dsn, option = split_option(dsn, "queue_pg_pooler")
    value = given or option or os.environ.get("QUEUE_PG_POOLER") or "none"
    if value not in POOLERS:
        raise InvalidParameter(f"pooler = {value!r}: allowed {', '.join(POOLERS)}")
    return dsn, value


def sqlalchemy_url(dsn: str) -> Any:
    """A libpq DSN (``app_dsn()``'s, the embedded server's: key=value with a socket folder) as
    a SQLAlchemy URL on the psycopg 3 driver, for ``SQLALCHEMY_DATABASE_URI`` or
    ``create_engine``: host and port go in the query, so a unix socket folder works too."""
    from sqlalchemy.engine import URL

    p = psycopg.conninfo.conninfo_to_dict(checked_dsn(dsn))
    return URL.create(
        "postgresql+psycopg", username=_opt(p.pop("user", None)),
        password=_opt(p.pop("password", None)), database=_opt(p.pop("dbname", None)),
        query={k: str(v) for k, v in p.items()},
    )


def _opt(value: Any) -> str | None:
    return None if value is None else str(value)
