"""Benchmarks of queue_pg, run as ``python -m bench <scenario> --dsn DSN``.

Layout (each scenario is one module; the rest is shared so new scenarios only add a module):

- :mod:`bench.__main__` — the command line: common options, one sub-command per scenario.
- :mod:`bench.db` — scratch database on the server under test, install, fast fill, EXPLAIN.
- :mod:`bench.report` — machine description, latency summaries, JSON and Markdown output.
- :mod:`bench.peers` — the systems under test behind one small interface: queue_pg and its peers
  PGMQ, PgQueuer and Procrastinate, each through its own Python client.
- :mod:`bench.runner` — a throughput cell: N processes of one system for T seconds.
- :mod:`bench.ceiling` — the same cells as pgbench scripts of the client's own statements.
- :mod:`bench.throughput` — the grid of cells shared by ``send`` and ``cycle``.
- :mod:`bench.chart` — a PNG per scenario (matplotlib).
- Scenarios: :mod:`bench.send`, :mod:`bench.cycle`, :mod:`bench.latency`, :mod:`bench.worker`,
  :mod:`bench.leased_head` (receive with many leased messages at the head of a queue),
  :mod:`bench.client_cpu` (the consumer's CPU per receive beside bare psycopg), the optional
  ``bench.soak``, :mod:`bench.failover` (a pg_auto_failover cluster of its own,
  :mod:`bench.autofailover`, loses its primary under traffic; no ``--dsn``), and
  :mod:`bench.run_all` (``all``: every one but failover, then ``summary.md``).

A scenario is a :class:`Scenario`: a name, a one-line help, a function adding its own options to
its sub-command's parser, and a function running it from the parsed options (returning the exit
status). Every scenario works in a scratch database that it creates and drops, never in the
database the DSN names, and writes ``<out>/<result name>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Scenario"]


@dataclass(frozen=True)
class Scenario:
    """One benchmark scenario, as the command line sees it."""

    name: str  #: sub-command, e.g. ``leased-head``
    help: str  #: one line for ``--help``
    add_arguments: Callable[[argparse.ArgumentParser], None]  #: its own options
    run: Callable[[argparse.Namespace], int]  #: runs it; returns the exit status
    needs_dsn: bool = True  #: False: it starts servers of its own (``--dsn`` is optional)
