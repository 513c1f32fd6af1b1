"""``queue-pg``: the command line of queue_pg.

Every command is one or two calls of :class:`queue_pg.client.Client` (``sql`` and ``migrate``
call :mod:`queue_pg.install`), rendered with rich. The database is ``--dsn``, else
``$QUEUE_PG_DSN``, else the embedded server (``queue-pg server``); each command says on stderr
which one it used. An error a user can cause ends in one red line and exit status 1.
"""

from __future__ import annotations

from typing import Any

import click
import psycopg

from queue_pg.errors import QueueError, translate
from queue_pg.jobs.worker_cli import worker_command
from queue_pg.ops.cli import admin, advice, messages, queues, surfaces
from queue_pg.ops.cli import tasks as task_commands
from queue_pg.ops.cli.azure import azure
from queue_pg.ops.cli.dashboard import dashboard
from queue_pg.ops.cli.endpoints import secret_key
from queue_pg.ops.cli.redrive import redrive
from queue_pg.ops.cli.server import server
from queue_pg.ops.cli.spark import spark
from queue_pg.ops.cli.sqs import sqs
from queue_pg.ops.cli.state import State, fail

__all__ = ["main"]


def _database_error(exc: BaseException) -> psycopg.Error | None:
    """The psycopg error in ``exc``: itself, or the one SQLAlchemy (migrate) wrapped."""
    if isinstance(exc, psycopg.Error):
        return exc
    orig = getattr(exc, "orig", None)
    return orig if isinstance(orig, psycopg.Error) else None


class Group(click.Group):
    """Turns the errors a user can cause into one red line and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except QueueError as exc:  # EmbeddedPostgresMissing among them
            fail(str(exc))
        except Exception as exc:
            db_error = _database_error(exc)
            if db_error is None:
                raise
            try:
                translate(db_error)  # raises the queue_pg class when it has one
            except QueueError as known:
                fail(str(known))
            raise  # pragma: no cover - translate always raises


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--dsn", metavar="DSN",
              help="PostgreSQL to use. Default: $QUEUE_PG_DSN, else the embedded server.")
@click.version_option(None, "-V", "--version", package_name="queue-pg", prog_name="queue-pg")
@click.pass_context
def main(ctx: click.Context, dsn: str | None) -> None:
    """A message queue inside PostgreSQL, with SQS-style leases.

    New here? Run `queue-pg demo`.
    """
    state = ctx.obj = State(dsn)
    ctx.call_on_close(state.close)


for _command in (*queues.COMMANDS, *messages.COMMANDS, *admin.COMMANDS, *advice.COMMANDS, server,
                 spark, worker_command, *surfaces.COMMANDS, *task_commands.COMMANDS, redrive,
                 dashboard, sqs, azure, secret_key):
    main.add_command(_command)
