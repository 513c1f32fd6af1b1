"""Fixtures of the fault suites."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_pg.embedded import EmbeddedServer


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """An embedded server of the test's own, in a temporary folder: stopped, killed, restarted
    at will (never the shared server)."""
    folder = Path(tempfile.mkdtemp(prefix="queue_pg_fault_"))
    server = EmbeddedServer(folder / "pgdata")
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(folder, ignore_errors=True)
