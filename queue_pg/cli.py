"""``queue-pg``: the command line of queue_pg.

Every command is one or two calls of :class:`queue_pg.client.Client` (``sql`` and ``migrate``
call :mod:`queue_pg.migrate`), rendered with rich. The database is ``--dsn``, else
``$QUEUE_PG_DSN``, else the embedded server (:func:`queue_pg.embedded.resolve_dsn`); each
command says on stderr which one it used.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, NoReturn, TypeVar

import click
import psycopg
from psycopg import conninfo
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from queue_pg.client import Client
from queue_pg.embedded import EmbeddedPostgresMissing, resolve_dsn
from queue_pg.errors import QueueError
from queue_pg.types import Message, QueueConfig, QueueStats

__all__ = ["main", "queue_table", "settings_table", "stats_table"]

F = TypeVar("F", bound=Callable[..., Any])

#: Settings that may be NULL, i.e. that ``alter --clear`` can reset.
NEVER = "never"


def out() -> Console:
    """stdout; when it is not a terminal, wide enough that tables are not squeezed to 80."""
    wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
    return Console(highlight=False, width=wide)


def err() -> Console:
    return Console(stderr=True, highlight=False)


def fail(message: str) -> NoReturn:
    err().print(f"[red]error: {escape(message)}[/red]", soft_wrap=True)
    sys.exit(1)


# --- formatting -----------------------------------------------------------------------------------


def fmt_seconds(value: float | None, none: str = "-") -> str:
    """3600 -> '1h', 90 -> '1m30s', 0.25 -> '0.25s', None -> ``none``."""
    if value is None:
        return none
    if value < 60 or value != int(value):
        return f"{value:g}s"
    rest, parts = int(value), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts)


def fmt_age(value: float | None) -> str:
    """An age: 3.33s, 2m9s."""
    if value is None or value >= 60:
        return fmt_seconds(value if value is None else round(value))
    return f"{value:.3g}s"


def fmt_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def fmt_time(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def safe_dsn(dsn: str) -> str:
    """The DSN as given, without its password, to show."""
    if "://" in dsn:
        dsn = re.sub(r"(?<=[?&])password=[^&]*&?", "", dsn).rstrip("?&")
        return re.sub(r"(://[^:/@?]*):[^@/?]*@", r"\1@", dsn)
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    params.pop("password", None)
    return conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def _settings_rows(q: QueueConfig) -> list[tuple[str, str]]:
    return [
        ("visibility_timeout", fmt_seconds(q.visibility_timeout)),
        ("message_ttl", fmt_seconds(q.message_ttl, NEVER)),
        ("delay", fmt_seconds(q.delay)),
        ("max_message_size", str(q.max_message_size)),
        ("receive_wait", fmt_seconds(q.receive_wait)),
        ("max_lease", fmt_seconds(q.max_lease)),
        ("dead_letter_queue", q.dead_letter_queue or "-"),
        ("max_receive_count", "-" if q.max_receive_count is None else str(q.max_receive_count)),
        ("in_flight_limit", "-" if q.in_flight_limit is None else str(q.in_flight_limit)),
        ("history", "on" if q.history else "off"),
        ("history_retention", fmt_seconds(q.history_retention)),
    ]


def settings_table(q: QueueConfig) -> Table:
    """One queue's settings, one per line."""
    table = Table(title=f"queue {q.name}", title_justify="left")
    table.add_column("setting")
    table.add_column("value")
    for name, value in _settings_rows(q):
        table.add_row(name, escape(value))
    return table


def queue_table(queues: Sequence[QueueConfig]) -> Table:
    """Every queue (at least one) with every setting."""
    short = {
        "visibility_timeout": "visibility\ntimeout",
        "message_ttl": "message\nttl",
        "max_message_size": "max\nmessage size",
        "receive_wait": "receive\nwait",
        "max_lease": "max\nlease",
        "dead_letter_queue": "dead letter\nqueue",
        "max_receive_count": "max receive\ncount",
        "in_flight_limit": "in-flight\nlimit",
        "history_retention": "history\nretention",
    }
    table = Table()
    table.add_column("queue", no_wrap=True)
    for name, _ in _settings_rows(queues[0]):
        table.add_column(short.get(name, name), justify="right")
    for q in queues:
        table.add_row(escape(q.name), *(escape(v) for _, v in _settings_rows(q)))
    return table


def stats_table(rows: Iterable[QueueStats], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("queue", no_wrap=True)
    for header in ("visible", "in flight", "delayed", "dead-\nlettered", "oldest\nvisible",
                   "stale\nreceipts", "lease\nexpiries"):
        table.add_column(header, justify="right")
    for s in rows:
        table.add_row(
            escape(s.queue), str(s.visible), str(s.in_flight), str(s.delayed),
            str(s.dead_lettered), fmt_age(s.oldest_visible_age), str(s.stale_receipts),
            str(s.lease_expiries),
        )
    return table


def message_table(messages: Sequence[Message], *, receipts: bool) -> Table:
    table = Table()
    table.add_column("id", justify="right", no_wrap=True)
    if receipts:
        width = max(len(m.receipt or "") for m in messages)
        table.add_column("receipt", no_wrap=True, min_width=width)
    table.add_column("receive count", justify="right")
    table.add_column("enqueued at" if not receipts else "lease until", no_wrap=True)
    table.add_column("attributes", overflow="fold")
    table.add_column("body", overflow="fold")
    for m in messages:
        cells = [str(m.id)]
        if receipts:
            cells.append(m.receipt or "")
        cells += [
            str(m.receive_count),
            fmt_time(m.visible_until if receipts else m.enqueued_at),
            escape(fmt_json(m.attributes)) if m.attributes else "",
            escape(fmt_json(m.body)),
        ]
        table.add_row(*cells)
    return table


def message_json(m: Message) -> str:
    return fmt_json({
        "id": m.id, "queue": m.queue, "receipt": m.receipt, "receive_count": m.receive_count,
        "body": m.body, "attributes": m.attributes, "enqueued_at": m.enqueued_at,
        "visible_until": m.visible_until, "expires_at": m.expires_at,
    })


# --- parameter types ------------------------------------------------------------------------------


class Duration(click.ParamType):
    """Seconds, with an optional unit (``90``, ``1.5``, ``30s``, ``5m``, ``12h``, ``4d``);
    with ``never_ok``, the word ``never`` too (returned as is)."""

    name = "seconds"
    units: ClassVar[dict[str, int]] = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

    def __init__(self, never_ok: bool = False) -> None:
        self.never_ok = never_ok

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, (int, float)):
            return value
        text = str(value).strip().lower()
        if self.never_ok and text == NEVER:
            return NEVER
        match = re.fullmatch(r"([-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([smhd]?)", text)
        if not match:
            hint = " or 'never'" if self.never_ok else ""
            self.fail(f"{value!r} is not a duration (seconds, or with s/m/h/d{hint})", param, ctx)
        return float(match.group(1)) * self.units[match.group(2)]


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{what} is not JSON: {exc}", param_hint="BODY_JSON") from None


def parse_attrs(pairs: Sequence[str]) -> dict[str, str] | None:
    attrs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--attr")
        attrs[key] = value
    return attrs or None


# --- the group ------------------------------------------------------------------------------------


@dataclass
class State:
    """The database of this invocation, resolved and connected on first use."""

    dsn_option: str | None
    _dsn: str | None = None
    _client: Client | None = None

    @property
    def dsn(self) -> str:
        if self._dsn is None:
            self._dsn, source = resolve_dsn(self.dsn_option)
            err().print(f"[dim]using {escape(safe_dsn(self._dsn))} ({escape(source)})[/dim]",
                        soft_wrap=True)
        return self._dsn

    @property
    def client(self) -> Client:
        if self._client is None:
            # Connect once first: a bad DSN then fails at once with libpq's message, instead of
            # the client's pool retrying in the background until its timeout.
            psycopg.connect(self.dsn, connect_timeout=10).close()
            self._client = Client(self.dsn, min_size=1, max_size=4)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


NOT_INSTALLED = (
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedTable,
)


class Group(click.Group):
    """Turns the errors a user can cause into one red line and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except QueueError as exc:
            fail(str(exc))
        except EmbeddedPostgresMissing as exc:
            fail(str(exc))
        except NOT_INSTALLED as exc:
            fail("queue_pg is not installed in this database (run `queue-pg migrate`): "
                 + (exc.diag.message_primary or str(exc)))
        except psycopg.OperationalError as exc:
            fail(f"cannot use the database: {str(exc).strip()}")


pass_state = click.make_pass_decorator(State)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--dsn", metavar="DSN",
              help="PostgreSQL to use. Default: $QUEUE_PG_DSN, else the embedded server.")
@click.version_option(package_name="queue-pg")
@click.pass_context
def main(ctx: click.Context, dsn: str | None) -> None:
    """A message queue inside PostgreSQL, with SQS-style leases.

    New here? Run `queue-pg demo`.
    """
    state = ctx.obj = State(dsn)
    ctx.call_on_close(state.close)


def settings_options(*, alter: bool) -> Callable[[F], F]:
    """The queue settings as options (create and alter); unset options are not sent."""
    options = [
        click.option("--visibility-timeout", type=Duration(),
                     help="Lease a receive gives (default 30s, 0 - 7d)."),
        click.option("--message-ttl", type=Duration(never_ok=True),
                     help="Age after which a message is dropped, or 'never' (default 4d)."),
        click.option("--delay", type=Duration(), help="Initial invisibility (default 0, 0 - 7d)."),
        click.option("--max-message-size", type=int,
                     help="Body size limit in bytes (default 1048576, 1024 - 16777216)."),
        click.option("--receive-wait", type=Duration(),
                     help="Default long-poll wait (default 0, 0 - 20s)."),
        click.option("--max-lease", type=Duration(),
                     help="No lease reaches past this after its receive (default 12h)."),
        click.option("--dead-letter-queue", metavar="QUEUE",
                     help="Where messages go after --max-receive-count receives."),
        click.option("--max-receive-count", type=int, help="1 - 1000, with --dead-letter-queue."),
        click.option("--in-flight-limit", type=int, help="Cap on received-not-deleted messages."),
        click.option("--history/--no-history", default=None,
                     help="Keep a row per finished message (default on)."),
        click.option("--history-retention", type=Duration(),
                     help="How long history rows are kept (default 7d, at least 1h)."),
    ]
    if alter:
        options.append(click.option("--clear", "clear", multiple=True,
                                    metavar="SETTING",
                                    help="Set a nullable setting to NULL, e.g. message_ttl."))

    def decorate(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def given(settings: dict[str, Any]) -> dict[str, Any]:
    """The options the user gave; ``--message-ttl never`` becomes None (NULL: never)."""
    return {k: (None if v == NEVER else v) for k, v in settings.items() if v is not None}


# --- commands -------------------------------------------------------------------------------------


@main.command()
@click.option("--reapply-api", is_flag=True,
              help="Re-create the functions and their grants even if unchanged (e.g. after a DBA"
                   " created the queue_pg_* roles).")
@pass_state
def migrate(state: State, reapply_api: bool) -> None:
    """Install or upgrade the queue_pg schema in the database (safe to re-run)."""
    from queue_pg.migrate import migrate as run_migrate

    result = run_migrate(state.dsn, reapply_api=True if reapply_api else None)
    if result.before is None:
        out().print(f"installed queue_pg (revision {result.after})")
    elif result.upgraded:
        out().print(f"upgraded queue_pg from revision {result.before} to {result.after}")
    else:
        note = " (functions re-applied)" if result.api_applied else ""
        out().print(f"queue_pg is up to date (revision {result.after}){note}")


@main.command()
def sql() -> None:
    """Print the full install script (schema and functions) for a DBA to run with psql."""
    from queue_pg.migrate import install_script

    click.echo(install_script(), nl=False)


@main.command()
@click.argument("name")
@settings_options(alter=False)
@pass_state
def create(state: State, name: str, **settings: Any) -> None:
    """Create queue NAME (a no-op if it exists with the same settings)."""
    out().print(settings_table(state.client.create_queue(name, **given(settings))))


@main.command()
@click.argument("name")
@settings_options(alter=True)
@pass_state
def alter(state: State, name: str, clear: tuple[str, ...], **settings: Any) -> None:
    """Change some settings of queue NAME; the others stay. `--message-ttl never` = no expiry."""
    changes = given(settings)
    to_clear = set(clear)
    if "message_ttl" in changes and changes["message_ttl"] is None:
        del changes["message_ttl"]
        to_clear.add("message_ttl")
    queue = state.client.alter_queue(name, clear=sorted(to_clear) or None, **changes)
    out().print(settings_table(queue))


@main.command()
@click.argument("name")
@click.option("--if-exists", is_flag=True, help="No error if the queue does not exist.")
@pass_state
def drop(state: State, name: str, if_exists: bool) -> None:
    """Drop queue NAME and all its messages."""
    if state.client.drop_queue(name, if_exists=if_exists):
        out().print(f"dropped queue {escape(name)}")
    else:
        out().print(f"no queue {escape(name)}")


@main.command("list")
@pass_state
def list_(state: State) -> None:
    """Every queue with all its settings."""
    queues = state.client.list_queues()
    if not queues:
        err().print("[dim]no queues yet: `queue-pg create NAME`[/dim]")
        return
    out().print(queue_table(queues))


@main.command()
@click.argument("queue")
@click.argument("body_json", metavar="BODY_JSON")
@click.option("--delay", type=Duration(), help="Invisible for this long (default: the queue's).")
@click.option("--ttl", type=Duration(), help="Expire after this long (default: the queue's).")
@click.option("--attr", "attrs", multiple=True, metavar="KEY=VALUE",
              help="A message attribute (string); repeatable. `type` is kept in the history.")
@pass_state
def send(state: State, queue: str, body_json: str, delay: float | None, ttl: float | None,
         attrs: tuple[str, ...]) -> None:
    """Send BODY_JSON to QUEUE. BODY_JSON `-` reads stdin: one JSON value a line, one batch."""
    attributes = parse_attrs(attrs)
    if body_json == "-":
        bodies = [parse_json(line, f"stdin line {i}")
                  for i, line in enumerate(sys.stdin.read().splitlines(), 1) if line.strip()]
        if not bodies:
            raise click.BadParameter("stdin holds no JSON lines", param_hint="BODY_JSON")
        ids = state.client.send_batch(queue, bodies, delay=delay, ttl=ttl, attributes=attributes)
    else:
        body = parse_json(body_json, "BODY_JSON")
        ids = [state.client.send(queue, body, delay=delay, ttl=ttl, attributes=attributes)]
    for message_id in ids:
        click.echo(message_id)
    err().print(f"[dim]sent {len(ids)} message{'s' * (len(ids) != 1)} to {escape(queue)}[/dim]")


@main.command()
@click.argument("queue")
@click.option("-n", "--max-messages", default=1, show_default=True, help="1 - 1000.")
@click.option("--visibility-timeout", type=Duration(), help="Lease length (default: the queue's).")
@click.option("--wait", type=Duration(), help="Long-poll up to this long (default: the queue's).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@pass_state
def receive(state: State, queue: str, max_messages: int, visibility_timeout: float | None,
            wait: float | None, as_json: bool) -> None:
    """Lease messages of QUEUE: prints each one's id, receipt, receive count and body.

    Delete a message with its receipt when done (`queue-pg delete QUEUE RECEIPT`), or it is
    delivered again when the lease lapses.
    """
    messages = state.client.receive(queue, max_messages, visibility_timeout=visibility_timeout,
                                     wait=wait)
    show_messages(messages, as_json=as_json, receipts=True)


@main.command()
@click.argument("queue")
@click.option("-n", default=10, show_default=True, help="How many.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@pass_state
def peek(state: State, queue: str, n: int, as_json: bool) -> None:
    """Show visible messages of QUEUE without leasing them."""
    show_messages(state.client.peek(queue, n), as_json=as_json, receipts=False)


def show_messages(messages: Sequence[Message], *, as_json: bool, receipts: bool) -> None:
    if as_json:
        for m in messages:
            click.echo(message_json(m))
    elif messages:
        out().print(message_table(messages, receipts=receipts))
    else:
        err().print("[dim]no messages[/dim]")


@main.command()
@click.argument("queue")
@click.argument("receipts", nargs=-1, required=True, metavar="RECEIPT...")
@pass_state
def delete(state: State, queue: str, receipts: tuple[str, ...]) -> None:
    """Delete received messages of QUEUE by receipt."""
    if len(receipts) == 1:  # one receipt: a refusal is the command's error, with its message
        deleted = state.client.delete(queue, receipts[0])
        out().print(f"{'deleted' if deleted else 'already gone'} {receipts[0]}")
        return
    refused = 0
    for r in state.client.delete_batch(queue, receipts):
        if r.error:
            refused += 1
            err().print(f"[red]refused ({r.error})[/red] {r.receipt}")
        else:
            out().print(f"{'deleted' if r.deleted else 'already gone'} {r.receipt}")
    if refused:
        fail(f"{refused} of {len(receipts)} receipts refused")


@main.command()
@click.argument("queue")
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@pass_state
def purge(state: State, queue: str, yes: bool) -> None:
    """Delete every message of QUEUE, in any state."""
    if not yes:
        click.confirm(f"Delete every message of queue {queue}, in flight or not?", abort=True)
    n = state.client.purge(queue)
    out().print(f"purged {n} message{'s' * (n != 1)} from {escape(queue)}")


def _sleep(s: float) -> None:  # tests replace it to end --watch
    time.sleep(s)


@main.command()
@click.argument("queue", required=False)
@click.option("--watch", "-w", is_flag=True, help="Refresh every second until Ctrl-C.")
@pass_state
def stats(state: State, queue: str | None, watch: bool) -> None:
    """Counts of QUEUE (default: every queue): visible, in flight, delayed, dead-lettered, ..."""
    client = state.client

    def table() -> Table:
        if queue is not None:
            return stats_table([client.stats(queue)])
        rows = []
        for q in client.list_queues():
            try:
                rows.append(client.stats(q.name))
            except QueueError:  # dropped since list_queues()
                continue
        return stats_table(rows)

    if not watch:
        out().print(table())
        return
    try:
        with Live(table(), console=out(), auto_refresh=False) as live:
            while True:
                _sleep(1)
                live.update(table(), refresh=True)
    except KeyboardInterrupt:
        pass


@main.command()
@click.argument("dlq")
@click.option("--to", metavar="QUEUE", help="Move them here (default: the queue each came from).")
@click.option("--limit", type=int, help="Move at most this many.")
@pass_state
def redrive(state: State, dlq: str, to: str | None, limit: int | None) -> None:
    """Move dead-lettered messages of DLQ back (receive count reset)."""
    n = state.client.redrive(dlq, to=to, limit=limit)
    out().print(f"moved {n} message{'s' * (n != 1)} out of {escape(dlq)}")


@main.command()
@pass_state
def sweep(state: State) -> None:
    """Delete expired messages now (one bounded batch)."""
    n = state.client.sweep()
    out().print(f"swept {n} expired message{'s' * (n != 1)}")


@main.command()
@click.argument("queue")
@click.argument("role")
@click.argument("privilege")
@pass_state
def grant(state: State, queue: str, role: str, privilege: str) -> None:
    """Let ROLE PRIVILEGE QUEUE: send, receive or manage (needs manage on QUEUE, or admin).

    ROLE must also be a member of queue_pg_producer to send, of queue_pg_consumer to receive.
    """
    done = state.client.grant(queue, role, privilege)
    out().print(f"{'granted' if done else 'already granted:'} {escape(privilege)} on "
                f"{escape(queue)} to {escape(role)}")


@main.command()
@click.argument("queue")
@click.argument("role")
@click.argument("privilege")
@pass_state
def revoke(state: State, queue: str, role: str, privilege: str) -> None:
    """Take back ROLE's PRIVILEGE on QUEUE (send, receive or manage)."""
    done = state.client.revoke(queue, role, privilege)
    out().print(f"{'revoked' if done else 'not granted:'} {escape(privilege)} on "
                f"{escape(queue)} from {escape(role)}")


@main.command()
@click.argument("queue", required=False)
@pass_state
def grants(state: State, queue: str | None) -> None:
    """The grants of QUEUE (default: of every queue you manage)."""
    rows = state.client.list_grants(queue)
    if not rows:
        err().print("[dim]no grants[/dim]")
        return
    table = Table()
    for name in ("queue", "role", "privilege", "granted at"):
        table.add_column(name)
    for g in rows:
        table.add_row(escape(g.queue), escape(g.role), g.privilege, fmt_time(g.granted_at))
    out().print(table)


@main.command()
@click.option("--quick", is_flag=True, help="A shorter run (fewer messages, 1 s leases).")
@click.option("--messages", type=click.IntRange(0, 1000), help="Ordinary jobs to send.")
@pass_state
def demo(state: State, quick: bool, messages: int | None) -> None:
    """Producers and workers in separate processes: leases lapsing, a heartbeat, a dead letter."""
    from queue_pg.demo import run

    summary = run(state.dsn, quick=quick, messages=messages)
    if summary["lost"] or summary["timed out"]:
        fail("the demo did not end as it should (see above)")


if __name__ == "__main__":  # pragma: no cover
    main()


def _register_worker() -> None:
    """`queue-pg worker` lives in its own module (it imports the worker runtime)."""
    from queue_pg.worker_cli import worker_command

    main.add_command(worker_command)


_register_worker()
