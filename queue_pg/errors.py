"""One exception hierarchy for every queue_pg failure.

The SQL functions raise their own SQLSTATE codes (class ``QP``, see docs/design.md); the clients
map them here so callers catch ``queue_pg.StaleReceipt`` instead of parsing messages. Only those
codes, a few of PostgreSQL's bad-input codes and its "permission denied" are mapped, and so are the
errors a user meets at the door: a database that cannot be reached (wrong DSN, server down) and one
where queue_pg is not installed. Every other database error (deadlock, statement timeout, ...) is
not a queue error and propagates as psycopg raised it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import NoReturn, overload

import psycopg
from psycopg.errors import Diagnostic

__all__ = [
    "SQLSTATE_ERRORS",
    "AccessDenied",
    "ConsumerNotFound",
    "GroupRequired",
    "InvalidParameter",
    "InvalidReceipt",
    "InvalidSchedule",
    "KeyRevoked",
    "LeaseLimitExceeded",
    "MessageNotFound",
    "MessageTooLarge",
    "NoDeadLetterQueue",
    "OverLimit",
    "QueueAlreadyExists",
    "QueueError",
    "QueueInUse",
    "QueueNotFound",
    "ReadOnlyServer",
    "RedriveInProgress",
    "RedriveTaskNotFound",
    "SchemaMissing",
    "ServerUnavailable",
    "StaleReceipt",
    "error_class",
    "translate",
    "translating",
]


class QueueError(Exception):
    """Base of every error the queue raises on purpose.

    ``sqlstate`` is the server's code (``QP001`` ...) and ``diag`` psycopg's diagnostic of the
    original error (``diag.message_primary``, ``.message_detail``, ``.message_hint``), or None when
    the error was raised without a server round-trip. ``str(err)`` is the server's message, which
    names the parameter, the value and the allowed range.
    """

    sqlstate: str | None
    diag: Diagnostic | None

    def __init__(
        self, message: str = "", *, sqlstate: str | None = None, diag: Diagnostic | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.diag = diag


class QueueNotFound(QueueError):
    """The named queue does not exist (QP001)."""


class QueueAlreadyExists(QueueError):
    """create_queue of an existing queue with other settings (QP002)."""


class InvalidParameter(QueueError, ValueError):
    """A value out of range or malformed (QP003, and PostgreSQL's own bad-input codes).

    Also a ValueError, so code that validates input generically still catches it.
    """


class MessageTooLarge(InvalidParameter):
    """Body larger than the queue's max_message_size (QP004)."""


class StaleReceipt(QueueError):
    """Receipt from an earlier receive: someone else may hold the message now (QP005)."""


class InvalidReceipt(QueueError):
    """Malformed, forged, or another queue's receipt (QP006)."""


class LeaseLimitExceeded(QueueError):
    """A visibility change would push the lease past max_lease from its receive (QP007)."""


class OverLimit(QueueError):
    """in_flight_limit reached on a short-poll receive (QP008)."""


class MessageNotFound(QueueError):
    """change_visibility / update on a message that is gone: deleted, expired or moved (QP009)."""


class QueueInUse(QueueError):
    """drop_queue of a queue that is another queue's dead_letter_queue (QP010)."""


class GroupRequired(InvalidParameter):
    """A send to a FIFO queue without a ``group`` (QP030)."""


class AccessDenied(QueueError):
    """The caller may not do this (QP011): no grant on the queue, or not in the group role.

    Also PostgreSQL's own ``insufficient_privilege`` (42501), raised before our check when the
    role may not even call the function (it is in none of the group roles that may).
    """


class KeyRevoked(AccessDenied):
    """An endpoint's request signed by a key that was revoked, or whose role was dropped, since
    the endpoint took it into memory (QP040): checked in the request's own transaction, so
    nothing of the request is done; the endpoints answer as for an unknown key."""


class InvalidSchedule(InvalidParameter):
    """A periodic task's schedule SQL refuses (QP025): a malformed cron expression or one that
    never fires, an unknown time zone, a bad name or missed-ticks policy."""


class NoDeadLetterQueue(InvalidParameter):
    """dead_letter on a queue that has no dead_letter_queue (QP038): the caller must keep the
    message some other way (a worker retries it later), never drop it."""


class RedriveTaskNotFound(QueueError):
    """cancel_redrive of a task id that does not exist, or whose queue was dropped (QP035)."""


class RedriveInProgress(QueueError):
    """start_redrive on a dead-letter queue that has a running task already (QP036)."""


class ConsumerNotFound(QueueError):
    """A receive naming a consumer id that register_consumer did not give, or that a reap
    ended (QP050): its leases could never end early, so the receive is refused."""


# --- at the door: the database cannot be used at all ------------------------------------------

#: Shown with every ServerUnavailable: what to check.
SERVER_HINT = (
    "check the DSN (--dsn or QUEUE_PG_DSN: host, port, user, password, database) and that the"
    " server runs (`queue-pg server start` for the embedded one)"
)
#: Shown with PostgreSQL's own permission errors: the connecting role lacks a group role.
PRIVILEGE_HINT = (
    "the connecting role is not in the group role for this: queue_pg_producer to send,"
    " queue_pg_consumer to receive, queue_pg_admin for everything (an admin runs"
    " `GRANT queue_pg_consumer TO <role>`), then `queue-pg grant QUEUE ROLE PRIVILEGE`;"
    " see docs/access.md"
)
#: Shown with every SchemaMissing: the one command that fixes it.
SCHEMA_HINT = "run `queue-pg migrate`, or Client.migrate()"


class ServerUnavailable(QueueError, psycopg.OperationalError):
    """The database cannot be reached: a wrong host, port, user, password or database in the DSN,
    or a server that is down or restarting.

    Also a ``psycopg.OperationalError``, so code that waits out outages keeps recognising it.
    """

    diag: Diagnostic | None = None  # type: ignore[assignment]  # not psycopg.Error's property


class ReadOnlyServer(ServerUnavailable):
    """The server takes no writes: a hot standby (``pg_is_in_recovery()``), or one set read-only
    (a standby being promoted). What only reads (stats, top, metrics, the dashboard) runs there;
    sends, receives, deletes and migrations need the primary.

    A ``ServerUnavailable``: during a failover or switchover a connection may meet a server that
    is about to go read-only or writable, and workers wait that out as any outage.
    """


class SchemaMissing(QueueError):
    """queue_pg is not installed in this database, or is older than this package's functions."""


#: Server codes that mean "no queue_pg here": no schema, no such function, no such table.
SCHEMA_MISSING_SQLSTATES = frozenset({"3F000", "42883", "42P01"})
#: Server codes that mean "no server right now": class 08 (connection exception) and 57P01-3
#: (admin shutdown, crash shutdown, cannot connect now).
SERVER_UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
#: read_only_sql_transaction: a write on a hot standby, or on a server set read-only
READ_ONLY_SQLSTATE = "25006"
#: Shown with every ReadOnlyServer.
READ_ONLY_HINT = (
    "this server is a hot standby or read-only: writes need the primary; name every node in the"
    " DSN with target_session_attrs=read-write (postgresql://h1,h2/db?target_session_attrs=read-write)"
)


#: Codes of a statement the server does not know or already has: prepared statements that a
#: pooler in transaction mode mixed up between clients (an OperationalError in psycopg, but a
#: misconfiguration, not an outage: see docs/operations.md, "Behind a connection pooler").
PREPARED_STATEMENT_SQLSTATES = frozenset({"26000", "42P05"})


def _unavailable(exc: psycopg.Error) -> bool:
    """A lost or refused connection; not a statement timeout, lock timeout or deadlock (also
    OperationalErrors, but with codes of their own), nor a prepared statement gone astray."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if exc.sqlstate in PREPARED_STATEMENT_SQLSTATES:
        return False
    code = exc.sqlstate
    return code is None or code.startswith("08") or code in SERVER_UNAVAILABLE_SQLSTATES


def _door_error(exc: psycopg.Error) -> QueueError | None:
    """The door-class error for ``exc``, with its hint, or None."""
    detail = (exc.diag.message_primary or str(exc)).strip()
    if exc.sqlstate in SCHEMA_MISSING_SQLSTATES:
        return SchemaMissing(
            f"queue_pg is not installed in this database ({SCHEMA_HINT}): {detail}",
            sqlstate=exc.sqlstate, diag=exc.diag,
        )
    if exc.sqlstate == READ_ONLY_SQLSTATE:
        return ReadOnlyServer(f"the database takes no writes: {detail}\nhint: {READ_ONLY_HINT}",
                              sqlstate=exc.sqlstate, diag=exc.diag)
    if _unavailable(exc):
        return ServerUnavailable(f"cannot reach the database: {detail}\nhint: {SERVER_HINT}",
                                 sqlstate=exc.sqlstate, diag=exc.diag)
    return None


# --- what the server says ------------------------------------------------------------------------

#: SQLSTATE -> exception class. The QP codes are ours; the others are PostgreSQL's bad-input
#: errors that fire before our checks do (``\u0000`` in jsonb, an int out of range, ...).
SQLSTATE_ERRORS: dict[str, type[QueueError]] = {
    "QP001": QueueNotFound,
    "QP002": QueueAlreadyExists,
    "QP003": InvalidParameter,
    "QP004": MessageTooLarge,
    "QP005": StaleReceipt,
    "QP006": InvalidReceipt,
    "QP007": LeaseLimitExceeded,
    "QP008": OverLimit,
    "QP009": MessageNotFound,
    "QP010": QueueInUse,
    "QP011": AccessDenied,
    "QP040": KeyRevoked,
    "QP025": InvalidSchedule,
    "QP030": GroupRequired,
    "QP035": RedriveTaskNotFound,
    "QP036": RedriveInProgress,
    "QP038": NoDeadLetterQueue,
    "QP050": ConsumerNotFound,
    "42501": AccessDenied,  # insufficient_privilege: no EXECUTE on the function, no schema USAGE
    "22P05": InvalidParameter,  # untranslatable_character
    "22021": InvalidParameter,  # character_not_in_repertoire
    "22P02": InvalidParameter,  # invalid_text_representation
    "22003": InvalidParameter,  # numeric_value_out_of_range
    "54000": InvalidParameter,  # program_limit_exceeded (e.g. jsonb too big)
    "54001": InvalidParameter,  # statement_too_complex: stack depth (JSON nested too deep to parse)
}


def error_class(sqlstate: str | None) -> type[QueueError] | None:
    """The class for a SQLSTATE, or None when it is not one of ours."""
    return SQLSTATE_ERRORS.get(sqlstate) if sqlstate else None


@overload
def translate() -> AbstractContextManager[None]: ...
@overload
def translate(exc: psycopg.Error) -> NoReturn: ...


def translate(exc: psycopg.Error | None = None) -> AbstractContextManager[None]:
    """Map a psycopg error to its queue_pg class; two forms.

    ``translate(exc)`` raises ``exc`` as its queue_pg class (``__cause__`` = exc), or re-raises
    it unchanged when its SQLSTATE is not mapped. ``with translate(): ...`` does that for any
    psycopg error raised in the block (for SQL run by hand, e.g. in tests).
    """
    if exc is None:
        return translating()
    cls = error_class(exc.sqlstate)
    if cls is None and exc.sqlstate is None and isinstance(exc, psycopg.DataError):
        cls = InvalidParameter  # refused by psycopg before sending: a NUL in a text parameter
    if cls is None:
        door = _door_error(exc)
        if door is not None:
            raise door from exc
        raise exc
    message = exc.diag.message_primary or str(exc)
    if exc.sqlstate == "42501":  # the server's bare "permission denied for schema queue_pg"
        message += f"\nhint: {PRIVILEGE_HINT}"
    raise cls(message, sqlstate=exc.sqlstate, diag=exc.diag) from exc


@contextmanager
def translating() -> Iterator[None]:
    """``with translating(): ...`` runs the block with psycopg errors passed through translate."""
    try:
        yield
    except psycopg.Error as exc:
        translate(exc)
