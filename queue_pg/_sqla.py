"""Joining a SQLAlchemy transaction: the psycopg connection under a Session or Connection.

``send(..., session=s)`` runs the same statement as ``send(..., conn=c)``, on the DBAPI
connection of the session's current transaction: no second connection, no commit, so the message
exists if and only if the session commits. Only the psycopg 3 driver (``postgresql+psycopg://``)
is supported: our statements bind psycopg's own types (``Jsonb``), which another driver would not
understand. The async client takes an ``AsyncSession`` or ``AsyncConnection`` the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

if TYPE_CHECKING:
    from typing import TypeAlias, TypeGuard

    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.engine import Engine as Engine
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session, scoped_session

    #: What ``session=`` accepts: an ORM session (or a scoped_session, such as Flask-SQLAlchemy's
    #: ``db.session``) or a Core connection.
    SessionLike: TypeAlias = Session | scoped_session[Any] | SAConnection
    #: What the async client's ``session=`` accepts.
    AsyncSessionLike: TypeAlias = (
        AsyncSession | async_scoped_session[Any] | SAAsyncConnection
    )

__all__ = [
    "ajoin",
    "async_psycopg_connection",
    "engine_connection",
    "is_engine",
    "join",
    "psycopg_connection",
]

C = TypeVar("C", psycopg.Connection[Any], psycopg.AsyncConnection[Any])


def _driver(driver: object, cls: type[C]) -> C:
    """The DBAPI connection, when it is psycopg 3's (else a TypeError that says so)."""
    if not isinstance(driver, cls):
        raise TypeError(
            "queue_pg works with SQLAlchemy on the psycopg 3 driver only"
            f" (postgresql+psycopg://), not {type(driver).__name__}"
        )
    return driver


def _not_a_session(session: object) -> TypeError:
    return TypeError(
        "session= takes a SQLAlchemy Session or Connection, not " + type(session).__name__
    )


def psycopg_connection(session: SessionLike) -> psycopg.Connection[Any]:
    """The psycopg connection of ``session``'s transaction, begun now if none is open.

    The SQLAlchemy side must know its transaction has begun, else it would never commit what
    we run on the driver connection: ``Session.connection()`` begins the session's transaction;
    a Core connection outside a transaction is made to begin one (as its next execute would).
    """
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.orm import Session, scoped_session

    if isinstance(session, scoped_session):
        session = session()  # this thread's (or app context's) session
    if isinstance(session, Session):
        sa_conn = session.connection()
    elif isinstance(session, SAConnection):
        sa_conn = session
        if not sa_conn.in_transaction():
            sa_conn.begin()
    else:
        raise _not_a_session(session)
    return _driver(sa_conn.connection.driver_connection, psycopg.Connection)


async def async_psycopg_connection(session: AsyncSessionLike) -> psycopg.AsyncConnection[Any]:
    """:func:`psycopg_connection` for SQLAlchemy's asyncio session or connection."""
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session

    if isinstance(session, async_scoped_session):
        session = session()
    if isinstance(session, AsyncSession):
        sa_conn = await session.connection()
    elif isinstance(session, SAAsyncConnection):
        sa_conn = session
        if not sa_conn.in_transaction():
            await sa_conn.begin()
    else:
        raise _not_a_session(session)
    raw = await sa_conn.get_raw_connection()
    return _driver(raw.driver_connection, psycopg.AsyncConnection)


def _one_of(conn: object, session: object) -> None:
    if conn is not None and session is not None:
        raise TypeError("pass conn= or session=, not both")


def join(
    conn: psycopg.Connection[Any] | None, session: SessionLike | None
) -> psycopg.Connection[Any] | None:
    """The connection a call runs on: ``conn``, or the one under ``session`` (not both)."""
    _one_of(conn, session)
    return conn if session is None else psycopg_connection(session)


async def ajoin(
    conn: psycopg.AsyncConnection[Any] | None, session: AsyncSessionLike | None
) -> psycopg.AsyncConnection[Any] | None:
    """:func:`join` for the async client."""
    _one_of(conn, session)
    return conn if session is None else await async_psycopg_connection(session)


@contextmanager
def detached_connection(engine: Engine) -> Iterator[psycopg.Connection[Any]]:
    """A raw psycopg connection taken out of ``engine``'s pool for good (autocommit), closed at
    the end instead of handed back."""
    raw = engine.raw_connection()
    try:
        conn = _driver(raw.driver_connection, psycopg.Connection)
        raw.detach()
        conn.autocommit = True
        yield conn
    finally:
        raw.close()


def is_engine(obj: object) -> TypeGuard[Engine]:
    """A SQLAlchemy Engine (False when SQLAlchemy is not installed)."""
    try:
        from sqlalchemy.engine import Engine
    except ImportError:  # pragma: no cover - sqlalchemy is optional for the client
        return False
    return isinstance(obj, Engine)


@contextmanager
def engine_connection(engine: Engine) -> Iterator[psycopg.Connection[Any]]:
    """A raw psycopg connection of ``engine``'s pool; committed on success, rolled back on
    error, then handed back."""
    raw = engine.raw_connection()
    try:
        conn = _driver(raw.driver_connection, psycopg.Connection)
        try:
            yield conn
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise
        conn.commit()
    finally:
        raw.close()
