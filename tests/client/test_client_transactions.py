"""The client tests, transactional enqueue: conn= runs inside the caller's transaction: run against both clients (see conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool
from sqlalchemy import create_engine, text

from client.helpers import db_messages, sqlalchemy_url
from queue_pg import (
    Client,
)


def test_send_in_a_transaction_exists_if_and_only_if_it_commits(
    client: Client, conn: psycopg.Connection, connect: Callable[[], Any]
) -> None:
    client.create_queue("jobs")
    with connect() as tx:  # not autocommit: the caller's transaction
        tx.execute("CREATE TEMP TABLE orders (id int)")
        tx.commit()
        tx.execute("INSERT INTO orders VALUES (1)")
        mid = client.send("jobs", {"order": 1}, conn=tx)
        ids = client.send_batch("jobs", [{"order": 2}, {"order": 3}], conn=tx)
        assert client.peek("jobs", 10, conn=tx)[0].id == mid  # the transaction sees its own
        assert client.peek("jobs", 10) == []  # nobody else does
        tx.rollback()
        assert db_messages(conn) == 0
        assert tx.execute("SELECT count(*) FROM orders").fetchone() == (0,)

        tx.execute("INSERT INTO orders VALUES (2)")
        kept = client.send("jobs", {"order": 2}, conn=tx)
        assert client.receive("jobs") == []  # not committed yet
        tx.commit()
    assert kept not in ids
    [m] = client.receive("jobs")
    assert (m.id, m.body) == (kept, {"order": 2})


def test_receive_and_delete_in_a_rolled_back_transaction_are_undone(
    client: Client, connect: Callable[[], Any]
) -> None:
    client.create_queue("jobs")
    mid = client.send("jobs", "x")
    with connect() as tx:
        [m] = client.receive("jobs", conn=tx)
        assert m.receipt is not None
        assert client.delete("jobs", m.receipt, conn=tx) is True
        tx.rollback()
        [again] = client.peek("jobs")  # the lease and the delete never happened
        assert (again.id, again.receive_count) == (mid, 0)
        [m] = client.receive("jobs", conn=tx)
        client.change_visibility("jobs", m.receipt or "", 300, conn=tx)
        tx.commit()
    assert client.peek("jobs") == []
    assert client.stats("jobs").in_flight == 1


def test_client_on_a_connection_pool_borrows_it_and_joins_its_transactions(
    clean: str, plain: psycopg.Connection
) -> None:
    conn = plain
    with ConnectionPool(clean, min_size=1, max_size=2, open=True) as pool:
        client = Client(pool, sweep_interval=None)
        client.create_queue("jobs")  # the client commits what it runs on its own
        assert [q.name for q in client.list_queues(conn=conn)] == ["jobs"]
        with pytest.raises(RuntimeError, match="abort"), pool.connection() as c:
            client.send("jobs", "lost", conn=c)
            raise RuntimeError("abort")  # the pool rolls the caller's transaction back
        with pool.connection() as c:
            client.send("jobs", "kept", conn=c)
            assert client.peek("jobs", conn=conn) == []
        # committed when the block left
        assert [m.body for m in client.receive("jobs", 10)] == ["kept"]
        client.close()  # a borrowed pool stays open
        assert not pool.closed
        with pool.connection() as c:
            assert c.execute("SELECT 1").fetchone() == (1,)


def test_client_on_a_sqlalchemy_engine_joins_the_callers_transaction(
    clean: str, plain: psycopg.Connection
) -> None:
    conn = plain
    engine = create_engine(sqlalchemy_url(clean))
    try:
        client = Client(engine, sweep_interval=None)
        client.create_queue("jobs")
        assert [q.name for q in client.list_queues(conn=conn)] == ["jobs"]
        with pytest.raises(RuntimeError, match="abort"), engine.begin() as sa:
            sa.execute(text("CREATE TEMP TABLE t (x int)"))
            client.send("jobs", "lost", conn=sa.connection.driver_connection)
            raise RuntimeError("abort")
        assert db_messages(conn) == 0
        with engine.begin() as sa:
            client.send("jobs", "kept", conn=sa.connection.driver_connection)
            assert client.peek("jobs", conn=conn) == []
        [m] = client.receive("jobs")
        assert m.body == "kept"
        assert client.delete("jobs", m.receipt or "") is True
        assert db_messages(conn) == 0  # committed by the client
    finally:
        engine.dispose()


def test_client_rejects_other_sources() -> None:
    with pytest.raises(TypeError, match="DSN"):
        Client(42)  # type: ignore[arg-type]
