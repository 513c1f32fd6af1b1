"""``queue-pg advise`` and ``queue-pg tune``: the timeout advice as a table, and acting on it.

The figures and the decisions are SQL's (queue_pg.timeout_advice, tune, split); these commands
only show them.
"""

from __future__ import annotations

from collections.abc import Sequence

import click
from rich.table import Table

from queue_pg.advice import SplitPart, TimeoutAdvice, TuningStep
from queue_pg.ops.cli.state import State as CliState
from queue_pg.ops.cli.state import pass_state
from queue_pg.ops.display import fmt_seconds, out, shown

__all__ = ["COMMANDS", "advise", "tune"]


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def advice_table(rows: Sequence[TimeoutAdvice]) -> Table:
    table = Table(title="timeout advice (last 24 hours)", title_justify="left")
    for header in ("queue", "type"):
        table.add_column(header, no_wrap=True)
    for header in ("timeout\nnow", "timeout\nadvised", "heartbeat\nevery", "samples",
                   "p50", "p99", "max", "expiry\nrate", "redeliv-\neries", "stale\nreceipts"):
        table.add_column(header, justify="right")
    table.add_column("confidence")
    table.add_column("split?")
    for a in rows:
        split = "-"
        if a.split_advised:
            split = "yes" if a.p99_spread is None else f"yes (p99 spread {a.p99_spread:.0f}x)"
        table.add_row(
            shown(a.queue), "(all)" if a.scope == "queue" else shown(a.type or "(none)"),
            fmt_seconds(a.current_timeout), fmt_seconds(a.recommended_timeout),
            fmt_seconds(a.heartbeat_interval), str(a.samples), _num(a.p50), _num(a.p99),
            _num(a.max), _num(a.expiry_rate, 2), str(a.redeliveries), str(a.stale_receipts),
            a.confidence, split if a.scope == "queue" else "",
        )
    return table


def steps_table(rows: Sequence[TuningStep], applied: bool) -> Table:
    table = Table(title="tuning" + ("" if applied else " (proposed; --apply to change)"),
                  title_justify="left")
    table.add_column("queue", no_wrap=True)
    for header in ("timeout\nnow", "advice", "new", "samples"):
        table.add_column(header, justify="right")
    table.add_column("changed")
    table.add_column("why")
    for s in rows:
        table.add_row(shown(s.queue), fmt_seconds(s.old_timeout), fmt_seconds(s.advice),
                      fmt_seconds(s.new_timeout), str(s.samples),
                      "yes" if s.changed else "no", shown(s.why))
    return table


def split_table(queue: str, parts: Sequence[SplitPart], applied: bool) -> Table:
    table = Table(title=f"split of {shown(queue)}" + ("" if applied else " (proposed)"),
                  title_justify="left")
    for header in ("type", "target queue", "timeout", "advised", "routed"):
        table.add_column(header)
    for p in parts:
        table.add_row(shown(p.type), shown(p.target), fmt_seconds(p.visibility_timeout),
                      "yes" if p.advised else "no", "yes" if p.routed else "no")
    return table


@click.command()
@click.argument("queue", required=False)
@pass_state
def advise(state: CliState, queue: str | None) -> None:
    """The right visibility timeout of QUEUE (default: every queue), by type, with the evidence."""
    rows = state.client.timeout_advice(queue)
    if queue is not None:
        state.client.get_queue(queue)  # QueueNotFound rather than an empty table
    out().print(advice_table(rows))


@click.command()
@click.argument("queue", required=False)
@click.option("--apply", is_flag=True, help="Make the changes (default: only show them).")
@click.option("--split", "split_", is_flag=True,
              help="Propose (with --apply: create) a queue per type and the routes to them.")
@pass_state
def tune(state: CliState, queue: str | None, apply: bool, split_: bool) -> None:
    """Move QUEUE's visibility timeout toward the advice (default: every queue).

    A step moves by at most 2x, and only when the advice differs by more than 25% with at least
    30 samples since the last change."""
    client = state.client
    names = [queue] if queue is not None else [q.name for q in client.list_queues()]
    if split_:
        for name in names:
            parts = client.split(name, apply=apply)
            if parts and (queue is not None or any(p.advised for p in parts)):
                out().print(split_table(name, parts, apply))
        return
    steps = [s for name in names for s in client.tune(name, apply=apply)]
    out().print(steps_table(steps, apply))


COMMANDS: list[click.Command] = [advise, tune]
