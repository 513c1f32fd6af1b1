"""Flask extension: ``qp = QueuePG(app)`` (or ``qp.init_app(app)`` in a factory).

Config keys (all optional):

``QUEUE_PG_DSN``
    The database; default: ``SQLALCHEMY_DATABASE_URI`` when it is PostgreSQL, else
    ``$QUEUE_PG_DSN``, else the embedded server.
``QUEUE_PG_QUEUES`` (``{}``)
    ``{name: {setting: value}}``, created (or brought to these settings) by
    ``flask queue-pg migrate``; name a dead-letter queue before the queues that use it.
``QUEUE_PG_TASKS`` (``[]``)
    Modules the worker imports besides the app's own (tasks defined where the app is are
    registered already).

Every enqueue in an app with the extension (``task.enqueue``, ``task.delay``,
``task.apply_async``, ``qp.enqueue(task, *args)``) uses the app's database: inside a request with
Flask-SQLAlchemy it joins ``db.session``'s transaction, so the message exists if and only if the
session commits (the engine must use ``postgresql+psycopg://``; a request that enqueued and ends
without a commit logs a warning: the message went with the rollback); outside a request (a
command, a job) it commits by itself, on the app's client. ``qp.send(queue, body)`` joins
``db.session`` too. Workers run every plain task inside an app context, so tasks may use
``db.session``. Commands: ``flask queue-pg migrate`` and ``flask queue-pg worker`` (the options of
``queue-pg worker``).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import click
from flask import Flask, current_app, g, has_app_context, has_request_context, request
from flask.cli import AppGroup, ScriptInfo, with_appcontext

from queue_pg.client import Client
from queue_pg.contrib._common import ensure_queues, run_worker_from_options, worker_options
from queue_pg.errors import QueueError
from queue_pg.jobs.tasks import Task, registry
from queue_pg.types import JSON

if TYPE_CHECKING:  # queue_pg.install brings Alembic: not in every worker process
    import psycopg

    from queue_pg.install import MigrationResult

__all__ = ["QueuePG", "cli"]

logger = logging.getLogger("queue_pg.flask")

EXTENSION = "queue_pg"
#: imported first by each worker process of ``--processes N``: loads the app there
CHILD_SETUP = "queue_pg.contrib._flask_child"


class QueuePG:
    """The extension; one instance may serve several apps (the current app's state is used)."""

    def __init__(self, app: Flask | None = None) -> None:
        self._lock = threading.Lock()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        app.config.setdefault("QUEUE_PG_DSN", None)
        app.config.setdefault("QUEUE_PG_QUEUES", {})
        app.config.setdefault("QUEUE_PG_TASKS", [])
        app.extensions[EXTENSION] = _State(self)
        # jobs run where the app's extensions (db.session ...) work; the last app set up wins
        registry.set_job_context("flask", app.app_context)
        # every enqueue uses the app's database: a request's db.session, else the app's client
        registry.connection = _request_connection
        registry.client_for = _app_client
        app.teardown_request(_check_committed)
        app.cli.add_command(cli)

    # --- configuration ---------------------------------------------------------------------------

    @staticmethod
    def dsn(app: Flask | None = None) -> str:
        """The libpq DSN of the app's queue database (see the config keys)."""
        from queue_pg.dsn import libpq_dsn
        from queue_pg.embedded import resolve_dsn

        config = (app or current_app).config
        dsn = config["QUEUE_PG_DSN"]
        uri = config.get("SQLALCHEMY_DATABASE_URI")
        if not dsn and uri:
            from sqlalchemy.engine import make_url

            url = make_url(uri)  # a string or a URL
            if url.get_backend_name() == "postgresql":
                dsn = url.render_as_string(hide_password=False)
        return libpq_dsn(resolve_dsn(dsn)[0])

    @property
    def client(self) -> Client:
        """The current app's client (a pool of its own, made on first use)."""
        state = _state(current_app)
        with self._lock:
            if state.client is None:
                state.client = Client(self.dsn())
            return state.client

    @staticmethod
    def session() -> Any:
        """Flask-SQLAlchemy's ``db.session`` of the current app."""
        db = current_app.extensions.get("sqlalchemy")
        if db is None:
            raise RuntimeError("QueuePG.enqueue needs Flask-SQLAlchemy: db.init_app(app) first")
        return db.session

    # --- operations -----------------------------------------------------------------------------

    def enqueue(self, task: Task, *args: Any, **kwargs: Any) -> int:
        """``task.enqueue(*args, **kwargs)`` inside ``db.session``'s transaction."""
        return task.send(args, kwargs, session=self.session())

    def send(self, queue: str, body: JSON, **options: Any) -> int:
        """``Client.send`` inside ``db.session``'s transaction (delay, ttl, attributes)."""
        return self.client.send(queue, body, session=self.session(), **options)

    def migrate(self) -> MigrationResult:
        """Install or upgrade schema queue_pg, then create the QUEUE_PG_QUEUES."""
        import psycopg

        from queue_pg.install import migrate

        dsn = self.dsn()
        result = migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            ensure_queues(conn, current_app.config["QUEUE_PG_QUEUES"])
        return result


def _request_connection() -> psycopg.Connection[Any] | None:
    """Inside a request of an app with the extension and Flask-SQLAlchemy: the connection under
    ``db.session``, its enqueues counted until the session commits; else None."""
    if not has_request_context() or EXTENSION not in current_app.extensions:
        return None
    db = current_app.extensions.get("sqlalchemy")
    if db is None:
        return None
    from sqlalchemy import event

    from queue_pg._sqla import psycopg_connection

    session = db.session()
    if not event.contains(session, "after_commit", _committed):
        event.listen(session, "after_commit", _committed)
        event.listen(session, "after_rollback", _committed)
    conn = psycopg_connection(session)
    g.queue_pg_uncommitted = g.get("queue_pg_uncommitted", 0) + 1
    return conn


def _committed(session: Any) -> None:
    """The request's enqueues so far are settled: committed, or rolled back on purpose."""
    if has_request_context():
        g.queue_pg_uncommitted = 0


def _check_committed(exc: BaseException | None) -> None:
    """At a request's end: say so when it enqueued and never committed (Flask-SQLAlchemy rolls
    the session back next, the messages with it)."""
    n = g.pop("queue_pg_uncommitted", 0)
    if n:
        logger.warning("%d message(s) enqueued in request %s %s were not committed: they are"
                       " dropped with db.session; call db.session.commit() after enqueueing",
                       n, request.method, request.path)


def _app_client() -> Client | None:
    """The current app's client when the app has the extension, else None."""
    if not has_app_context():
        return None
    state = current_app.extensions.get(EXTENSION)
    return state.ext.client if isinstance(state, _State) else None


class _State:
    def __init__(self, ext: QueuePG) -> None:
        self.ext = ext
        self.client: Client | None = None


def _state(app: Flask) -> _State:
    state = app.extensions.get(EXTENSION)
    if not isinstance(state, _State):
        raise RuntimeError("QueuePG is not set up on this app: QueuePG(app) or init_app(app)")
    return state


# --- commands -----------------------------------------------------------------------------------

cli = AppGroup("queue-pg", help="queue_pg: the schema, the queues and the workers.")


@cli.command("migrate")
def migrate_command() -> None:
    """Install or upgrade schema queue_pg and create the QUEUE_PG_QUEUES."""
    result = _state(current_app).ext.migrate()
    click.echo(f"queue_pg at {result.after} (was {result.before or 'not installed'})")


@with_appcontext
def _worker(**options: Any) -> None:
    """Run the app's tasks until SIGTERM / Ctrl-C (see ``queue-pg worker --help``)."""
    ext = _state(current_app).ext
    modules = tuple(current_app.config["QUEUE_PG_TASKS"])
    if options["processes"] > 1:
        info = click.get_current_context().ensure_object(ScriptInfo)
        if info.app_import_path:  # spawned processes load the app the way this one did
            os.environ["FLASK_APP"] = info.app_import_path
        modules = (CHILD_SETUP, *modules)
    try:
        run_worker_from_options(modules, ext.dsn(), options, source=f"Flask {current_app.name}")
    except QueueError as exc:
        raise click.ClickException(str(exc)) from exc


cli.add_command(
    click.Command("worker", callback=_worker, params=worker_options(), help=_worker.__doc__)
)
