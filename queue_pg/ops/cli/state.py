"""What every ``queue-pg`` command shares: the database of the invocation (``--dsn``, else
``$QUEUE_PG_DSN``, else the embedded server; resolved, announced on stderr and connected on first
use), and how a command fails."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import NoReturn

import click
import psycopg

from queue_pg.client import Client
from queue_pg.dsn import checked_dsn, safe_dsn
from queue_pg.embedded import resolve_dsn
from queue_pg.ops.display import err, shown

__all__ = ["State", "fail", "pass_state"]


def fail(message: str) -> NoReturn:
    """One red line on stderr and exit status 1: how every refusal ends a command."""
    err().print(f"[red]error: {shown(message)}[/red]", soft_wrap=True)
    sys.exit(1)


@dataclass
class State:
    """What the commands share: the ``--dsn`` option, and the DSN and client made from it."""

    dsn_option: str | None
    resolved: str | None = None
    opened: Client | None = None

    @property
    def dsn(self) -> str:
        if self.resolved is None:
            self.resolved, source = resolve_dsn(self.dsn_option)
            err().print(f"[dim]using {shown(safe_dsn(self.resolved))} ({shown(source)})[/dim]",
                        soft_wrap=True)
        return self.resolved

    @property
    def client(self) -> Client:
        if self.opened is None:
            # Connect once first: a bad DSN then fails at once with libpq's message, instead of
            # the client's pool retrying in the background until its timeout.
            psycopg.connect(checked_dsn(self.dsn), connect_timeout=10).close()
            self.opened = Client(self.dsn, min_size=1, max_size=4)
        return self.opened

    def close(self) -> None:
        if self.opened is not None:
            self.opened.close()


pass_state = click.make_pass_decorator(State)
