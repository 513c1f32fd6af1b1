"""Commands that install queue_pg and manage who may use a queue, and the demo."""

from __future__ import annotations

import click
import psycopg
from rich.table import Table

from queue_pg.ops.cli.state import State, fail, pass_state
from queue_pg.ops.display import err, fmt_time, out, shown

__all__ = ["COMMANDS"]


@click.command()
@click.option("--reapply-api", is_flag=True,
              help="Re-create the functions and their grants even if unchanged (e.g. after a DBA"
                   " created the queue_pg_* roles).")
@pass_state
def migrate(state: State, reapply_api: bool) -> None:
    """Install or upgrade the queue_pg schema in the database (safe to re-run)."""
    from queue_pg.install import migrate as run_migrate

    result = run_migrate(state.dsn, reapply_api=True if reapply_api else None)
    if result.standby:
        out().print(f"nothing to do: this server is a hot standby (read-only, revision"
                    f" {result.after}); run migrate against the primary, replication brings the"
                    " schema here")
    elif result.before is None:
        out().print(f"installed queue_pg (revision {result.after})")
    elif result.upgraded:
        out().print(f"upgraded queue_pg from revision {result.before} to {result.after}")
    else:
        note = " (functions re-applied)" if result.api_applied else ""
        out().print(f"queue_pg is up to date (revision {result.after}){note}")


@click.command()
def sql() -> None:
    """Print the full install script (schema and functions) for a DBA to run with psql."""
    from queue_pg.install import install_script

    click.echo(install_script(), nl=False)


@click.command()
@click.argument("queue")
@click.argument("role")
@click.argument("privilege")
@pass_state
def grant(state: State, queue: str, role: str, privilege: str) -> None:
    """Give ROLE the PRIVILEGE (send, receive or manage) on QUEUE: `grant QUEUE ROLE PRIVILEGE`
    (needs manage on QUEUE, or admin).

    ROLE must also be a member of queue_pg_producer to send, of queue_pg_consumer to receive
    (of any of them to manage): the command says so when it is not.
    """
    done = state.client.grant(queue, role, privilege)
    out().print(f"{'granted' if done else 'already granted:'} {shown(privilege)} on "
                f"{shown(queue)} to {shown(role)}")
    groups = {"send": ["queue_pg_producer"], "receive": ["queue_pg_consumer"]}.get(
        privilege, ["queue_pg_producer", "queue_pg_consumer"])
    with psycopg.connect(state.dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT bool_or(pg_has_role(%s, g, 'MEMBER')) FROM unnest(%s::text[]) g"
            " WHERE EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = g)",
            [role, [*groups, "queue_pg_admin"]]).fetchone()
    if not (row and row[0]):
        err().print(f"[yellow]warning:[/yellow] {shown(role)} is in none of"
                    f" {', '.join(groups)}, queue_pg_admin, so the grant does nothing yet;"
                    f" hint: GRANT {groups[0]} TO {shown(role)}", soft_wrap=True)


@click.command()
@click.argument("queue")
@click.argument("role")
@click.argument("privilege")
@pass_state
def revoke(state: State, queue: str, role: str, privilege: str) -> None:
    """Take back ROLE's PRIVILEGE on QUEUE (send, receive or manage)."""
    done = state.client.revoke(queue, role, privilege)
    out().print(f"{'revoked' if done else 'not granted:'} {shown(privilege)} on "
                f"{shown(queue)} from {shown(role)}")


@click.command()
@click.argument("queue", required=False)
@pass_state
def grants(state: State, queue: str | None) -> None:
    """The grants of QUEUE (default: of every queue you manage)."""
    rows = state.client.list_grants(queue)
    if not rows:
        err().print("[dim]no grants[/dim]")
        return
    table = Table()
    for name in ("queue", "role", "privilege", "granted at"):
        table.add_column(name)
    for g in rows:
        table.add_row(shown(g.queue), shown(g.role), g.privilege, fmt_time(g.granted_at))
    out().print(table)


@click.command()
@click.option("--quick", is_flag=True, help="A shorter run (fewer messages, 1 s leases).")
@click.option("--messages", type=click.IntRange(0, 1000), help="Ordinary jobs to send.")
@pass_state
def demo(state: State, quick: bool, messages: int | None) -> None:
    """Producers and workers in separate processes: leases lapsing, a heartbeat, a dead letter."""
    from queue_pg.ops.demo import run

    summary = run(state.dsn, quick=quick, messages=messages)
    if summary["lost"] or summary["timed out"]:
        fail("the demo did not end as it should (see above)")


COMMANDS = (migrate, sql, grant, revoke, grants, demo)
