"""The client tests run against both clients: ``client`` is a Client, or an AsyncClient driven
through :mod:`blocking`; ``conn`` is a connection of the same kind, so ``conn=`` works for both.

Time passes without sleeping through the session setting ``queue_pg.time_offset`` of a connection
handed to a method as ``conn=`` (see ``advance``); long polling uses real, sub-second waits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import queue_pg
from client.blocking import BlockingClient, BlockingConnection, Loop
from client.helpers import Snapshot


@pytest.fixture(scope="module")
def loop() -> Iterator[Loop]:
    loop = Loop()
    yield loop
    loop.close()


@pytest.fixture(params=["sync", "async"])
def client(request: pytest.FixtureRequest, clean: str, loop: Loop) -> Iterator[Any]:
    """A Client, or an AsyncClient behind the same blocking calls."""
    if request.param == "sync":
        with queue_pg.Client(clean, sweep_interval=None) as c:
            yield c
        return
    aclient = loop.run(queue_pg.AsyncClient.open(clean, sweep_interval=None))
    yield BlockingClient(loop, aclient)
    loop.run(aclient.close())


@pytest.fixture
def conn(clean: str, client: Any, loop: Loop) -> Iterator[Any]:
    """A plain autocommit connection of the client's kind (sync or async)."""
    if not isinstance(client, BlockingClient):
        with psycopg.connect(clean, autocommit=True) as c:
            yield c
        return
    aconn = loop.run(psycopg.AsyncConnection.connect(clean, autocommit=True))
    yield BlockingConnection(loop, aconn)
    loop.run(aconn.close())


@pytest.fixture
def connect(clean: str, client: Any, loop: Loop) -> Callable[[], Any]:
    """Opens a connection of the client's kind that is not autocommit: the caller's
    transaction (``with connect() as tx``: committed at the end, rolled back on error)."""
    if not isinstance(client, BlockingClient):
        return lambda: psycopg.connect(clean)
    return lambda: BlockingConnection(loop, loop.run(psycopg.AsyncConnection.connect(clean)))


@pytest.fixture
def plain(clean: str) -> Iterator[psycopg.Connection]:
    """A sync autocommit connection, whichever the client."""
    with psycopg.connect(clean, autocommit=True) as c:
        yield c


@pytest.fixture
def snapshot(conn: Any) -> Snapshot:
    """Every row of every queue_pg table, to show that a refused call changed nothing."""

    def take() -> dict[str, list[Any]]:
        return {
            table: [
                r[0] for r in conn.execute(f"SELECT t::text FROM queue_pg.{table} t ORDER BY 1")
            ]
            for table in ("queues", "messages", "in_flight", "message_history")
        }

    return take
