"""A pg_auto_failover cluster on loopback ports in a temporary folder, for failover tests.

A monitor, a primary and a synchronous standby, each a ``pg_autoctl ... --run`` process (run as
the ``postgres`` user when this runs as root) supervising its own PostgreSQL 15. The monitor's
health checks are made quick (:data:`MONITOR_SETTINGS`: a node is unhealthy after 4 s, a promoted
standby read-only for 3 s) so a failover takes seconds, not the defaults' 20 s + 30 s.
:meth:`Cluster.close` kills every process it started, whatever state they are in.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

__all__ = ["BIN", "Cluster", "Node", "available", "free_port", "servers_available"]

BIN = Path("/usr/lib/postgresql/15/bin")

#: the monitor's health checks (GUCs of the pgautofailover extension), made quick
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "1000",
    # a check that merely waits on a loaded machine must not fail: a standby judged unhealthy
    # turns synchronous replication off (wait_primary), and a primary lost in that window takes
    # acknowledged commits with it (docs/operations.md); a killed node refuses at once, so the
    # longer timeout costs the failover nothing
    "pgautofailover.health_check_timeout": "5000",
    "pgautofailover.health_check_max_retries": "2",
    "pgautofailover.health_check_retry_delay": "500",
    "pgautofailover.node_considered_unhealthy_timeout": "4000",
    # how long a promoted standby stays read-only in case the lost primary still takes writes:
    # the default 30 s is the split-brain guard of a real network; a killed host writes nothing
    "pgautofailover.primary_demote_timeout": "3000",
}


def available() -> str | None:
    """None if a cluster can be built here, else why not."""
    if shutil.which("pg_autoctl") is None:
        return "pg_autoctl is not installed (Debian: postgresql-15-auto-failover)"
    return servers_available()


def servers_available() -> str | None:
    """None if PostgreSQL 15 servers of our own can run here, else why not."""
    if not (BIN / "pg_basebackup").exists():
        return f"no PostgreSQL 15 in {BIN}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no postgres user to run the servers as"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    """One pg_autoctl-run PostgreSQL: its name, data folder, port and keeper process."""

    name: str
    pgdata: Path
    port: int
    keeper: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?connect_timeout=2"

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def writable(self) -> bool:
        """Whether this node takes writes, as ``target_session_attrs=read-write`` tells: not in
        recovery, and not read-only (a promoted standby is, until the old primary is demoted)."""
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                row = conn.execute("SHOW transaction_read_only").fetchone()
                return row is not None and row[0] == "off"
        except psycopg.Error:
            return False


@dataclass
class Cluster:
    """Monitor + primary + synchronous standby, built by :meth:`build`."""

    root: Path
    monitor: Node
    nodes: list[Node] = field(default_factory=list)
    log_files: list[Path] = field(default_factory=list)

    # --- building -----------------------------------------------------------------------------

    @classmethod
    def build(cls, standbys: int = 1, timeout: float = 120.0) -> Cluster:
        root = Path(tempfile.mkdtemp(prefix="queue_pg_ha_"))
        cluster = cls(root, Node("monitor", root / "monitor", free_port()))
        try:
            cluster._chown(root)
            cluster._start_monitor(timeout)
            for i in range(1 + standbys):
                cluster._start_node(f"node{i + 1}", timeout)
            cluster.wait_state(lambda states: sorted(states.values()) ==
                               ["primary", *["secondary"] * standbys], timeout)
        except BaseException:
            cluster.close()
            raise
        return cluster

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}",
            "PG_CONFIG": str(BIN / "pg_config"),
            "HOME": str(self.root),
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_DATA_HOME": str(self.root / "data"),
            "PGCONNECT_TIMEOUT": "2",
        })
        for name in ("PGHOST", "PGPORT", "PGDATA", "PGUSER", "PGDATABASE", "PGPASSWORD"):
            env.pop(name, None)
        return env

    def run(self, *args: str, timeout: float = 120.0) -> str:
        """One pg_autoctl command (as the postgres user); its output, or CalledProcessError."""
        done = subprocess.run(
            ["pg_autoctl", *args], env=self._env(), cwd=self.root, capture_output=True,
            text=True, timeout=timeout, check=False,
            user="postgres" if os.geteuid() == 0 else None,
        )
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout,
                                                done.stderr)
        return done.stdout

    def _spawn(self, node: Node, args: list[str]) -> None:
        log = self.root / f"{node.name}.log"
        self.log_files.append(log)
        with open(log, "ab") as out:
            node.keeper = subprocess.Popen(
                ["pg_autoctl", *args], env=self._env(), cwd=self.root, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                user="postgres" if os.geteuid() == 0 else None,
            )
        with contextlib.suppress(OSError):
            self._chown(log)

    @property
    def monitor_uri(self) -> str:
        return (f"postgresql://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover"
                "?sslmode=disable")

    def _start_monitor(self, timeout: float) -> None:
        self._spawn(self.monitor, [
            "create", "monitor", "--pgdata", str(self.monitor.pgdata),
            "--pgport", str(self.monitor.port), "--hostname", "127.0.0.1", "--auth", "trust",
            "--no-ssl", "--run",
        ])
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(
                    f"postgresql://postgres@127.0.0.1:{self.monitor.port}/pg_auto_failover"
                    "?connect_timeout=2", autocommit=True,
                ) as conn:
                    conn.execute("SELECT 1 FROM pgautofailover.formation LIMIT 1")
                    for name, value in MONITOR_SETTINGS.items():
                        conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                    conn.execute("SELECT pg_reload_conf()")
                    return
            except psycopg.Error:
                self._alive(self.monitor)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the monitor did not start: {self.tail()}") from None
                time.sleep(0.3)

    def _start_node(self, name: str, timeout: float) -> None:
        node = Node(name, self.root / name, free_port())
        self.nodes.append(node)
        self._spawn(node, [
            "create", "postgres", "--pgdata", str(node.pgdata), "--pgport", str(node.port),
            "--pghost", "127.0.0.1", "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
            "--name", name, "--monitor", self.monitor_uri, "--auth", "trust", "--no-ssl",
            "--username", "postgres", "--dbname", "postgres", "--run",
        ])
        # one node at a time: the first must be the primary before the next joins
        want = "single" if len(self.nodes) == 1 else "secondary"
        self.wait_state(lambda states: states.get(name) == want, timeout)

    def rejoin(self, node: Node) -> None:
        """Start a lost node's keeper again (``pg_autoctl run``): it rejoins as a standby."""
        self._spawn(node, ["run", "--pgdata", str(node.pgdata)])

    def _alive(self, node: Node) -> None:
        if node.keeper is not None and node.keeper.poll() is not None:
            raise RuntimeError(f"pg_autoctl of {node.name} exited with {node.keeper.returncode}:"
                               f" {self.tail()}")

    # --- looking ------------------------------------------------------------------------------

    def states(self) -> dict[str, str]:
        """Each data node's current state, as the monitor sees it ({} when it cannot tell)."""
        try:
            with psycopg.connect(
                f"postgresql://postgres@127.0.0.1:{self.monitor.port}/pg_auto_failover"
                "?connect_timeout=2", autocommit=True,
            ) as conn:
                rows = conn.execute(
                    "SELECT nodename, reportedstate::text, goalstate::text"
                    " FROM pgautofailover.node"
                ).fetchall()
        except psycopg.Error:
            return {}
        # a node is in a state when it reports the state it was asked to reach
        return {name: reported if reported == goal else f"{reported}->{goal}"
                for name, reported, goal in rows}

    def wait_state(self, ok: object, timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.states()
            if callable(ok) and ok(states):
                return states
            time.sleep(0.2)
        raise TimeoutError(f"cluster states {states}; {self.tail()}")

    def wait_steady(self, ok: Callable[[dict[str, str]], bool], hold: float,
                    timeout: float) -> dict[str, str]:
        """Wait until ``ok`` has held for ``hold`` seconds on end: a state just reached can be
        left again at the next report (a standby's streaming restarts as it turns secondary)."""
        deadline = time.monotonic() + timeout
        since: float | None = None
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.states()
            if not ok(states):
                since = None
            elif since is None:
                since = time.monotonic()
            elif time.monotonic() - since >= hold:
                return states
            time.sleep(0.2)
        raise TimeoutError(f"cluster states {states}, not steady for {hold:.0f} s; {self.tail()}")

    def primary(self) -> Node:
        states = self.states()
        for node in self.nodes:
            if states.get(node.name) in ("primary", "wait_primary", "single"):
                return node
        raise LookupError(f"no primary: {states}")

    def dsn(self, **params: str) -> str:
        """A multi-host DSN that connects to whichever data node is writable."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        query = "&".join(f"{k}={v}" for k, v in
                         {"target_session_attrs": "read-write", "connect_timeout": "2",
                          **params}.items())
        return f"postgresql://postgres@{hosts}/postgres?{query}"

    def tail(self, lines: int = 15) -> str:
        out = []
        for log in self.log_files:
            with contextlib.suppress(OSError):
                text = log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    def monitor_log_size(self) -> int:
        """Where the monitor's log ends now: :meth:`monitor_log_since` reads what comes after."""
        try:
            return (self.root / "monitor.log").stat().st_size
        except OSError:
            return 0

    def monitor_log_since(self, offset: int) -> str:
        with contextlib.suppress(OSError), open(self.root / "monitor.log", "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
        return ""

    def reporter_pids(self, node: Node) -> list[int]:
        """The node's ``pg_autoctl: node active`` process: the one that reports its state to the
        monitor and applies the goal state it gets back."""
        if node.keeper is None:
            return []
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                title = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
                if ppid == node.keeper.pid and b"node active" in title:
                    pids.append(int(proc.name))
        return pids

    @contextlib.contextmanager
    def reports_held(self, node: Node) -> Iterator[None]:
        """The node reports nothing to the monitor meanwhile (its reporter SIGSTOPped; its
        PostgreSQL runs on and answers the health checks)."""
        pids = self.reporter_pids(node)
        if not pids:
            raise RuntimeError(f"no pg_autoctl reporter found for {node.name}")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    # --- breaking -----------------------------------------------------------------------------

    def lose(self, node: Node) -> None:
        """The node's host is lost: SIGKILL its keeper (and its process group) and postmaster."""
        pid = node.postmaster_pid()
        if node.keeper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.keeper.pid, signal.SIGKILL)
            node.keeper.wait(30)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # the postmaster's children die with it or soon after (no postmaster: they exit)

    def close(self) -> None:
        """Kill every process this cluster started, then remove its folder."""
        for node in [*self.nodes, self.monitor]:
            with contextlib.suppress(Exception):
                self.lose(node)
        # any server process still around (a backend, a walsender) runs in its data folder
        for pid in _pids_in({str(n.pgdata) for n in [*self.nodes, self.monitor]}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def _pids_in(folders: set[str]) -> list[int]:
    """The processes whose working directory is one of ``folders`` (PostgreSQL's run in theirs)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(proc / "cwd") in folders:
                    pids.append(int(proc.name))
    return pids
