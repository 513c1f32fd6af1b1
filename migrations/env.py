"""Alembic environment for queue_pg.

One transaction per upgrade: advisory lock (so concurrent installers queue up), CREATE SCHEMA
queue_pg (home of the version table ``queue_pg.alembic_version``), the revisions, then the
``sql/api`` files re-applied when needed. ``queue_pg.install.migrate()`` passes its connection in
``config.attributes["connection"]``; run by the alembic CLI instead, the DSN comes from
``sqlalchemy.url`` or the ``QUEUE_PG_DSN`` environment variable.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection

from queue_pg import _resources
from queue_pg.install import (
    MIGRATION_LOCK_KEY,
    SCHEMA,
    MigrationResult,
    api_needed,
    apply_api,
    checksum_comment_sql,
    make_engine,
    prepare,
)

config = context.config


def _dsn() -> str:
    dsn = config.get_main_option("sqlalchemy.url") or os.environ.get("QUEUE_PG_DSN")
    if not dsn:
        raise RuntimeError("queue_pg migrations need a database: set QUEUE_PG_DSN")
    return dsn


def run_online(conn: Connection) -> None:
    """Upgrade inside one transaction (the caller's, if it already opened one)."""
    tx: AbstractContextManager[Any] = nullcontext() if conn.in_transaction() else conn.begin()
    with tx:
        prepare(conn)
        context.configure(connection=conn, version_table_schema=SCHEMA, target_metadata=None)
        migration = context.get_context()
        before = migration.get_current_revision()
        with context.begin_transaction():
            context.run_migrations()
        after = migration.get_current_revision()
        # The api is only valid on the newest tables (a downgrade leaves it alone).
        at_head = after == context.get_head_revision()
        force = config.attributes.get("reapply_api")
        applied = at_head and api_needed(conn, ran=before != after, force=force)
        if applied:
            apply_api(conn)
    result = config.attributes.get("result")
    if isinstance(result, dict):
        result["result"] = MigrationResult(before=before, after=after, api_applied=applied)


def run_offline() -> None:
    """``alembic upgrade --sql``: print the upgrade (with the api files) instead of running it."""
    context.configure(
        url=_dsn(), version_table_schema=SCHEMA, literal_binds=True, dialect_name="postgresql"
    )
    impl = context.get_context().impl
    with context.begin_transaction():
        impl.static_output(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY});")
        impl.static_output(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA};")
        context.run_migrations()
        for path in _resources.api_files():
            impl.static_output(f"-- sql/api/{path.name}\n" + _resources.read(path).rstrip())
        impl.static_output(checksum_comment_sql() + ";")


if context.is_offline_mode():
    run_offline()
else:
    connection = config.attributes.get("connection")
    if isinstance(connection, Connection):
        run_online(connection)
    else:
        engine = make_engine(_dsn())
        try:
            with engine.connect() as own:
                run_online(own)
        finally:
            engine.dispose()
