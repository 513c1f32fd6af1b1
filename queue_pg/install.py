"""Install and upgrade the queue_pg schema with Alembic, safely from many processes at once.

Every upgrade runs in one transaction that first takes a transaction-level advisory lock
(``MIGRATION_LOCK_KEY``), so concurrent ``migrate()`` calls queue up and the later ones find the
database already at head. After the revisions, the ``sql/api`` files (all ``CREATE OR REPLACE``)
are applied in the same transaction whenever a revision ran or their checksum differs from the
one recorded on ``queue_pg.alembic_version``; so an unchanged install costs no DDL at all and a
DBA-installed database can be "migrated" by a role that may not replace the functions.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from psycopg.rows import tuple_row
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection as SAConnection
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool, StaticPool

from queue_pg import _resources
from queue_pg.dsn import libpq_dsn, split_option

__all__ = [
    "MIGRATION_LOCK_KEY",
    "SCHEMA",
    "MigrationResult",
    "alembic_config",
    "api_needed",
    "apply_api",
    "checksum_comment_sql",
    "current_revision",
    "execute_script",
    "head_revision",
    "install_script",
    "libpq_dsn",
    "make_engine",
    "migrate",
    "prepare",
    "run_schema_file",
    "run_sql",
]

SCHEMA = "queue_pg"
VERSION_TABLE = "alembic_version"
#: ``pg_advisory_xact_lock`` key serialising installs and upgrades: the bytes of "queue_pg".
MIGRATION_LOCK_KEY = int.from_bytes(b"queue_pg", "big")
_CHECKSUM_PREFIX = "queue_pg api sha256:"
#: Alembic keeps the running migration in module globals (``alembic.context``, ``alembic.op``),
#: so two upgrades in one process must not overlap; the advisory lock serialises processes.
_ALEMBIC_LOCK = threading.Lock()

Target = str | psycopg.Connection[Any] | Engine | SAConnection


@dataclass(frozen=True)
class MigrationResult:
    """What ``migrate()`` did, for a CLI to report."""

    before: str | None  #: revision before the upgrade (None: not installed)
    after: str | None  #: revision now (the head after a successful upgrade)
    api_applied: bool  #: whether the sql/api files were (re-)applied
    standby: bool = False  #: the server is a hot standby: nothing was done (migrate the primary)

    @property
    def upgraded(self) -> bool:
        return self.before != self.after


def make_engine(dsn: str, **kwargs: Any) -> Engine:
    """SQLAlchemy engine (psycopg 3 driver) whose connections libpq opens from ``dsn`` as given."""
    conninfo = split_option(libpq_dsn(dsn), "queue_pg_pooler")[0]  # the client's, not libpq's
    kwargs.setdefault("poolclass", NullPool)
    return create_engine(
        "postgresql+psycopg://", creator=lambda: psycopg.connect(conninfo), **kwargs
    )


def alembic_config(**attributes: Any) -> Config:
    """Alembic config built in code (no alembic.ini), pointing at the packaged migrations."""
    cfg = Config()
    # ConfigParser interpolates "%": escape it in the path.
    cfg.set_main_option("script_location", str(_resources.migrations_dir()).replace("%", "%%"))
    cfg.attributes.update(attributes)
    return cfg


def head_revision() -> str:
    """The newest revision this package knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the package always ships revision 0001
        raise RuntimeError("queue_pg ships no migrations")
    return head


def current_revision(target: str | psycopg.Connection[Any]) -> str | None:
    """Revision recorded in the database, or None when queue_pg is not installed there."""
    if isinstance(target, str):
        with psycopg.connect(split_option(libpq_dsn(target), "queue_pg_pooler")[0],
                             autocommit=True) as conn:
            return _read_revision(conn)
    return _read_revision(target)


def _read_revision(conn: psycopg.Connection[Any]) -> str | None:
    cur = conn.cursor(row_factory=tuple_row)
    cur.execute("SELECT to_regclass('queue_pg.alembic_version') IS NOT NULL")
    row = cur.fetchone()
    if row is None or not row[0]:
        return None
    cur.execute("SELECT version_num FROM queue_pg.alembic_version")
    rows = cur.fetchall()
    return str(rows[0][0]) if len(rows) == 1 else None


def migrate(target: Target, *, reapply_api: bool | None = None) -> MigrationResult:
    """Upgrade the database to head; safe to call on every start and from many processes.

    ``target`` is a DSN (libpq URI or key=value, also ``postgresql+psycopg://``), a psycopg
    connection (borrowed: it must be idle, and is left open with its settings restored), or a
    SQLAlchemy engine or connection (an open transaction on it is used, not committed).
    ``reapply_api``: None = apply the api files when a revision ran or they changed; True =
    always; False = never.
    """
    result: dict[str, MigrationResult] = {}
    with _ALEMBIC_LOCK, _sa_connection(target) as conn:
        began = not conn.in_transaction()
        standby = conn.exec_driver_sql("SELECT pg_is_in_recovery()").scalar()
        if began:  # the check's own transaction: alembic begins the migration's
            conn.rollback()
        if standby:
            # a hot standby takes no writes; the primary's migration reaches it by replication
            revision = _read_revision(_driver(conn))
            logging.getLogger("queue_pg").warning(
                "queue_pg migrate: the server is a hot standby (read-only), nothing to do here;"
                " migrate the primary (this standby is at revision %s)", revision)
            return MigrationResult(revision, revision, api_applied=False, standby=True)
        cfg = alembic_config(connection=conn, reapply_api=reapply_api, result=result)
        command.upgrade(cfg, "head")
    return result["result"]


@contextmanager
def _sa_connection(target: Target) -> Iterator[SAConnection]:
    if isinstance(target, SAConnection):
        yield target
    elif isinstance(target, Engine):
        with target.connect() as conn:
            yield conn
    elif isinstance(target, str):
        engine = make_engine(target)
        try:
            with engine.connect() as conn:
                yield conn
        finally:
            engine.dispose()
    elif isinstance(target, psycopg.Connection):
        with _borrowed(target) as conn:
            yield conn
    else:
        raise TypeError(f"migrate() needs a DSN or a connection, not {type(target).__name__}")


@contextmanager
def _borrowed(raw: psycopg.Connection[Any]) -> Iterator[SAConnection]:
    """Run SQLAlchemy on the caller's psycopg connection and hand it back as it was.

    The engine's StaticPool is never disposed (that would close the caller's connection); the
    driver must be out of autocommit so the migration is one transaction, and rows must be
    tuples for SQLAlchemy.
    """
    if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ValueError("migrate() needs an idle connection: commit or roll back first")
    autocommit, row_factory = raw.autocommit, raw.row_factory
    raw.autocommit = False
    raw.row_factory = tuple_row
    engine = create_engine("postgresql+psycopg://", creator=lambda: raw, poolclass=StaticPool)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE and not raw.closed:
            raw.rollback()
        if not raw.closed:
            raw.autocommit = autocommit
            raw.row_factory = row_factory
            _drop_sqlalchemy_notice_handler(raw)


def _drop_sqlalchemy_notice_handler(raw: psycopg.Connection[Any]) -> None:
    from sqlalchemy.dialects.postgresql import psycopg as sa_psycopg

    handler = getattr(sa_psycopg, "_log_notices", None)
    if handler is not None:
        with suppress(ValueError):
            raw.remove_notice_handler(handler)


# --- used by migrations/env.py and the revision files ------------------------------------------


def _driver(conn: SAConnection) -> psycopg.Connection[Any]:
    """The psycopg connection under ``conn``, in the same transaction.

    Whole SQL files go to it directly: psycopg sends a parameterless query as is (several
    statements allowed), whereas SQLAlchemy would read ``:name`` or ``%`` as placeholders.
    """
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    return driver


def execute_script(conn: SAConnection, sql: str, origin: str = "SQL") -> None:
    """Run a whole SQL script (many statements, dollar quotes, ``%``, ``:x``) in the transaction."""
    try:
        _driver(conn).execute(sql)
    except psycopg.Error as exc:
        if sys.version_info >= (3, 11):
            exc.add_note(f"while running {origin}")
        raise


def prepare(conn: SAConnection) -> None:
    """Take the migration lock, then make sure the schema exists for Alembic's version table.

    The lock comes first so two installers never race on CREATE SCHEMA. The schema is created
    only when missing: CREATE SCHEMA IF NOT EXISTS still demands CREATE on the database.
    """
    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
    if conn.exec_driver_sql(f"SELECT to_regnamespace('{SCHEMA}') IS NULL").scalar():
        conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")


def api_needed(conn: SAConnection, *, ran: bool, force: bool | None) -> bool:
    """Whether to apply the api files: forced either way, after any revision, or when changed."""
    if force is not None:
        return force
    if ran:
        return True
    stored = conn.exec_driver_sql(
        f"SELECT obj_description('{SCHEMA}.{VERSION_TABLE}'::regclass, 'pg_class')"
    ).scalar()
    return stored != _CHECKSUM_PREFIX + _resources.api_checksum()


def apply_api(conn: SAConnection) -> None:
    """Re-create every function and view, then record which api files the database now has."""
    for path in _resources.api_files():
        execute_script(conn, _resources.read(path), origin=f"sql/api/{path.name}")
    conn.exec_driver_sql(FIRST_PARTITIONS_SQL)
    conn.exec_driver_sql(checksum_comment_sql())


#: Today's history partition and the next two days', made by the install before any traffic:
#: a sweep only adds days ahead (see queue_pg._history_partitions).
FIRST_PARTITIONS_SQL = (
    f"SELECT {SCHEMA}._history_partitions(clock_timestamp(),"
    f" (SELECT coalesce(max(history_retention), 604800) FROM {SCHEMA}.queues), 0)"
)


def checksum_comment_sql() -> str:
    return (
        f"COMMENT ON TABLE {SCHEMA}.{VERSION_TABLE} IS "
        f"'{_CHECKSUM_PREFIX}{_resources.api_checksum()}'"
    )


def run_schema_file(name: str) -> None:
    """Body of a revision's ``upgrade()``: run ``sql/schema/<name>`` (online or ``--sql``)."""
    path = _resources.sql_dir() / "schema" / name
    run_sql(_resources.read(path), origin=f"sql/schema/{name}")


def run_sql(sql: str, origin: str = "SQL") -> None:
    """Run raw SQL from inside a revision; in offline (``--sql``) mode print it verbatim."""
    from alembic import context, op

    if context.is_offline_mode():
        op.get_context().impl.static_output(sql.rstrip())
    else:
        execute_script(op.get_bind(), sql, origin)


# --- for a DBA ------------------------------------------------------------------------------------


def install_script() -> str:
    """The whole install as one SQL script a DBA can review and run with psql.

    All or nothing (one transaction). It records the head revision and the api checksum exactly
    as ``migrate()`` would, so a later ``migrate()`` finds nothing to do. Only for a database
    without queue_pg: upgrades go through ``migrate()``.
    """
    head = head_revision()
    parts = [
        f"-- queue_pg install script: schema revision {head}. Fresh databases only.",
        "-- Run as a role that may create schema queue_pg, e.g.:",
        "--   psql -v ON_ERROR_STOP=1 -d mydb -f queue_pg_install.sql",
        "BEGIN;",
        f"DO $$ BEGIN PERFORM pg_advisory_xact_lock({MIGRATION_LOCK_KEY}); END $$;",
    ]
    for kind, files in (("schema", _resources.schema_files()), ("api", _resources.api_files())):
        for path in files:
            parts.append(f"\n-- ==== sql/{kind}/{path.name} ====\n")
            parts.append(_resources.read(path).rstrip() + "\n")
    parts += [
        "\n-- ==== Alembic bookkeeping: a later migrate() sees this database at head ====\n",
        f"CREATE TABLE {SCHEMA}.{VERSION_TABLE} (\n"
        "    version_num varchar(32) NOT NULL,\n"
        "    CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)\n"
        ");",
        f"INSERT INTO {SCHEMA}.{VERSION_TABLE} (version_num) VALUES ('{head}');",
        FIRST_PARTITIONS_SQL + ";",
        checksum_comment_sql() + ";",
        "COMMIT;",
    ]
    return "\n".join(parts) + "\n"
