"""A primary and a streaming hot standby of its own (PostgreSQL 15 binaries, loopback ports, a
temporary folder; the servers run as the ``postgres`` user when the tests run as root)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.autofailover import BIN, free_port
from bench.autofailover import servers_available as available

__all__ = ["Pair", "available", "streaming_pair"]


def _run(*args: str, timeout: float = 120) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=timeout,
                   user="postgres" if os.geteuid() == 0 else None,
                   env={**os.environ, "PGCONNECT_TIMEOUT": "5"})


@dataclass
class Pair:
    primary_port: int
    standby_port: int

    @property
    def primary(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.primary_port}/postgres"

    @property
    def standby(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby_port}/postgres"

    def wait_replayed(self, timeout: float = 60) -> None:
        """Until the standby has replayed everything the primary wrote so far."""
        with psycopg.connect(self.primary, autocommit=True) as p:
            row = p.execute("SELECT pg_current_wal_lsn()").fetchone()
            assert row is not None
            lsn = row[0]
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.standby, autocommit=True) as s:
            while time.monotonic() < deadline:
                row = s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)
                                ).fetchone()
                if row is not None and row[0]:
                    return
                time.sleep(0.05)
        raise TimeoutError("the standby did not catch up")


@contextlib.contextmanager
def streaming_pair() -> Iterator[Pair]:
    """A primary (initdb) and a hot standby (pg_basebackup -R) streaming from it."""
    root = Path(tempfile.mkdtemp(prefix="queue_pg_standby_"))
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    pair = Pair(free_port(), free_port())
    started: list[Path] = []
    try:
        primary, standby = root / "primary", root / "standby"
        _run(str(BIN / "initdb"), "-D", str(primary), "-U", "postgres", "--auth=trust", "-E",
             "UTF8", "--locale=C.UTF-8")
        opts = "-c listen_addresses=127.0.0.1 -c unix_socket_directories= -c fsync=off"
        _run(str(BIN / "pg_ctl"), "-D", str(primary), "-w", "-l", str(root / "primary.log"),
             "-o", f"-p {pair.primary_port} {opts}", "start")
        started.append(primary)
        _run(str(BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(pair.primary_port),
             "-U", "postgres", "-D", str(standby), "-R", "-X", "stream")
        _run(str(BIN / "pg_ctl"), "-D", str(standby), "-w", "-l", str(root / "standby.log"),
             "-o", f"-p {pair.standby_port} {opts} -c hot_standby=on", "start")
        started.append(standby)
        yield pair
    finally:
        for data in reversed(started):
            with contextlib.suppress(Exception):
                _run(str(BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop",
                     timeout=60)
            with contextlib.suppress(OSError, ValueError, IndexError, ProcessLookupError):
                pid = int((data / "postmaster.pid").read_text().split()[0])
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
