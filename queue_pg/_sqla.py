"""Joining a SQLAlchemy transaction: the psycopg connection under a Session or Connection.

``send(..., session=s)`` runs the same statement as ``send(..., conn=c)``, on the DBAPI
connection of the session's current transaction: no second connection, no commit, so the message
exists if and only if the session commits. Only the psycopg 3 driver (``postgresql+psycopg://``)
is supported: our statements bind psycopg's own types (``Jsonb``), which another driver would not
understand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

if TYPE_CHECKING:
    from typing import TypeAlias

    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.orm import Session, scoped_session

    #: What ``session=`` accepts: an ORM session (or a scoped_session, such as Flask-SQLAlchemy's
    #: ``db.session``) or a Core connection.
    SessionLike: TypeAlias = Session | scoped_session[Any] | SAConnection

__all__ = ["join", "psycopg_connection"]


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
        raise TypeError(
            "session= takes a SQLAlchemy Session or Connection, not " + type(session).__name__
        )
    driver = sa_conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise TypeError(
            "queue_pg joins SQLAlchemy transactions on the psycopg 3 driver only"
            f" (postgresql+psycopg://), not {type(driver).__name__}"
        )
    return driver


def join(
    conn: psycopg.Connection[Any] | None, session: SessionLike | None
) -> psycopg.Connection[Any] | None:
    """The connection a call runs on: ``conn``, or the one under ``session`` (not both)."""
    if session is None:
        return conn
    if conn is not None:
        raise TypeError("pass conn= or session=, not both")
    return psycopg_connection(session)
