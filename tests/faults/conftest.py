"""Fixtures of the fault suites: a server of the test's own (never the shared one)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from queue_pg.embedded import EmbeddedServer


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """An embedded server in a temporary folder, stopped and deleted afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="queue_pg_fault_"))
    server = EmbeddedServer(folder / "pgdata")
    try:
        yield server
    finally:
        try:
            server.close()
        except psutil.Error:  # a killed postmaster's handle: stop the one started since
            if server.running:
                server.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)
