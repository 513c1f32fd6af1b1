"""Commands on messages: send, receive, peek, delete."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from queue_pg.ops.cli.params import Duration, parse_attrs, parse_body
from queue_pg.ops.cli.state import State, fail, pass_state
from queue_pg.ops.display import err, message_json, message_table, out, shown
from queue_pg.types import Message

__all__ = ["COMMANDS"]


@click.command()
@click.argument("queue")
@click.argument("body", metavar="BODY")
@click.option("--string", "as_string", is_flag=True,
              help="Send BODY as a string as it is, even if it reads as JSON.")
@click.option("--delay", type=Duration(), help="Invisible for this long (default: the queue's).")
@click.option("--ttl", type=Duration(), help="Expire after this long (default: the queue's).")
@click.option("--attr", "attrs", multiple=True, metavar="KEY=VALUE",
              help="A message attribute (string); repeatable. `type` is kept in the history.")
@click.option("--group", help="Message group: required on a FIFO queue; a fair queue's tenant.")
@pass_state
def send(state: State, queue: str, body: str, as_string: bool, delay: float | None,
         ttl: float | None, attrs: tuple[str, ...], group: str | None) -> None:
    """Send BODY to QUEUE and print its id.

    BODY is JSON ('{"a": 1}', 42, true) or else a string (hello). `-` reads stdin: one body a
    line, sent as one batch.
    """
    attributes = parse_attrs(attrs)
    if body == "-":
        bodies = [parse_body(line, f"stdin line {i}", string=as_string)
                  for i, line in enumerate(sys.stdin.read().splitlines(), 1) if line.strip()]
        if not bodies:
            raise click.BadParameter("stdin holds no lines", param_hint="BODY")
        ids = state.client.send_batch(queue, bodies, delay=delay, ttl=ttl, attributes=attributes,
                                      group=group)
    else:
        value = parse_body(body, "BODY", string=as_string)
        ids = [state.client.send(queue, value, delay=delay, ttl=ttl, attributes=attributes,
                                 group=group)]
    for message_id in ids:
        click.echo(message_id)
    err().print(f"[dim]sent {len(ids)} message{'s' * (len(ids) != 1)} to {shown(queue)}[/dim]")


@click.command()
@click.argument("queue")
@click.option("-n", "--max-messages", default=1, show_default=True, help="How many at most.")
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


@click.command()
@click.argument("queue")
@click.option("-n", default=10, show_default=True, help="How many.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@pass_state
def peek(state: State, queue: str, n: int, as_json: bool) -> None:
    """Show visible messages of QUEUE without leasing them."""
    show_messages(state.client.peek(queue, n), as_json=as_json, receipts=False)


def show_messages(messages: Sequence[Message], *, as_json: bool, receipts: bool) -> None:
    """A table on a terminal, or JSON lines; "no messages" on stderr."""
    if as_json:
        for m in messages:
            click.echo(message_json(m))
    elif messages:
        out().print(message_table(messages, receipts=receipts))
    else:
        err().print("[dim]no messages[/dim]")


@click.command()
@click.argument("queue")
@click.argument("receipts", nargs=-1, required=True, metavar="RECEIPT...")
@pass_state
def delete(state: State, queue: str, receipts: tuple[str, ...]) -> None:
    """Delete received messages of QUEUE by receipt."""
    if len(receipts) == 1:  # one receipt: a refusal is the command's error, with its message
        deleted = state.client.delete(queue, receipts[0])
        out().print(f"{'deleted' if deleted else 'already gone'} {shown(receipts[0])}")
        return
    refused = 0
    for r in state.client.delete_batch(queue, receipts):
        if r.error:
            refused += 1
            err().print(f"[red]refused ({shown(r.error)})[/red] {shown(r.receipt)}")
        else:
            out().print(f"{'deleted' if r.deleted else 'already gone'} {shown(r.receipt)}")
    if refused:
        fail(f"{refused} of {len(receipts)} receipts refused")


COMMANDS = (send, receive, peek, delete)
