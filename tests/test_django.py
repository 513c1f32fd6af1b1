"""The Django integration, through the example project in examples/django_app.

A database of its own on the test server, where ``queue-pg migrate`` installed queue_pg first
(Django's migration must then find nothing to do); Django's ``migrate`` creates the rest and the
configured queues. Requests go through Django's test client; the worker is a real
``manage.py queue_pg_worker`` process with two worker processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

import queue_pg
from queue_pg.install import current_revision, head_revision, migrate
from queue_pg.jobs.tasks import registry
from tests.conftest import new_database

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "django_app"
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
def project(server_dsn: str) -> Iterator[str]:
    """Django set up on the example project and a fresh database; yields its DSN."""
    import django
    from django.core.management import call_command
    from django.db import connections

    saved = {k: os.environ.get(k) for k in ("QUEUE_PG_DSN", "DJANGO_SETTINGS_MODULE")}
    with new_database(server_dsn, "queue_pg_django") as db:
        migrate(db)  # installed by queue-pg first: Django's migration finds it at head
        os.environ["QUEUE_PG_DSN"] = db
        os.environ["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
        sys.path.insert(0, str(EXAMPLE))
        try:
            django.setup()
            call_command("migrate", verbosity=0)
            yield db
        finally:
            connections.close_all()
            # Django's hooks live on the default registry: leave it as other tests expect it
            registry.connection = None
            registry.set_job_context("django", None)
            registry.tasks.pop("signups.tasks.send_welcome", None)
            sys.path.remove(str(EXAMPLE))
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture
def client(project: str) -> Iterator[queue_pg.Client]:
    with queue_pg.Client(project, sweep_interval=None) as c:
        c.purge("welcome")
        c.purge("welcome-dlq")
        yield c


def query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """On a connection of its own: what other sessions see."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(sql, params or None).fetchall()


def messages(dsn: str, queue: str = "welcome") -> list[tuple[Any, ...]]:
    return query(
        dsn, "SELECT m.id, m.body FROM queue_pg.messages m JOIN queue_pg.queues q"
        " ON q.id = m.queue_id WHERE q.name = %s ORDER BY m.id", queue,
    )


def test_migrate_installs_schema_and_queues(project: str) -> None:
    assert current_revision(project) == head_revision()
    from django.core.management import call_command

    call_command("makemigrations", "queue_pg", "signups", check=True, dry_run=True,
                 verbosity=0)  # models and migrations agree (SystemExit otherwise)
    rows = query(project, "SELECT name, dead_letter_queue, max_receive_count"
                          " FROM queue_pg.queues ORDER BY name")
    assert rows == [("welcome", "welcome-dlq", 5), ("welcome-dlq", None, None)]


def test_request_commits_signup_and_job_together(project: str, client: queue_pg.Client) -> None:
    from django.test import Client

    response = Client().post("/signup/", {"email": "ann@example.com"})
    assert response.status_code == 201, response.content
    data = response.json()
    assert messages(project) == [
        (data["message_id"],
         {"task": "signups.tasks.send_welcome", "args": [data["id"]], "kwargs": {}})
    ]
    assert query(project, "SELECT email FROM signups_signup WHERE id = %s", data["id"]) == [
        ("ann@example.com",)
    ]


def test_failed_request_leaves_neither_signup_nor_job(
    project: str, client: queue_pg.Client
) -> None:
    from django.test import Client

    response = Client().post(
        "/signup/", {"email": "bob@example.com", "referred_by": "nobody@example.com"}
    )
    assert response.status_code == 400
    assert messages(project) == []
    assert query(project, "SELECT id FROM signups_signup WHERE email = 'bob@example.com'") == []


def test_enqueue_joins_atomic_and_autocommits_outside(
    project: str, client: queue_pg.Client
) -> None:
    from django.db import connection, transaction
    from signups.models import Signup
    from signups.tasks import send_welcome

    with transaction.atomic():
        signup = Signup.objects.create(email="cy@example.com")
        msg_id = send_welcome.enqueue(signup.id)
        with connection.cursor() as cur:  # Django's own connection sees it ...
            cur.execute("SELECT count(*) FROM queue_pg.messages WHERE id = %s", [msg_id])
            assert cur.fetchone() == (1,)
        assert messages(project) == []  # ... nobody else does before the commit
    assert [m[0] for m in messages(project)] == [msg_id]

    with pytest.raises(RuntimeError), transaction.atomic():
        send_welcome.enqueue(signup.id)
        raise RuntimeError("roll back")
    assert [m[0] for m in messages(project)] == [msg_id]

    later = send_welcome.enqueue(signup.id)  # autocommit: at once
    assert [m[0] for m in messages(project)] == [msg_id, later]


def test_a_request_outside_atomic_commits_its_enqueue_by_itself(
    project: str, client: queue_pg.Client
) -> None:
    """Through the test client: a view that enqueues outside atomic() (ATOMIC_REQUESTS off) on
    Django's connection, in autocommit: the job is there for every other session as soon as the
    enqueue returns, and stays when the request fails after it."""
    from django.db import connection
    from django.test import Client

    response = Client().post("/signup/7/resend/")
    assert response.status_code == 202, response.content
    first = response.json()["message_id"]
    assert messages(project) == [
        (first, {"task": "signups.tasks.send_welcome", "args": [7], "kwargs": {}})]
    assert connection.get_autocommit() and not connection.in_atomic_block

    failing = Client(raise_request_exception=False).post("/signup/8/resend/", {"fail": "1"})
    assert failing.status_code == 500
    [(_, kept)] = messages(project)[1:]
    assert kept["args"] == [8]  # committed before the failure: nothing rolled it back


@pytest.mark.slow
def test_worker_command_runs_the_jobs(
    project: str, client: queue_pg.Client, tmp_path: Path
) -> None:
    from django.test import Client

    ids = []
    for n in range(4):
        response = Client().post("/signup/", {"email": f"w{n}@example.com"})
        assert response.status_code == 201
        ids.append(response.json()["id"])
    bogus = client.send("welcome", {"task": "no.such.task", "args": [], "kwargs": {}})

    env = {**os.environ, "QUEUE_PG_DSN": project,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path / "worker.log"
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "queue_pg_worker", "--processes", "2", "--concurrency", "2",
         "--wait", "1", "--grace-period", "5"],
        cwd=EXAMPLE, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # both processes ready before the stop: a worker process still starting up dies of
        # SIGTERM (its handler is not installed yet) and the supervisor then exits 1
        wait_until("two ready workers", lambda: log.read_text().count("ready: welcome") == 2)
        wait_until("every signup welcomed", lambda: query(
            project, "SELECT count(*) FROM signups_signup WHERE id = ANY(%s)"
                     " AND welcomed_at IS NOT NULL", ids)[0][0] == len(ids))
        wait_until("the unknown task dead-lettered",
                   lambda: [m[0] for m in messages(project, "welcome-dlq")] == [bogus])
        wait_until("the queue empty", lambda: messages(project) == [])
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_bytes()
    assert proc.returncode == 0, out.decode()
    assert b"worker processes exited with [0, 0]" in out
    (reason,) = query(project, "SELECT attributes->>'dead_letter_reason' FROM queue_pg.messages"
                               " WHERE id = %s", bogus)[0]
    assert "unknown task 'no.such.task'" in reason


def test_admin_lists_queues_and_dead_letters(project: str, client: queue_pg.Client) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    client.send("welcome", {"task": "signups.tasks.send_welcome", "args": [0], "kwargs": {}},
                attributes={"type": "signups.tasks.send_welcome"})
    (msg,) = client.receive("welcome", visibility_timeout=30)
    assert client.dead_letter("welcome", msg.receipt, "cannot be welcomed")
    client.send("welcome", {"n": 1})

    admin, _ = User.objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True}
    )
    web = Client()
    web.force_login(admin)

    page = web.get("/admin/queue_pg/queuestats/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "welcome-dlq" in html and "?source_queue__name=welcome" in html

    page = web.get("/admin/queue_pg/deadletter/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "cannot be welcomed" in html and "signups.tasks.send_welcome" in html
    detail = web.get(f"/admin/queue_pg/deadletter/{msg.id}/change/")
    assert detail.status_code == 200 and "cannot be welcomed" in detail.content.decode()

    # read-only: no adding, changing or deleting through the admin
    assert web.get("/admin/queue_pg/deadletter/add/").status_code == 403
    assert web.post(f"/admin/queue_pg/deadletter/{msg.id}/delete/").status_code == 403
    assert client.stats("welcome-dlq").visible == 1


def test_migration_reverses_and_reapplies(project: str) -> None:
    from django.core.management import call_command

    call_command("migrate", "queue_pg", "zero", verbosity=0)
    assert query(project, "SELECT to_regnamespace('queue_pg')") == [(None,)]
    assert query(project, "SELECT count(*) FROM signups_signup")  # the app's own data stays
    call_command("migrate", verbosity=0)
    assert current_revision(project) == head_revision()
    assert [r[0] for r in query(project, "SELECT name FROM queue_pg.queues ORDER BY name")] == [
        "welcome", "welcome-dlq"
    ]


@pytest.mark.slow
def test_async_tasks_run_between_connection_checks(
    client: queue_pg.Client, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``async def`` task run by the AsyncWorker gets Django's connection handling around it
    (close_old_connections before and after, off the event loop), as a plain one does."""
    import asyncio
    import threading

    import django.db

    calls: list[str] = []
    real = django.db.close_old_connections

    def spy(**kwargs: Any) -> None:
        calls.append("loop" if threading.current_thread() is threading.main_thread() else "thread")
        real(**kwargs)

    monkeypatch.setattr(django.db, "close_old_connections", spy)
    seen: list[int] = []

    async def probe() -> None:
        seen.append(len(calls))

    task = queue_pg.task(queue="welcome", name="probe_async")(probe)

    async def main() -> None:
        async with queue_pg.AsyncClient(project, sweep_interval=None) as ac:
            await ac.send("welcome", task.envelope([], {}), attributes={"type": task.name})
            worker = queue_pg.AsyncWorker(ac, "welcome", registry, wait=1)
            run = asyncio.create_task(worker.run(signals=()))
            for _ in range(200):
                if seen and len(calls) >= 2:
                    break
                await asyncio.sleep(0.05)
            worker.stop()
            await run

    try:
        asyncio.run(main())
    finally:
        registry.tasks.pop("probe_async", None)
    assert seen == [1] and calls == ["thread", "thread"]
