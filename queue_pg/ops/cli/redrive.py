"""``queue-pg redrive``: dead-lettered messages back, at once (``redrive DLQ``, as before) or as
a task at a rate (``redrive start|list|cancel``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import click
from rich.table import Table

from queue_pg.ops.cli.state import State, pass_state
from queue_pg.ops.display import fmt_time, out, shown
from queue_pg.types import RedriveTask

__all__ = ["redrive"]


class _Redrive(click.Group):
    """A group whose first argument may also be a queue: ``redrive DLQ [--to Q] [--limit N]``
    keeps meaning the one-shot move (a queue named like a subcommand needs ``redrive now``)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["now", *args]
        return super().resolve_command(ctx, args)


@click.group(cls=_Redrive)
def redrive() -> None:
    """Move dead-lettered messages back: `redrive DLQ` at once, `redrive start DLQ` as a task.

    A task moves at most --rate messages a second; sweeps (every client sweeps once a minute)
    and `queue-pg redrive start --follow` advance it, and it survives restarts.
    """


@redrive.command("now")
@click.argument("dlq")
@click.option("--to", metavar="QUEUE", help="Move them here (default: the queue each came from).")
@click.option("--limit", type=int, help="Move at most this many.")
@pass_state
def now(state: State, dlq: str, to: str | None, limit: int | None) -> None:
    """Move dead-lettered messages of DLQ back now (receive count reset)."""
    n = state.client.redrive(dlq, to=to, limit=limit)
    out().print(f"moved {n} message{'s' * (n != 1)} out of {shown(dlq)}")


def _table(tasks: Sequence[RedriveTask]) -> Table:
    table = Table()
    for name in ("task", "dlq", "to", "rate/s", "status", "moved", "to move", "started",
                 "finished", "error"):
        table.add_column(name, justify="right" if name in ("task", "moved", "to move") else "left")
    for t in tasks:
        table.add_row(str(t.id), shown(t.dlq), shown(t.target or "(source)"),
                      "-" if t.rate is None else f"{t.rate:g}", t.status, str(t.moved),
                      str(t.to_move), fmt_time(t.started_at), fmt_time(t.finished_at),
                      shown(t.error or ""))
    return table


@redrive.command("start")
@click.argument("dlq")
@click.option("--to", metavar="QUEUE", help="Move them here (default: the queue each came from).")
@click.option("--rate", type=float, help="At most this many messages a second.")
@click.option("--follow", is_flag=True, help="Advance the task every second until it ends.")
@pass_state
def start(state: State, dlq: str, to: str | None, rate: float | None, follow: bool) -> None:
    """Start a redrive task on DLQ; prints its id (and with --follow, its progress)."""
    task = state.client.start_redrive(dlq, to=to, rate=rate)
    out().print(f"redrive task {task} started on {shown(dlq)}")
    while follow:
        [t] = [x for x in state.client.list_redrives(dlq) if x.id == task]
        out().print(f"{t.status}: moved {t.moved} of {t.to_move}")
        if t.status != "running":
            return
        time.sleep(1)
        state.client.redrive_step()


@redrive.command("list")
@click.argument("dlq", required=False)
@pass_state
def list_(state: State, dlq: str | None) -> None:
    """The redrive tasks of DLQ (default: of every queue you manage), newest first."""
    out().print(_table(state.client.list_redrives(dlq)))


@redrive.command("cancel")
@click.argument("task", type=int)
@pass_state
def cancel(state: State, task: int) -> None:
    """Stop redrive task TASK; what it moved stays moved."""
    out().print(_table([state.client.cancel_redrive(task)]))
