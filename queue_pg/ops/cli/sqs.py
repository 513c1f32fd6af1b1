"""``queue-pg sqs``: the SQS-compatible endpoint (docs/sqs.md), and its access keys."""

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
from queue_pg.ops.display import out

__all__ = ["sqs"]


@click.group(invoke_without_command=True)
@endpoint_options(9324)
@click.option("--region", default="us-east-1", show_default=True,
              help="The region requests must be signed for (their credential scope).")
@click.pass_context
def sqs(ctx: click.Context, host: str, port: int, no_auth: bool, pool_size: int,
        region: str) -> None:
    """Serve SQS's JSON protocol on HOST:PORT, so boto3 and the AWS SDKs use queue_pg.

    Requests are signed with keys from `queue-pg sqs key create ROLE` and run as that role.
    Needs the sqs extra: pip install 'queue-pg[sqs]'.
    """
    if ctx.invoked_subcommand is not None:
        return
    create_app = app_maker("sqs")
    serve(ctx, "sqs", lambda dsn, ring: create_app(dsn, auth=not no_auth, pool_size=pool_size,
                                                   region=region, keyring=ring),
          "SQS endpoint", host, port, no_auth)


@sqs.group()
def key() -> None:
    """Access keys of the SQS endpoint, each mapped to a PostgreSQL role."""


@key.command("create")
@click.argument("role")
@pass_state
def create_key(state: State, role: str) -> None:
    """A new key for ROLE: prints the access key id and the secret (shown only now; stored
    sealed with QUEUE_PG_SECRET_KEY)."""
    from queue_pg.sealing import create_sqs_key

    ring = keyring("sqs")
    row = with_owner(state, lambda conn: create_sqs_key(conn, role, ring))
    out().print(f"aws_access_key_id     {row[0]}\naws_secret_access_key {row[1]}")


@key.command("revoke")
@click.argument("access_key")
@pass_state
def revoke_key(state: State, access_key: str) -> None:
    """Revoke a key: its next request is refused."""
    revoke(state, "SELECT queue_pg.sqs_revoke_key(%s)", access_key, f"no live key {access_key}")
