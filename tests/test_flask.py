"""The Flask integration, through the example app in examples/flask_app.

A fresh database; ``flask queue-pg migrate`` (through Flask's CLI runner) installs queue_pg and
the configured queues, ``db.create_all()`` the app's table. Requests go through the app's test
client; the worker is a real ``flask --app app queue-pg worker`` process.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import psycopg
import pytest
from flask import Flask

import queue_pg
from queue_pg.contrib.flask import QueuePG
from queue_pg.install import current_revision, head_revision
from queue_pg.jobs.tasks import registry
from tests.conftest import new_database

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "flask_app"
T = TypeVar("T")


def wait_until(what: str, check: Callable[[], T], timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def example(server_dsn: str) -> Iterator[tuple[ModuleType, Flask, str]]:
    """The example module, an app of it on a fresh migrated database, and that DSN."""
    saved = os.environ.get("QUEUE_PG_DSN")
    with new_database(server_dsn, "queue_pg_flask") as db:
        os.environ["QUEUE_PG_DSN"] = db  # the example's database
        sys.path.insert(0, str(EXAMPLE))
        try:
            module = importlib.import_module("app")
            app = module.create_app({"SQLALCHEMY_DATABASE_URI": module.sqlalchemy_url(db)})
            result = app.test_cli_runner().invoke(args=["queue-pg", "migrate"])
            assert result.exit_code == 0, result.output
            assert "queue_pg at" in result.output
            with app.app_context():
                module.db.create_all()
            yield module, app, db
            with app.app_context():
                module.db.engine.dispose()
            state = app.extensions["queue_pg"]
            if state.client is not None:  # made by qp.send
                state.client.close()
        finally:
            registry.set_job_context("flask", None)
            registry.tasks.pop("send_welcome", None)
            sys.modules.pop("app", None)
            sys.path.remove(str(EXAMPLE))
            if saved is None:
                os.environ.pop("QUEUE_PG_DSN", None)
            else:
                os.environ["QUEUE_PG_DSN"] = saved


@pytest.fixture
def app(example: tuple[ModuleType, Flask, str]) -> Flask:
    _, app, db = example
    with queue_pg.Client(db, sweep_interval=None) as c:
        c.purge("welcome")
        c.purge("welcome-dlq")
    return app


def query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(sql, params or None).fetchall()


def messages(dsn: str, queue: str = "welcome") -> list[tuple[Any, ...]]:
    return query(
        dsn, "SELECT m.id, m.body FROM queue_pg.messages m JOIN queue_pg.queues q"
        " ON q.id = m.queue_id WHERE q.name = %s ORDER BY m.id", queue,
    )


def test_migrate_command_installs_schema_and_queues(
    example: tuple[ModuleType, Flask, str],
) -> None:
    _, app, db = example
    assert current_revision(db) == head_revision()
    rows = query(db, "SELECT name, dead_letter_queue FROM queue_pg.queues ORDER BY name")
    assert rows == [("welcome", "welcome-dlq"), ("welcome-dlq", None)]
    # again: nothing to do, the queues stay as they are
    result = app.test_cli_runner().invoke(args=["queue-pg", "migrate"])
    assert result.exit_code == 0 and f"at {head_revision()} (was {head_revision()})" in (
        result.output
    )


def test_request_commits_signup_and_job_together(
    example: tuple[ModuleType, Flask, str], app: Flask
) -> None:
    db = example[2]
    response = app.test_client().post("/signup", data={"email": "ann@example.com"})
    assert response.status_code == 201, response.data
    data = response.get_json()
    assert messages(db) == [
        (data["message_id"], {"task": "send_welcome", "args": [data["id"]], "kwargs": {}})
    ]
    assert query(db, "SELECT email FROM signup WHERE id = %s", data["id"]) == [
        ("ann@example.com",)
    ]


def test_failed_request_leaves_neither_signup_nor_job(
    example: tuple[ModuleType, Flask, str], app: Flask
) -> None:
    db = example[2]
    response = app.test_client().post(
        "/signup", data={"email": "bob@example.com", "referred_by": "nobody@example.com"}
    )
    assert response.status_code == 400
    assert messages(db) == []
    assert query(db, "SELECT id FROM signup WHERE email = 'bob@example.com'") == []


def test_enqueue_is_in_the_session_until_commit(
    example: tuple[ModuleType, Flask, str], app: Flask
) -> None:
    module, _, db = example
    qp: QueuePG = module.qp
    with app.app_context():
        msg_id = qp.enqueue(module.send_welcome, 1)
        sent = qp.send("welcome", {"n": 2}, attributes={"type": "plain"})
        assert messages(db) == []  # not committed yet: nobody else sees them
        module.db.session.commit()
    assert [m[0] for m in messages(db)] == [msg_id, sent]
    with app.app_context():
        qp.enqueue(module.send_welcome, 3)
        module.db.session.rollback()
    with app.app_context():
        qp.enqueue(module.send_welcome, 4)
        # app context ends without a commit: Flask-SQLAlchemy removes the session
    assert [m[0] for m in messages(db)] == [msg_id, sent]


def test_dsn_from_config(example: tuple[ModuleType, Flask, str]) -> None:
    _, app, db = example
    assert psycopg.conninfo.conninfo_to_dict(QueuePG.dsn(app))["dbname"] == (
        psycopg.conninfo.conninfo_to_dict(db)["dbname"]
    )
    other = Flask("other")
    other.config.update(QUEUE_PG_DSN="postgresql://q@h/queues",
                        SQLALCHEMY_DATABASE_URI="postgresql+psycopg://a@b/app")
    assert QueuePG.dsn(other) == "postgresql://q@h/queues"
    other.config.update(QUEUE_PG_DSN=None)
    assert QueuePG.dsn(other) == "postgresql://a@b/app"


@pytest.mark.slow
def test_worker_command_runs_the_jobs(
    example: tuple[ModuleType, Flask, str], app: Flask, tmp_path: Path
) -> None:
    db = example[2]
    web = app.test_client()
    ids = []
    for n in range(4):
        response = web.post("/signup", data={"email": f"w{n}@example.com"})
        assert response.status_code == 201
        ids.append(response.get_json()["id"])

    env = {**os.environ, "QUEUE_PG_DSN": db,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path / "worker.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flask", "--app", "app", "queue-pg", "worker", "--processes", "2",
         "--concurrency", "2", "--wait", "1", "--grace-period", "5"],
        cwd=EXAMPLE, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # both processes ready before the stop: a worker process still starting up dies of
        # SIGTERM (its handler is not installed yet) and the supervisor then exits 1
        wait_until("two ready workers", lambda: log.read_text().count("ready: welcome") == 2)
        wait_until("every signup welcomed", lambda: query(
            db, "SELECT count(*) FROM signup WHERE id = ANY(%s) AND welcomed_at IS NOT NULL",
            ids)[0][0] == len(ids))
        wait_until("the queue empty", lambda: messages(db) == [])
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_bytes()
    assert proc.returncode == 0, out.decode()
    assert b"worker processes exited with [0, 0]" in out
    assert b"succeeded=" in out and b"rejected=0" in out


def test_async_tasks_run_in_the_app_context(app: Flask, example: tuple[ModuleType, Flask, str]
                                            ) -> None:
    """An ``async def`` task run by the AsyncWorker sees the app, as a plain one does."""
    import asyncio

    db = example[2]
    seen: list[str] = []

    async def probe() -> None:
        from flask import current_app

        seen.append(current_app.name)

    task = queue_pg.task(queue="welcome", name="probe_async")(probe)

    async def main() -> None:
        async with queue_pg.AsyncClient(db, sweep_interval=None) as ac:
            await ac.send("welcome", task.envelope([], {}), attributes={"type": task.name})
            worker = queue_pg.AsyncWorker(ac, "welcome", registry, wait=1)
            run = asyncio.create_task(worker.run(signals=()))
            for _ in range(200):
                if seen:
                    break
                await asyncio.sleep(0.05)
            worker.stop()
            await run

    try:
        asyncio.run(main())
    finally:
        registry.tasks.pop("probe_async", None)
    assert seen == [app.name]


def test_task_enqueue_uses_the_apps_database_and_the_requests_transaction(
    example: tuple[ModuleType, Flask, str], app: Flask, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``task.enqueue()`` / ``delay()`` in an app with the extension: never $QUEUE_PG_DSN; in a
    request, db.session's transaction (a request that never commits says so); outside one, a
    commit of its own."""
    from flask_sqlalchemy import SQLAlchemy

    module, _, db = example
    monkeypatch.setenv("QUEUE_PG_DSN", "host=/nonexistent dbname=nowhere")  # not the app's
    fresh = Flask("fresh")
    fresh.config["SQLALCHEMY_DATABASE_URI"] = module.sqlalchemy_url(db)
    sqla = SQLAlchemy()
    sqla.init_app(fresh)
    QueuePG(fresh)
    send_welcome = module.send_welcome

    @fresh.post("/commit")
    def commit() -> str:
        send_welcome.enqueue(1)
        sqla.session.commit()
        return "ok"

    @fresh.post("/forget")
    def forget() -> str:
        send_welcome.delay(2)  # no commit: rolled back with the session
        return "ok"

    @fresh.post("/rollback")
    def rollback() -> str:
        send_welcome.apply_async((3,))
        sqla.session.rollback()  # on purpose: nothing to say
        return "ok"

    caplog.set_level(logging.WARNING, "queue_pg.flask")
    try:
        web = fresh.test_client()
        for path in ("/commit", "/forget", "/rollback"):
            assert web.post(path).status_code == 200
        with fresh.app_context():
            send_welcome.enqueue(4)  # no request: commits by itself
        assert [body["args"] for _, body in messages(db)] == [[1], [4]]
        (warning,) = [r for r in caplog.records if "were not committed" in r.getMessage()]
        assert "request POST /forget" in warning.getMessage()
    finally:
        registry.set_job_context("flask", app.app_context)
        with fresh.app_context():
            sqla.engine.dispose()
        state = fresh.extensions["queue_pg"]
        if state.client is not None:
            state.client.close()
