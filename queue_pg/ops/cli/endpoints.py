"""What ``queue-pg sqs`` and ``queue-pg azure`` share: serving an ASGI app once the DSN is
known good, making a key (its secret sealed: queue_pg/sealing.py), and ``queue-pg secret-key``,
which makes sealing keys and seals the stored secrets."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import click
import psycopg

from queue_pg.errors import translate
from queue_pg.ops.cli.state import State, fail, pass_state
from queue_pg.ops.display import err, out, shown

__all__ = ["app_maker", "endpoint_options", "keyring", "revoke", "secret_key", "serve",
           "with_owner"]


def keyring(extra: str) -> Any:
    """The sealing keys of the environment (queue_pg.sealing.Keyring), or one red line."""
    try:
        import cryptography  # noqa: F401

        from queue_pg.sealing import Keyring, SecretKeyMissing
    except ImportError as exc:
        fail(f"{exc}: pip install 'queue-pg[{extra}]'")
    try:
        return Keyring.required()
    except SecretKeyMissing as exc:
        fail(str(exc))



def endpoint_options(port: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options every endpoint command takes: --host, --port (default ``port``), --no-auth
    and --pool-size."""
    options = [
        click.option("--host", default="127.0.0.1", show_default=True,
                     help="Address to listen on."),
        click.option("--port", default=port, show_default=True, type=int,
                     help="Port to listen on."),
        click.option("--no-auth", is_flag=True,
                     help="Accept unsigned requests and run them all as the DSN's user"
                          " (development only)."),
        click.option("--pool-size", default=10, show_default=True, type=int,
                     help="Connections shared by the requests of every key (each loan runs as"
                          " the key's role)."),
    ]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def app_maker(extra: str) -> Callable[..., Any]:
    """``queue_pg.<extra>.create_app``, or one red line naming the extra to install."""
    try:
        return importlib.import_module(f"queue_pg.{extra}").create_app  # type: ignore[no-any-return]
    except ImportError as exc:
        fail(f"{exc}: pip install 'queue-pg[{extra}]'")


def revoke(state: State, statement: str, value: str, missing: str) -> None:
    """Run a revoke function (``statement`` takes ``value``) as the owner; ``missing`` when it
    revoked nothing."""
    row = with_owner(state, lambda conn: conn.execute(statement, [value]).fetchone())
    if not (row and row[0]):
        fail(missing)
    out().print(f"revoked {shown(value)}")

def serve(ctx: click.Context, extra: str, make_app: Callable[[str, Any], Any], banner: str,
          host: str, port: int, no_auth: bool) -> None:
    """Run ``make_app(dsn, keyring)`` under uvicorn on host:port; a missing extra, a missing
    sealing key (unless no_auth) or a bad DSN is one line (the DSN is tried once here, not on
    the first request). Stored secrets still in plain are counted in a warning."""
    try:
        import uvicorn
    except ImportError as exc:
        fail(f"{exc}: pip install 'queue-pg[{extra}]'")
    ring = None if no_auth else keyring(extra)
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    with psycopg.connect(state.dsn, connect_timeout=10, autocommit=True) as conn:
        if ring is not None:
            plain = _plain_count(conn)
            if plain:
                err().print(f"[red]warning: {plain} endpoint secret(s) stored in plain (made"
                            " before revision 0029): run `queue-pg secret-key seal`[/red]")
    app = make_app(state.dsn, ring)
    out().print(f"{banner} on http://{shown(host)}:{port}"
                + (" [red](no authentication)[/red]" if no_auth else ""))
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _plain_count(conn: psycopg.Connection[Any]) -> int:
    try:
        row = conn.execute("SELECT count(*) FROM queue_pg.endpoint_secrets('')"
                           " WHERE NOT starts_with(secret_key, 'qps1.')").fetchone()
    except psycopg.Error:  # not the owner: the endpoint's own look-ups will say so
        return 0
    return int(row[0]) if row else 0


def with_owner(state: State, call: Callable[[psycopg.Connection[Any]], Any]) -> Any:
    """``call(conn)`` on an autocommit connection, its errors as queue_pg's."""
    with psycopg.connect(state.dsn, autocommit=True) as conn, translate():
        return call(conn)


@click.group("secret-key")
def secret_key() -> None:
    """The sealing key of the endpoints' stored secrets (QUEUE_PG_SECRET_KEY).

    SQS secrets and Azure account keys are stored sealed (AES-256-GCM) with a key the database
    never holds; the endpoints and `key create` read it from QUEUE_PG_SECRET_KEY or the file
    named by QUEUE_PG_SECRET_KEY_FILE. Several keys (comma-separated): the first seals.
    """


@secret_key.command("generate")
def generate() -> None:
    """Print a new sealing key (keep it out of the database and its backups)."""
    from queue_pg.sealing import generate_key

    out().print(generate_key(), markup=False, highlight=False)


@secret_key.command("seal")
@pass_state
def seal(state: State) -> None:
    """Seal every stored secret with the first key: the plain ones of before revision 0029 and
    those sealed with an older key (rotation: put the new key first, the old after it)."""
    from queue_pg.sealing import seal_all

    ring = keyring("sqs")
    done, skipped = with_owner(state, lambda conn: seal_all(conn, ring))
    out().print(f"sealed {done} secret(s) with key {ring.key_id}"
                + (f"; {skipped} changed meanwhile: run it again" if skipped else ""))
