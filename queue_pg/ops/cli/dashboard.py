"""``queue-pg dashboard``: the web dashboard (queue_pg.ops.dashboard) on a port of this machine."""

from __future__ import annotations

import click
import psycopg

from queue_pg.ops.cli.state import State as CliState
from queue_pg.ops.cli.state import fail, pass_state
from queue_pg.ops.display import err, shown

__all__ = ["COMMANDS", "dashboard"]


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; mind who can reach it).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free one).")
@click.option("--allow-actions", is_flag=True,
              help="Let requests carrying the token purge queues and redrive dead letters.")
@click.option("--token", envvar="QUEUE_PG_DASHBOARD_TOKEN", metavar="TOKEN",
              help="The token every read and action then needs (the page asks for it once)."
                   " Default: $QUEUE_PG_DASHBOARD_TOKEN (better than the command line, which"
                   " other users of the machine can read).")
@click.option("--login", is_flag=True,
              help="Each browser logs in as a PostgreSQL role and sees and does what its grants"
                   " allow; the DSN only names the server.")
@click.option("--allow-superuser", is_flag=True,
              help="With --login: let superusers and the owner of the queue_pg schema log in"
                   " (refused by default).")
@click.option("--refresh", default=5.0, show_default=True, type=click.FloatRange(1, 3600),
              help="How often the pages poll, in seconds.")
@pass_state
def dashboard(state: CliState, host: str, port: int, allow_actions: bool, token: str | None,
              login: bool, allow_superuser: bool, refresh: float) -> None:
    """Serve the web dashboard: charts of the last hour, the timeout advice, the messages in
    flight, the dead letters. Read-only unless --allow-actions and a token (or --login) are
    given; with a token or --login, nothing is read without it. What it shows and may do is
    what the role of the DSN may, or with --login, what the role a browser logged in as may."""
    from queue_pg.ops.dashboard import Dashboard, serve

    if allow_actions and not token and not login:
        fail("--allow-actions needs a token (set QUEUE_PG_DASHBOARD_TOKEN or --token) or --login")
    psycopg.connect(state.dsn, connect_timeout=10).close()  # a bad DSN fails now, in one line
    board = Dashboard(state.dsn, actions=allow_actions, token=token or None,
                      refresh=refresh, login=login, allow_superuser=allow_superuser)
    need = " and ".join(n for n, on in (("a login", login), ("the token", bool(token))) if on)
    mode = f"actions enabled ({need} required)" if allow_actions else "read-only"
    if login:
        mode += "; each browser logs in as a PostgreSQL role"
    if token:
        mode += "; every read needs the token"

    def ready(url: str) -> None:
        err().print(f"dashboard at {shown(url)} ({mode}); Ctrl-C stops it", soft_wrap=True)

    try:
        serve(board, host, port, ready)
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    finally:
        board.close()


COMMANDS = [dashboard]
