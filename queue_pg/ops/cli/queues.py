"""Commands on queues: create, alter, drop, list, stats, purge, sweep."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.live import Live
from rich.table import Table

from queue_pg.ops.cli.params import given, settings_options
from queue_pg.ops.cli.state import State, pass_state
from queue_pg.ops.display import (
    FLOWS,
    err,
    health_table,
    out,
    queue_table,
    settings_table,
    shown,
)

__all__ = ["COMMANDS"]


@click.command()
@click.argument("name")
@settings_options(alter=False)
@pass_state
def create(state: State, name: str, **settings: Any) -> None:
    """Create queue NAME (a no-op if it exists with the same settings).

    Settings not given take the server's defaults; the table printed shows them all.
    """
    out().print(settings_table(state.client.create_queue(name, **given(settings))))


@click.command()
@click.argument("name")
@settings_options(alter=True)
@pass_state
def alter(state: State, name: str, clear: tuple[str, ...], **settings: Any) -> None:
    """Change some settings of queue NAME; the others stay. `--message-ttl never` = no expiry."""
    changes = given(settings)
    to_clear = set(clear)
    if "message_ttl" in changes and changes["message_ttl"] is None:
        del changes["message_ttl"]
        to_clear.add("message_ttl")
    queue = state.client.alter_queue(name, clear=sorted(to_clear) or None, **changes)
    out().print(settings_table(queue))


@click.command()
@click.argument("name")
@click.option("--if-exists", is_flag=True, help="No error if the queue does not exist.")
@pass_state
def drop(state: State, name: str, if_exists: bool) -> None:
    """Drop queue NAME and all its messages."""
    if state.client.drop_queue(name, if_exists=if_exists):
        out().print(f"dropped queue {shown(name)}")
    else:
        out().print(f"no queue {shown(name)}")


@click.command("list")
@pass_state
def list_(state: State) -> None:
    """Every queue with all its settings."""
    queues = state.client.list_queues()
    if not queues:
        err().print("[dim]no queues yet: `queue-pg create NAME`[/dim]")
        return
    out().print(queue_table(queues))


def pause(seconds: float) -> None:
    """Between two refreshes of ``stats --watch`` (a test replaces it to end the loop)."""
    time.sleep(seconds)


@click.command()
@click.argument("queue", required=False)
@click.option("--watch", "-w", is_flag=True, help="Refresh every second until Ctrl-C.")
@click.option("--flows", type=click.Choice(sorted(FLOWS)), default="1m", show_default=True,
              help="Sends, receives, deletes, lease expiries and stale refusals over the last"
                   " minute, the last hour, or since the queue was made.")
@click.option("--exact", is_flag=True,
              help="Count every message (a scan of each queue: O(messages)) instead of"
                   " estimating counts past 1,000.")
@pass_state
def stats(state: State, queue: str | None, watch: bool, flows: str, exact: bool) -> None:
    """Counts and flows of QUEUE (default: every queue), one query (`queue-pg top`: live).

    Counts past 1,000 per state are estimates (marked ~: the latest sample moved on by the
    flow counters) unless --exact.
    """
    client = state.client

    def table() -> Table:
        return health_table(client.queue_health(queue, exact=exact), flows)

    replica = client.replica_status().line()
    if replica:  # a hot standby: say how stale what it shows is
        err().print(f"[dim]{shown(replica)}[/dim]")
    if not watch:
        out().print(table())
        return
    try:
        with Live(table(), console=out(), auto_refresh=False) as live:
            while True:
                pause(1)
                live.update(table(), refresh=True)
    except KeyboardInterrupt:
        pass


@click.command()
@click.argument("queue")
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@pass_state
def purge(state: State, queue: str, yes: bool) -> None:
    """Delete every message of QUEUE, in any state."""
    if not yes:
        click.confirm(f"Delete every message of queue {queue}, in flight or not?", abort=True)
    n = state.client.purge(queue)
    out().print(f"purged {n} message{'s' * (n != 1)} from {shown(queue)}")


@click.command()
@pass_state
def sweep(state: State) -> None:
    """Delete expired messages now (one bounded batch)."""
    n = state.client.sweep()
    out().print(f"swept {n} expired message{'s' * (n != 1)}")


COMMANDS = (create, alter, drop, list_, stats, purge, sweep)  # redrive: cli/redrive.py
