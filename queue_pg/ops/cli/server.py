"""``queue-pg server``: the embedded PostgreSQL that queue-pg uses when given no database.

It lives in ``$QUEUE_PG_DATA`` (default: the per-user data folder, e.g.
``~/.local/share/queue-pg/pgdata``), starts on first use and keeps running for later commands.
"""

from __future__ import annotations

import subprocess
import sys

import click

from queue_pg import embedded
from queue_pg.ops.display import out, shown

__all__ = ["server"]

#: Exit status of ``status`` when the server is not running (as ``pg_ctl status``).
NOT_RUNNING = 3


@click.group()
def server() -> None:
    """The embedded PostgreSQL used when no --dsn / QUEUE_PG_DSN is given.

    Its data lives in $QUEUE_PG_DATA (default: your user data folder). To remove it:
    `queue-pg server stop`, then delete that folder.
    """


@server.command()
def status() -> None:
    """Where its data lives, whether it runs, and its DSN (exit status 3 when stopped)."""
    s = embedded.server_status()
    console = out()
    console.print(f"data folder  {shown(str(s.data_dir))}", soft_wrap=True)
    if s.running:
        console.print(f"state        running (pid {s.pid})")
        console.print(f"dsn          {shown(s.dsn or '')}", soft_wrap=True)
        if s.tcp_dsn is not None:
            console.print(f"tcp dsn      {shown(s.tcp_dsn)}", soft_wrap=True)
            console.print(f"jdbc url     {shown(s.jdbc_url or '')}", soft_wrap=True)
        return
    console.print("state        " + ("stopped" if s.initialized else "not created yet"))
    sys.exit(NOT_RUNNING)


@server.command()
@click.option("--tcp", is_flag=True,
              help="Also listen on a loopback TCP port (127.0.0.1), for clients that cannot use"
                   " a unix socket, such as Spark's JDBC reads; restarts a running server that"
                   " does not. Lasts until the server stops.")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="The TCP port (with --tcp). Default: 5432 if free, else one the system picks."
                   " It names the unix socket too: the DSN changes with it.")
def start(tcp: bool, port: int | None) -> None:
    """Start it (create it on first use) and print its DSN (with --tcp: its TCP DSN and JDBC URL
    too)."""
    if port is not None and not tcp:
        raise click.UsageError("--port is the TCP port: give --tcp with it")
    if tcp:
        try:
            s = embedded.start_tcp(port)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--port") from exc
    else:
        embedded.embedded_dsn()
        s = embedded.server_status()
    console = out()
    console.print(f"running (pid {s.pid}): {shown(s.dsn or '')}", soft_wrap=True)
    if s.tcp_dsn is not None:
        console.print(f"tcp: {shown(s.tcp_dsn)}", soft_wrap=True)
        console.print(f"jdbc: {shown(s.jdbc_url or '')}", soft_wrap=True)


@server.command()
def stop() -> None:
    """Stop it cleanly; its data stays, and the next command starts it again."""
    stopped = embedded.stop_server()
    out().print("stopped" if stopped else "not running")


@server.command()
def url() -> None:
    """Print its DSN alone (starting it if needed): export QUEUE_PG_DSN=$(queue-pg server url)."""
    click.echo(embedded.embedded_dsn())


@server.command(context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def psql(args: tuple[str, ...]) -> None:
    """Open the bundled psql on its queue_pg database (starting it if needed); ARGS go to psql."""
    dsn = embedded.embedded_dsn()
    sys.exit(subprocess.call([str(embedded.bin_path("psql")), dsn, *args]))
