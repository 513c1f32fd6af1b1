"""Connection strings: how queue_pg reads, merges and prints them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import psycopg

__all__ = ["checked_dsn", "libpq_dsn", "merge_conninfo", "safe_dsn", "sqlalchemy_url"]


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
