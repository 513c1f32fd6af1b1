"""``queue-pg tasks MODULES``: the tasks the modules register, as a worker would see them."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from queue_pg.display import fmt_json, fmt_seconds, out, text
from queue_pg.plain import plain

__all__ = ["COMMANDS", "tasks_command"]


@click.command("tasks")
@click.argument("modules", nargs=-1, required=True)
def tasks_command(modules: tuple[str, ...]) -> None:
    """List the tasks MODULES (e.g. myapp.tasks) register: queue, retries, timeout, schedules,
    and the queue settings a task declares (its queue is then created when missing)."""
    from queue_pg.processes import import_tasks

    try:
        registry = import_tasks(modules)
    except ImportError as exc:
        raise click.ClickException(f"cannot import {exc.name or modules}: {exc}") from exc
    schedules: dict[str, list[str]] = {}
    for p in registry.schedules.values():
        schedules.setdefault(p.task.name, []).append(
            f"{p.cron} {p.tz}" + ("" if p.name == p.task.name else f" ({p.name})"))
    table = Table()
    for column in ("task", "queue", "retries", "timeout", "schedule", "creates queue"):
        table.add_column(column)
    for name in sorted(registry.tasks):
        t = registry.tasks[name]
        table.add_row(
            text(name), text(t.queue),
            "until max_receive_count" if t.retries is None else str(t.retries),
            fmt_seconds(t.timeout), Text("\n".join(plain(x) for x in schedules.get(name, ["-"]))),
            text("-" if t.queue_settings is None else fmt_json(t.queue_settings) or "{}"),
        )
    out().print(table)
    if not registry.tasks:
        raise click.ClickException(f"no tasks registered by {', '.join(modules)}")


COMMANDS = [tasks_command]
