"""How queues, stats and messages look on a terminal: rich tables and compact values, shared by
the ``queue-pg`` commands and ``queue-pg demo``."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from queue_pg.plain import json_text, plain
from queue_pg.types import Message, QueueConfig, QueueStats

if TYPE_CHECKING:
    from queue_pg.advice import QueueHealth

__all__ = [
    "NEVER",
    "err",
    "fmt_age",
    "fmt_count",
    "fmt_json",
    "fmt_seconds",
    "fmt_time",
    "health_table",
    "message_json",
    "message_table",
    "out",
    "queue_table",
    "settings_rows",
    "settings_table",
    "shown",
    "stats_table",
    "text",
]

#: How a NULL ``message_ttl`` (no expiry) is written, on screen and on the command line.
NEVER = "never"


def out() -> Console:
    """stdout; when it is not a terminal, wide enough that tables are not squeezed to 80."""
    wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
    return Console(highlight=False, width=wide)


def err() -> Console:
    """stderr, for what is said about a command rather than its output."""
    return Console(stderr=True, highlight=False)


def text(value: object, **kwargs: object) -> Text:
    """A string shown as the characters it holds: control characters escaped (:func:`plain`),
    and a ``Text``, which Rich and Textual never read as markup (``[/]`` is three characters).
    Every string a producer or consumer chose goes on screen through here."""
    return Text(plain(value), **kwargs)  # type: ignore[arg-type]


def shown(value: object) -> str:
    """:func:`text` for a string that goes inside Rich markup: escaped twice over."""
    return escape(plain(value))


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


def fmt_count(value: int | None) -> str:
    """A count in at most 5 characters, like top: 1234, 12.3k, 456k, 7.8M; None -> '-'."""
    if value is None:
        return "-"
    if abs(value) < 10**4:
        return str(value)
    for unit, size in (("k", 10**3), ("M", 10**6), ("G", 10**9), ("T", 10**12)):
        scaled = value / size
        text = f"{scaled:.1f}" if abs(scaled) < 99.95 else f"{scaled:.0f}"
        if abs(float(text)) < 1000:
            return text + unit
    return str(value)


def fmt_json(value: object) -> str:
    """JSON as typed at a shell: no ASCII escapes but for control characters (C1 and
    bidirectional overrides too, which json leaves raw); datetimes as text."""
    return json_text(json.dumps(value, ensure_ascii=False, default=str))


def fmt_time(value: datetime | None) -> str:
    """Local time to the millisecond."""
    return "-" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def settings_rows(q: QueueConfig) -> list[tuple[str, str]]:
    """Each setting of ``q`` by name, as shown."""
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
        ("fifo", "yes" if q.fifo else "no"),
        ("fair", "yes" if q.fair else "no"),
        ("content_dedup", "on" if q.content_dedup else "off"),
        ("dedup_window", fmt_seconds(q.dedup_window)),
        ("lease_durability", q.lease_durability),
    ]


def settings_table(q: QueueConfig) -> Table:
    """One queue's settings, one per line."""
    table = Table(title=text(f"queue {q.name}"), title_justify="left")
    table.add_column("setting")
    table.add_column("value")
    for name, value in settings_rows(q):
        table.add_row(name, text(value))
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
        "content_dedup": "content\ndedup",
        "dedup_window": "dedup\nwindow",
        "lease_durability": "lease\ndurability",
    }
    table = Table()
    table.add_column("queue", no_wrap=True)
    for name, _ in settings_rows(queues[0]):
        table.add_column(short.get(name, name), justify="right")
    for q in queues:
        table.add_row(text(q.name), *(text(v) for _, v in settings_rows(q)))
    return table


#: Counts up to this are exact in queue_stats (the SQL's _exact_up_to()); past it, an estimate.
EXACT_UP_TO = 1000


def fmt_stat(value: int | None, approximate: bool) -> str:
    """A count of queue_stats as fmt_count, marked "~" when it is an estimate (approximate row,
    past EXACT_UP_TO)."""
    text = fmt_count(value)
    return "~" + text if approximate and value is not None and value > EXACT_UP_TO else text


def stats_table(rows: Iterable[QueueStats], title: str | None = None) -> Table:
    """One line of counts per queue."""
    table = Table(title=title, title_justify="left")
    table.add_column("queue", no_wrap=True)
    for header in ("visible", "in flight", "delayed", "dead-\nlettered", "oldest\nvisible",
                   "stale\nreceipts", "lease\nexpiries"):
        table.add_column(header, justify="right")
    for s in rows:
        a = s.approximate
        table.add_row(
            text(s.queue), fmt_stat(s.visible, a), fmt_stat(s.in_flight, a),
            fmt_stat(s.delayed, a), fmt_stat(s.dead_lettered, a), fmt_age(s.oldest_visible_age),
            str(s.stale_receipts), str(s.lease_expiries),
        )
    return table


#: ``health_table`` flows: option value -> (column suffix, what the title calls it).
FLOWS = {"1m": ("_1m", "last minute"), "1h": ("_1h", "last hour"), "total": ("", "since created")}


def health_table(rows: Iterable[QueueHealth], flows: str = "1m") -> Table:
    """One line per queue: its counts and its flows over ``flows`` (see FLOWS), within 80
    columns for names up to 12 characters (counts in 5 characters: fmt_count)."""
    suffix, span = FLOWS[flows]
    table = Table(title=f"flows {span} (-: no sample that old yet; see docs/monitoring.md)",
                  title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=0)
    table.add_column("queue", overflow="fold", min_width=8)
    for header in ("visible", "in\nflight", "delayed", "in\nDLQ", "oldest", "sent", "recv",
                   "del", "lease\nexpiry", "stale"):
        table.add_column(header, justify="right", no_wrap=True)
    flow = ("sent", "received", "deleted", "lease_expiries", "stale_receipts")
    for s in rows:
        values = [getattr(s, name + suffix) for name in flow]
        a = s.approximate
        table.add_row(
            text(s.queue), fmt_stat(s.visible, a), fmt_stat(s.in_flight, a),
            fmt_stat(s.delayed, a), fmt_stat(s.dead_lettered, a),
            fmt_age(s.oldest_visible_age), *(fmt_count(v) for v in values),
        )
    return table


def message_table(messages: Sequence[Message], *, receipts: bool) -> Table:
    """Received messages (with receipt and lease end) or peeked ones (with enqueue time)."""
    table = Table()
    table.add_column("id", justify="right", no_wrap=True)
    cells: list[str | Text]
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
            cells.append(text(m.receipt or ""))
        cells += [
            str(m.receive_count),
            fmt_time(m.visible_until if receipts else m.enqueued_at),
            text(fmt_json(m.attributes)) if m.attributes else "",
            text(fmt_json(m.body)),
        ]
        table.add_row(*cells)
    return table


def message_json(m: Message) -> str:
    """One message as one JSON line, for scripts."""
    return fmt_json({
        "id": m.id, "queue": m.queue, "receipt": m.receipt, "receive_count": m.receive_count,
        "body": m.body, "attributes": m.attributes, "enqueued_at": m.enqueued_at,
        "visible_until": m.visible_until, "expires_at": m.expires_at,
    })
