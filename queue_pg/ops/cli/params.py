"""What the command line accepts: durations, message bodies, attributes and the queue settings
as options (their defaults and ranges are the server's: ``queue-pg create`` shows them)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import click

from queue_pg.ops.display import NEVER

__all__ = ["SETTING_OPTIONS", "Duration", "given", "parse_attrs", "parse_body", "settings_options"]

F = TypeVar("F", bound=Callable[..., Any])

#: The first characters of a JSON text that is not a bare word: such a body must parse.
_JSON_START = re.compile(r'\s*[\[{"0-9-]')


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


def parse_body(text: str, what: str, *, string: bool = False) -> Any:
    """A message body from the command line: JSON (``'{"a": 1}'``, ``42``, ``true``), or any
    other word as a string (``hello``). Text that starts like JSON (``{ [ " - 0-9``) must be
    JSON, so a typo is an error rather than a string; ``string`` takes the text as is."""
    if string:
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if _JSON_START.match(text) or not text.strip():
            raise click.BadParameter(f"{what} is not JSON: {exc}", param_hint="BODY") from None
        return text


def parse_attrs(pairs: Sequence[str]) -> dict[str, str] | None:
    """``--attr key=value`` pairs as a dict (None when there are none)."""
    attrs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--attr")
        attrs[key] = value
    return attrs or None


#: The queue settings as options: (name, type, help). The names are create_queue's parameters.
SETTING_OPTIONS: tuple[tuple[str, Any, str], ...] = (
    ("visibility_timeout", Duration(), "Lease a receive gives."),
    ("message_ttl", Duration(never_ok=True), "Age after which a message is dropped, or 'never'."),
    ("delay", Duration(), "Initial invisibility of a new message."),
    ("max_message_size", int, "Body size limit in bytes."),
    ("receive_wait", Duration(), "Default long-poll wait of a receive."),
    ("max_lease", Duration(), "No lease reaches past this after its receive."),
    ("dead_letter_queue", str, "Where messages go after --max-receive-count receives."),
    ("max_receive_count", int, "Receives before a message is dead-lettered."),
    ("in_flight_limit", int, "Cap on received-not-deleted messages."),
    ("history", bool, "Keep a row per finished message."),
    ("history_retention", Duration(), "How long history rows are kept."),
    ("fifo", bool, "FIFO queue: each send names a group, delivered in order (set at create)."),
    ("fair", bool, "Serve tenants (groups) with few messages in flight first."),
    ("content_dedup", bool, "Take a send's dedup id from its body's SHA-256."),
    ("dedup_window", Duration(), "How long a dedup id is remembered."),
    ("lease_durability", click.Choice(["durable", "relaxed"]),
     "relaxed: a receive's commit does not wait for the WAL flush (docs/guarantees.md)."),
)


def settings_options(*, alter: bool) -> Callable[[F], F]:
    """The queue settings as options (create and alter); unset options are not sent, so the
    server's defaults (create) or the queue's values (alter) stand."""
    options = []
    for name, kind, text in SETTING_OPTIONS:
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            options.append(click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=text))
        else:
            metavar = "QUEUE" if name == "dead_letter_queue" else None
            options.append(click.option(flag, name, type=kind, metavar=metavar, help=text))
    if alter:
        options.append(click.option("--clear", "clear", multiple=True, metavar="SETTING",
                                    help="Set a nullable setting to NULL, e.g. message_ttl."))

    def decorate(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def given(settings: dict[str, Any]) -> dict[str, Any]:
    """The options the user gave; ``--message-ttl never`` becomes None (NULL: never)."""
    return {k: (None if v == NEVER else v) for k, v in settings.items() if v is not None}
