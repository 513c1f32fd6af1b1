"""Tests of the pure-Python parts: they run with no database server at all.

Every test here sees a DSN that refuses connections, so one that reaches for a server by mistake
fails at once instead of finding the developer's.
"""

from __future__ import annotations

import pytest

NO_SERVER = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"


@pytest.fixture(autouse=True)
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("QUEUE_PG_DSN", "QUEUE_PG_TEST_DSN", "DATABASE_URL"):
        monkeypatch.setenv(name, NO_SERVER)
