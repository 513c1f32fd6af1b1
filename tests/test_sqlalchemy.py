"""``session=``: enqueue inside a SQLAlchemy ORM session's (or Core connection's) transaction.

The message must exist if and only if the session commits, and be written on the session's own
connection (visible to the session before commit, to nobody else).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, String, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import queue_pg
from queue_pg.install import make_engine
from queue_pg.jobs.tasks import Registry, Task

Q = "sqla"


class Base(DeclarativeBase):
    pass


class Account(Base):
    __tablename__ = "sqla_accounts"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(100))


@pytest.fixture
def engine(clean: str) -> Iterator[Engine]:
    engine = make_engine(clean)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    try:
        yield engine
    finally:
        Base.metadata.drop_all(engine)
        engine.dispose()


@pytest.fixture
def welcome() -> Task:
    def welcome(account_id: int) -> None:
        pass

    return Task(welcome, queue=Q, name="welcome", registry=Registry())


def count(conn: psycopg.Connection, queue: str = Q) -> int:
    row = conn.execute(
        "SELECT count(*) FROM queue_pg.messages m JOIN queue_pg.queues q ON q.id = m.queue_id"
        " WHERE q.name = %s", [queue]
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_session_commit_keeps_row_and_message(
    engine: Engine, client: queue_pg.Client, conn: psycopg.Connection, welcome: Task
) -> None:
    client.create_queue(Q)
    with Session(engine) as session:
        account = Account(email="ann@example.com")
        session.add(account)
        session.flush()
        account_id = account.id
        msg_id = welcome.enqueue(account_id, session=session)
        batch = client.send_batch(Q, [{"n": 1}, {"n": 2}], session=session)
        # the session sees its own uncommitted message: it was written on its connection
        seen = session.execute(
            text("SELECT count(*) FROM queue_pg.messages WHERE id = ANY(:ids)"),
            {"ids": [msg_id, *batch]},
        ).scalar_one()
        assert seen == 3
        assert count(conn) == 0  # nobody else does before the commit
        session.commit()
    assert count(conn) == 3
    msg = client.peek(Q, 10)[0]
    assert msg.id == msg_id
    assert msg.body == {"task": "welcome", "args": [account_id], "kwargs": {}}
    assert msg.attributes == {"type": "welcome"}


def test_session_rollback_leaves_neither(
    engine: Engine, client: queue_pg.Client, conn: psycopg.Connection, welcome: Task
) -> None:
    client.create_queue(Q)
    with Session(engine) as session:
        session.add(Account(email="bob@example.com"))
        session.flush()
        welcome.enqueue(1, session=session)
        client.send(Q, {"n": 1}, session=session)
        session.rollback()
    with Session(engine) as session:  # closed without commit: rolled back too
        welcome.enqueue(2, session=session)
    assert count(conn) == 0
    with Session(engine) as session:
        assert session.scalars(select(Account)).all() == []


def test_enqueue_first_then_orm_writes_share_the_transaction(
    engine: Engine, client: queue_pg.Client, conn: psycopg.Connection, welcome: Task
) -> None:
    """The enqueue may be the session's first statement: it begins the session's transaction,
    which the ORM's later writes and the commit then belong to."""
    client.create_queue(Q)
    with Session(engine) as session:
        welcome.enqueue(7, session=session)
        session.add(Account(email="cy@example.com"))
        session.commit()
    assert count(conn) == 1
    with Session(engine) as session:
        welcome.enqueue(8, session=session)
        session.add(Account(email="cy@example.com"))
        session.flush()
        session.rollback()
        assert session.scalars(select(Account.email)).all() == ["cy@example.com"]
    assert count(conn) == 1


def test_core_connection(
    engine: Engine, client: queue_pg.Client, conn: psycopg.Connection, welcome: Task
) -> None:
    client.create_queue(Q)
    with engine.connect() as c:  # no transaction begun yet: send begins it
        client.send(Q, {"n": 1}, session=c)
        c.commit()
    with engine.connect() as c:
        welcome.enqueue(2, session=c)
        # closed without commit
    with engine.begin() as c:
        welcome.enqueue(3, session=c)
    assert [m.body for m in client.peek(Q, 10)] == [
        {"n": 1}, {"task": "welcome", "args": [3], "kwargs": {}},
    ]


def test_errors_are_translated_and_change_nothing(
    engine: Engine, client: queue_pg.Client, conn: psycopg.Connection, welcome: Task
) -> None:
    with Session(engine) as session:
        session.add(Account(email="dan@example.com"))
        session.flush()
        with pytest.raises(queue_pg.QueueNotFound):
            welcome.enqueue(1, session=session)
        session.rollback()
    with Session(engine) as session:
        assert session.scalars(select(Account)).all() == []
    client.create_queue(Q)
    with Session(engine) as session, pytest.raises(TypeError, match="conn= or session="):
        client.send(Q, {}, session=session, conn=conn)
    with pytest.raises(TypeError, match="Session or Connection"):
        client.send(Q, {}, session=engine)  # type: ignore[arg-type]
    assert count(conn) == 0


async def test_async_send_joins_an_async_session_and_commits_or_rolls_back_with_it(
    clean: str, conn: psycopg.Connection
) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def connect() -> psycopg.AsyncConnection:
        return await psycopg.AsyncConnection.connect(clean)

    engine = create_async_engine("postgresql+psycopg://", async_creator=connect)
    try:
        async with queue_pg.AsyncClient(clean, sweep_interval=None) as client:
            await client.create_queue(Q)
            async with AsyncSession(engine) as session:
                await client.send(Q, {"n": 1}, session=session)
                # on the session's connection: it sees the message, nobody else does yet
                seen = (await session.execute(text("SELECT count(*) FROM queue_pg.messages")))
                assert seen.scalar_one() == 1
                assert count(conn) == 0
                await session.rollback()
            assert count(conn) == 0
            async with AsyncSession(engine) as session, session.begin():
                await client.send_batch(Q, [2, 3], session=session)
            assert count(conn) == 2
            async with engine.connect() as core:
                await client.send(Q, 4, session=core)
                await core.commit()
            assert count(conn) == 3
            with pytest.raises(TypeError, match="not both"):
                async with engine.connect() as core:
                    raw = await core.get_raw_connection()
                    await client.send(Q, 5, session=core, conn=raw.driver_connection)
    finally:
        await engine.dispose()
