"""``queue-pg azure``: the Azure Queue Storage-compatible endpoint (docs/azure.md), and its
account keys."""

from __future__ import annotations

import click

from queue_pg.ops.cli.endpoints import keyring, serve, with_owner
from queue_pg.ops.cli.state import State, fail, pass_state
from queue_pg.ops.display import out, shown

__all__ = ["azure"]


@click.group(invoke_without_command=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=10001, show_default=True, type=int, help="Port to listen on.")
@click.option("--account", default=None,
              help="Serve this account name only (default: every account with a live key).")
@click.option("--no-auth", is_flag=True,
              help="Accept unsigned requests and run them all as the DSN's user (development"
                   " only).")
@click.option("--pool-size", default=10, show_default=True, type=int,
              help="Connections shared by the requests of every key (each loan runs as the"
                   " key's role).")
@click.pass_context
def azure(ctx: click.Context, host: str, port: int, account: str | None, no_auth: bool,
          pool_size: int) -> None:
    """Serve Azure Queue Storage's REST API on HOST:PORT (path-style URLs:
    http://HOST:PORT/ACCOUNT/QUEUE), so the Azure SDKs use queue_pg.

    Requests are signed with keys from `queue-pg azure key create ROLE` and run as that role.
    Needs the azure extra: pip install 'queue-pg[azure]'.
    """
    if ctx.invoked_subcommand is not None:
        return
    try:
        from queue_pg.azure import create_app
    except ImportError as exc:
        fail(f"{exc}: pip install 'queue-pg[azure]'")
    serve(ctx, "azure", lambda dsn, ring: create_app(dsn, auth=not no_auth, pool_size=pool_size,
                                                     account=account, keyring=ring),
          f"Azure Queue endpoint (account {shown(account or 'ACCOUNT')})", host, port, no_auth)


@azure.group()
def key() -> None:
    """Account keys of the Azure endpoint, each mapped to a PostgreSQL role."""


@key.command("create")
@click.argument("role")
@click.option("--account", default=None,
              help="The account name (3-24 lower-case letters and digits; default: generated).")
@pass_state
def create_key(state: State, role: str, account: str | None) -> None:
    """A new key for ROLE: prints the account name and its base64 key (shown only now; stored
    sealed with QUEUE_PG_SECRET_KEY)."""
    from queue_pg.sealing import create_azure_key

    ring = keyring("azure")
    row = with_owner(state, lambda conn: create_azure_key(conn, role, account, ring))
    out().print(f"AccountName {row[0]}\nAccountKey  {row[1]}", markup=False, highlight=False)


@key.command("revoke")
@click.argument("account")
@pass_state
def revoke_key(state: State, account: str) -> None:
    """Revoke an account's key: its next request is refused."""
    row = with_owner(state, lambda conn: conn.execute(
        "SELECT queue_pg.azure_revoke_key(%s)", [account]).fetchone())
    if not (row and row[0]):
        fail(f"no live key for account {account}")
    out().print(f"revoked {shown(account)}")
