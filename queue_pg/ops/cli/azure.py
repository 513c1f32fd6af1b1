"""``queue-pg azure``: the Azure Queue Storage-compatible endpoint (docs/azure.md), and its
account keys."""

from __future__ import annotations

import click

from queue_pg.ops.cli.endpoints import (
    app_maker,
    endpoint_options,
    keyring,
    revoke,
    serve,
    with_owner,
)
from queue_pg.ops.cli.state import State, pass_state
from queue_pg.ops.display import out, shown

__all__ = ["azure"]


@click.group(invoke_without_command=True)
@endpoint_options(10001)
@click.option("--account", default=None,
              help="Serve this account name only (default: every account with a live key).")
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
    create_app = app_maker("azure")
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
    revoke(state, "SELECT queue_pg.azure_revoke_key(%s)", account,
           f"no live key for account {account}")
