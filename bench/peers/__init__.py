"""The systems the throughput and latency scenarios drive: queue_pg itself and its peers.

Every system is a :class:`Driver` subclass in a module of its own, driven through that system's
own Python client. The scenario code knows only this interface:

- class side (the parent process, once per database): :meth:`Driver.install` the system into a
  scratch database, :meth:`Driver.fill` a queue fast (setup, not measured), :meth:`Driver.depth`,
  :meth:`Driver.purge`, and :meth:`Driver.tables` to VACUUM between cells;
- instance side (one per benchmark process): ``send(bodies)``, ``receive(n) -> handles``,
  ``delete(handles)``, ``cycle(handles, n)`` (delete the last batch, receive the next: the
  fastest way the client offers), ``receive_wait(n, wait)`` (long poll) and ``close()``.

A system that cannot do something says so in :meth:`Driver.unsupported`, which the tables print
as "n/a (why)" instead of dropping the row.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
from collections.abc import Coroutine, Sequence
from typing import Any, ClassVar, TypeVar

import psycopg

__all__ = [
    "DEFAULT_SYSTEMS",
    "PAYLOAD_BYTES",
    "QUEUE",
    "SYSTEMS",
    "AsyncLoop",
    "Driver",
    "bodies",
    "body",
    "get",
    "installed_systems",
]

#: The queue (or entrypoint / task) every system uses in its own scratch database.
QUEUE = "bench"
#: Padding of every body: ``{"n": i, "payload": "xxx…"}``, the same for every system.
PAYLOAD_BYTES = 64

T = TypeVar("T")


def body(n: int, **extra: Any) -> dict[str, Any]:
    """The small JSON body every system sends."""
    return {"n": n, "payload": "x" * PAYLOAD_BYTES, **extra}


def bodies(start: int, count: int) -> list[dict[str, Any]]:
    return [body(start + i) for i in range(count)]


class Driver:
    """One system under test; see the module docstring."""

    name: ClassVar[str]  #: key on the command line and in the results
    label: ClassVar[str]  #: as the tables print it
    distribution: ClassVar[str | None] = None  #: PyPI name, for the version (None: queue_pg)

    # --- class side: setup in the parent process ---------------------------------------------

    @classmethod
    def available(cls) -> bool:
        return True

    @classmethod
    def version(cls) -> str | None:
        if cls.distribution is None:
            return None
        try:
            return importlib.metadata.version(cls.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    @classmethod
    def install(cls, dsn: str) -> dict[str, Any]:
        """Install the system's schema and create the queue in the (empty) database of dsn."""
        raise NotImplementedError

    @classmethod
    def fill(cls, dsn: str, count: int, start: int = 0) -> None:
        """Add ``count`` messages to the queue as fast as possible (setup, not measured)."""
        raise NotImplementedError

    @classmethod
    def depth(cls, conn: psycopg.Connection[Any]) -> int:
        """Messages waiting in the queue (visible or not)."""
        raise NotImplementedError

    @classmethod
    def purge(cls, conn: psycopg.Connection[Any]) -> None:
        """Remove every message (between cells)."""
        raise NotImplementedError

    @classmethod
    def tables(cls) -> list[str]:
        """Tables to ``VACUUM ANALYZE`` between cells (the shared server may run without
        autovacuum, and every system deserves the same clean start)."""
        raise NotImplementedError

    @classmethod
    def unsupported(cls, op: str, batch: int) -> str | None:
        """Why the system cannot do ``op`` ("send", "cycle", "latency") with ``batch``
        messages a call, or None when it can."""
        return None

    # --- instance side: one per benchmark process ---------------------------------------------

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def send(self, bodies: Sequence[dict[str, Any]]) -> None:
        raise NotImplementedError

    def receive(self, n: int) -> list[Any]:
        raise NotImplementedError

    def delete(self, handles: Sequence[Any]) -> None:
        raise NotImplementedError

    def cycle(self, handles: Sequence[Any], n: int) -> list[Any]:
        """Settle ``handles`` (the last receive's) and receive up to ``n`` more."""
        if handles:
            self.delete(handles)
        return self.receive(n)

    def receive_wait(self, n: int, wait: float) -> list[tuple[Any, dict[str, Any]]]:
        """Long poll: up to ``n`` messages as (handle, body), waiting up to ``wait`` seconds."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class AsyncLoop:
    """For systems whose client is asyncio-only: one event loop per process, each call run to
    completion on it (the overhead, tens of microseconds, is small next to a round trip)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.close()


#: module name -> class name, in the order the tables list them.
_MODULES = {
    "queue_pg": ("bench.peers.queue_pg_driver", "QueuePg"),
    "pgmq": ("bench.peers.pgmq_driver", "Pgmq"),
    "pgqueuer": ("bench.peers.pgqueuer_driver", "PgQueuer"),
    "procrastinate": ("bench.peers.procrastinate_driver", "Procrastinate"),
    # variants, run only when named (--systems): the plain idiom, and the relaxed-durability
    # pair (queue_pg's relaxed leases beside PGMQ at synchronous_commit = off)
    "queue_pg_plain": ("bench.peers.queue_pg_driver", "QueuePgPlain"),
    "queue_pg_relaxed": ("bench.peers.queue_pg_driver", "QueuePgRelaxed"),
    "pgmq_nosync": ("bench.peers.pgmq_driver", "PgmqNoSync"),
    # the yardstick (bench/peers/floor_driver.py): the least this design does per message
    "floor": ("bench.peers.floor_driver", "Floor"),
    "floor_plain": ("bench.peers.floor_driver", "FloorPlain"),
}
#: every system a scenario can name, in the order the tables list them
SYSTEMS: tuple[str, ...] = tuple(_MODULES)
#: the systems run when none are named
DEFAULT_SYSTEMS: tuple[str, ...] = ("queue_pg", "pgmq", "pgqueuer", "procrastinate")


def get(name: str) -> type[Driver]:
    module, cls = _MODULES[name]
    driver: type[Driver] = getattr(importlib.import_module(module), cls)
    return driver


def installed_systems(wanted: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The systems of ``wanted`` whose client is installed, and why the others are skipped."""
    ok: list[str] = []
    missing: dict[str, str] = {}
    for name in wanted:
        try:
            driver = get(name)
        except ImportError as exc:
            missing[name] = f"not installed ({exc.name or exc}): pip install -e '.[bench]'"
            continue
        try:
            usable = driver.available()
        except ImportError as exc:  # drivers import their client lazily
            missing[name] = f"not installed ({exc.name or exc}): pip install -e '.[bench]'"
            continue
        if usable:
            ok.append(name)
        else:
            missing[name] = "not available"
    return ok, missing
