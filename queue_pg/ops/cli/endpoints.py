"""What ``queue-pg sqs`` and ``queue-pg azure`` share: serving an ASGI app once the DSN is
known good, and the one-row calls of their key commands."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click
import psycopg

from queue_pg.errors import translate
from queue_pg.ops.cli.state import State, fail
from queue_pg.ops.display import out, shown

__all__ = ["key_row", "serve"]


def serve(ctx: click.Context, extra: str, make_app: Callable[[str], Any], banner: str,
          host: str, port: int, no_auth: bool) -> None:
    """Run ``make_app(dsn)`` under uvicorn on host:port; a missing extra or a bad DSN is one
    line (the DSN is tried once here, not on the first request)."""
    try:
        import uvicorn
    except ImportError as exc:
        fail(f"{exc}: pip install 'queue-pg[{extra}]'")
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    psycopg.connect(state.dsn, connect_timeout=10).close()
    app = make_app(state.dsn)
    out().print(f"{banner} on http://{shown(host)}:{port}"
                + (" [red](no authentication)[/red]" if no_auth else ""))
    uvicorn.run(app, host=host, port=port, log_level="warning")


def key_row(state: State, query: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    """The one row a key function answers, its errors as queue_pg's."""
    with psycopg.connect(state.dsn, autocommit=True) as conn, translate():
        return conn.execute(query, params).fetchone()
