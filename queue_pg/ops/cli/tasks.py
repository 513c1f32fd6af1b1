"""``queue-pg tasks MODULES``: the tasks the modules register, as a worker would see them; and
the failed jobs, kept in dead-letter queues: ``tasks failed``, ``tasks retry ID|--all``,
``tasks purge DLQ``; ``tasks revoke QUEUE ID`` cancels jobs not started. The rules are SQL's (the
view ``dead_letters``, ``redrive_message``, ``redrive``, ``purge``, ``cancel_message``); these
commands only call them."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from queue_pg.ops.cli.state import State, pass_state
from queue_pg.ops.display import fmt_json, fmt_seconds, fmt_time, out, shown, text
from queue_pg.plain import plain

__all__ = ["COMMANDS", "tasks_command"]


class _Tasks(click.Group):
    """A group whose first argument may also be a module: ``tasks myapp.tasks`` keeps listing
    the tasks (a module named like a subcommand needs ``tasks list``)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["list", *args]
        return super().resolve_command(ctx, args)


@click.group("tasks", cls=_Tasks)
def tasks_command() -> None:
    """Tasks and failed jobs: `tasks MODULES` lists the tasks; `tasks failed`, `tasks retry
    ID|--all` and `tasks purge DLQ` handle the jobs that failed for good (in dead-letter
    queues)."""


@tasks_command.command("list")
@click.argument("modules", nargs=-1, required=True)
def list_tasks(modules: tuple[str, ...]) -> None:
    """List the tasks MODULES (e.g. myapp.tasks) register: queue, retries, timeout, schedules,
    and the queue settings a task declares (its queue is then created when missing)."""
    from queue_pg.jobs.processes import import_tasks

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


@tasks_command.command("failed")
@click.option("--dlq", metavar="QUEUE", help="Only this dead-letter queue.")
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True)
@pass_state
def failed(state: State, dlq: str | None, limit: int) -> None:
    """The failed jobs (messages in the dead-letter queues you may see): id, task, where it
    came from, attempts, why it was dead-lettered and its last error."""
    rows = state.client.dead_letters(dlq, limit=limit)
    table = Table()
    for column in ("id", "task", "from", "dlq", "attempts", "reason", "last error", "since"):
        table.add_column(column, justify="right" if column in ("id", "attempts") else "left")
    for r in rows:
        table.add_row(str(r.id), shown(r.type or "-"), shown(r.source_queue or "(dropped)"),
                      shown(r.dead_letter_queue), str(r.receive_count),
                      shown(r.reason or "-"), shown(r.last_error or "-"),
                      fmt_time(r.enqueued_at))
    out().print(table if rows else "no failed jobs")


@tasks_command.command("retry")
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "every", is_flag=True, help="Every failed job (of --dlq, or of all).")
@click.option("--dlq", metavar="QUEUE", help="The dead-letter queue (default: found by id).")
@pass_state
def retry(state: State, ids: tuple[int, ...], every: bool, dlq: str | None) -> None:
    """Run failed jobs again: each ID (or --all) goes back to the queue it came from, its
    attempts counted from 0."""
    if bool(ids) == every:
        raise click.UsageError("give job IDS or --all, not both")
    client = state.client
    if every:
        queues = [dlq] if dlq else sorted({r.dead_letter_queue for r in client.dead_letters()})
        n = sum(client.redrive(q) for q in queues)
        out().print(f"retrying {n} failed job{'s' * (n != 1)}")
        return
    where = {r.id: r.dead_letter_queue for r in client.dead_letters(dlq)}
    missing = []
    for i in ids:
        if i in where and client.redrive_message(where[i], i):
            out().print(f"retrying job {i} (from {shown(where[i])})")
        else:
            missing.append(str(i))
    if missing:
        raise click.ClickException(f"no failed job {', '.join(missing)} in a dead-letter queue"
                                   " you manage (see `queue-pg tasks failed`)")


@tasks_command.command("revoke")
@click.argument("queue")
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--terminate", is_flag=True, help="Running jobs too: deleted, and a worker with"
              " --pool processes kills the run (threads are told: job.cancelled).")
@pass_state
def revoke(state: State, queue: str, ids: tuple[int, ...], terminate: bool) -> None:
    """Cancel jobs of QUEUE that have not started (by message id): deleted unless a worker runs
    them now (those run on, unless --terminate)."""
    left = [str(i) for i in ids
            if not state.client.cancel_message(queue, i, terminate=terminate)]
    done = len(ids) - len(left)
    out().print(f"revoked {done} job{'s' * (done != 1)} of {shown(queue)}")
    if left:
        raise click.ClickException(f"not revoked: {', '.join(left)} (running, or not in"
                                   f" {queue})")


@tasks_command.command("purge")
@click.argument("dlq")
@click.option("--yes", is_flag=True, help="Do not ask.")
@pass_state
def purge(state: State, dlq: str, yes: bool) -> None:
    """Delete every failed job of the dead-letter queue DLQ, for good."""
    if not yes:
        click.confirm(f"delete every message of {dlq}?", abort=True)
    n = state.client.purge(dlq)
    out().print(f"deleted {n} failed job{'s' * (n != 1)} of {shown(dlq)}")


COMMANDS = [tasks_command]
