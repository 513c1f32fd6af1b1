"""``queue-pg top``: every queue live in the terminal, refreshed each second (Textual).

One row per queue from ``queue_pg.queue_overview`` (one query per refresh, whatever the number of
queues); the detail pane of the highlighted queue reads its in-flight messages, latest dead
letters and processing times per type. Every figure is SQL's, except the per-second rates: SQL
keeps counters, and the rate between two refreshes is the counters' difference over the two
reads' database clocks (as Prometheus' rate() does with the same counters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Header, Static

from queue_pg import advice
from queue_pg._ops import Call
from queue_pg.advice import DeadLetter, InFlight, ProcessingTimes, QueueOverview
from queue_pg.aio import AsyncClient
from queue_pg.errors import QueueError
from queue_pg.ops.display import fmt_age, fmt_seconds, text
from queue_pg.plain import plain

__all__ = ["COLUMNS", "TopApp", "rate"]

#: Below this many columns the detail pane goes under the queue table instead of beside it.
WIDE = 190

#: How many in-flight messages and dead letters the detail pane lists.
DETAIL_ROWS = 20


@dataclass(frozen=True)
class Column:
    """A column of the queue table: its key, header, the value it sorts by, and how it shows."""

    key: str
    label: str
    value: Callable[[QueueOverview, QueueOverview | None], Any]
    show: Callable[[Any], str] = str


def rate(now: QueueOverview, before: QueueOverview | None, counter: str) -> float | None:
    """Per second of ``counter`` between two reads of the same queue (None on the first read)."""
    if before is None:
        return None
    seconds = (now.at - before.at).total_seconds()
    if seconds <= 0:
        return None
    grown: int = getattr(now, counter) - getattr(before, counter)
    return max(grown, 0) / seconds


def _rate_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _advice_text(value: float | None) -> str:
    return fmt_seconds(value)


COLUMNS: tuple[Column, ...] = (
    Column("queue", "queue", lambda r, _: r.queue),
    Column("visible", "visible", lambda r, _: r.visible),
    Column("in_flight", "in flight", lambda r, _: r.in_flight),
    Column("delayed", "delayed", lambda r, _: r.delayed),
    Column("dead_lettered", "dead", lambda r, _: r.dead_lettered),
    Column("oldest", "oldest", lambda r, _: r.oldest_visible_age, fmt_age),
    Column("send", "send/s", lambda r, b: rate(r, b, "sent"), _rate_text),
    Column("receive", "recv/s", lambda r, b: rate(r, b, "received"), _rate_text),
    Column("delete", "del/s", lambda r, b: rate(r, b, "deleted"), _rate_text),
    Column("expiries", "expiries", lambda r, _: r.lease_expiries),
    Column("stale", "stale", lambda r, _: r.stale_receipts),
    Column("timeout", "timeout", lambda r, _: r.visibility_timeout, fmt_seconds),
    Column("advice", "advice", lambda r, _: r.recommended_timeout, _advice_text),
)


def _sort_key(value: Any) -> tuple[int, Any]:
    """None sorts below every value, whichever the direction."""
    return (0, 0) if value is None else (1, value)


def _latest_dead_letters(queue: str) -> Call[list[DeadLetter]]:
    """The newest dead letters that came from ``queue`` or sit in it (when it is a DLQ)."""
    return Call(
        "select * from queue_pg.dead_letters where dead_letter_queue = %(queue)s"
        " or source_queue = %(queue)s order by id desc limit %(n)s",
        {"queue": queue, "n": DETAIL_ROWS},
        advice._rows(DeadLetter),
    )


def _soonest_in_flight(queue: str) -> Call[list[InFlight]]:
    """The leases of ``queue`` that end soonest."""
    return Call(
        "select * from queue_pg.in_flight_messages where queue = %(queue)s"
        " order by visible_until limit %(n)s",
        {"queue": queue, "n": DETAIL_ROWS},
        advice._rows(InFlight),
    )


class TopApp(App[None]):
    """The live view. ``window``: seconds of finished messages the advice and times describe."""

    TITLE = "queue-pg top"
    # the detail pane beside the table on a wide terminal (class -wide), under it on a narrow one
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE, "-wide")]  # noqa: RUF012
    CSS = """
    Screen { layout: vertical; }
    Screen.-wide { layout: horizontal; }
    #queues { height: 1fr; min-height: 5; }
    #detail { height: 1fr; border-top: solid $accent; }
    Screen.-wide #detail { width: 74; border-top: none; border-left: solid $accent; }
    #detail DataTable { height: auto; max-height: 12; }
    .title { text-style: bold; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "sort_next", "Sort by next column"),
        Binding("r", "reverse", "Reverse order"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, client: AsyncClient, *, window: float = 600, interval: float = 1.0) -> None:
        super().__init__()
        self.client = client
        self.window = window
        self.interval = interval
        self.sort_key = "queue"
        self.sort_reverse = False
        self.rows: dict[str, QueueOverview] = {}
        self.previous: dict[str, QueueOverview] = {}
        self.selected: str | None = None
        self.detail_of: str | None = None
        self.replica: str | None = None  # how stale a hot standby is (None on a primary)
        self._busy = False

    def compose(self) -> ComposeResult:
        yield Header(show_clock=True)
        yield DataTable(id="queues", cursor_type="row", zebra_stripes=True)
        with Vertical(id="detail"):
            yield Static("", id="summary")
            yield Static("in flight (leases ending soonest)", classes="title")
            yield DataTable(id="in_flight", show_cursor=False)
            yield Static("latest dead letters", classes="title")
            yield DataTable(id="dead_letters", show_cursor=False)
            yield Static(f"processing and waiting times, last {fmt_seconds(self.window)}",
                         classes="title")
            yield DataTable(id="times", show_cursor=False)
        yield Footer()

    async def on_mount(self) -> None:
        queues = self.query_one("#queues", DataTable)
        for c in COLUMNS:
            queues.add_column(c.label, key=c.key)
        self.query_one("#in_flight", DataTable).add_columns(
            "id", "type", "receives", "leased for", "ends in", "expiries")
        self.query_one("#dead_letters", DataTable).add_columns(
            "id", "dlq", "from", "receives", "reason / last error")
        self.query_one("#times", DataTable).add_columns(
            "type", "done", "p50", "p95", "p99", "max", "wait p50", "wait p99")
        await self.refresh_data()
        self.set_interval(self.interval, self.refresh_data)

    # --- data -----------------------------------------------------------------------------------

    async def refresh_data(self) -> None:
        """One read of every queue, then the detail of the highlighted one (skipped while the
        previous refresh still runs, so a slow database never piles reads up)."""
        if self._busy:
            return
        self._busy = True
        try:
            rows, replica = await self.client.queue_overview_replica(self.window)
            self.replica = replica.line()
            self.previous = self.rows
            self.rows = {r.queue: r for r in rows}
            self._fill_queues()
            await self._fill_detail()
        except QueueError as exc:  # the server gone, a grant revoked: say so, try again next time
            self.sub_title = plain(f"cannot read: {exc}".splitlines()[0])
        finally:
            self._busy = False

    def ordered(self) -> list[QueueOverview]:
        """The rows in the current sort order."""
        column = next(c for c in COLUMNS if c.key == self.sort_key)
        return sorted(
            self.rows.values(),
            key=lambda r: (_sort_key(column.value(r, self.previous.get(r.queue))), r.queue),
            reverse=self.sort_reverse,
        )

    def _fill_queues(self) -> None:
        table = self.query_one("#queues", DataTable)
        keep = self.selected
        table.clear()
        for r in self.ordered():
            before = self.previous.get(r.queue)
            cells: list[Text] = []
            for c in COLUMNS:
                shown = c.show(c.value(r, before))
                cells.append(text(shown) if c.key == "queue" else Text(shown, justify="right"))
            table.add_row(*cells, key=r.queue)
        if keep in self.rows:
            table.move_cursor(row=table.get_row_index(keep))
        self.selected = self._highlighted()
        arrow = "↓" if self.sort_reverse else "↑"
        label = next(c.label for c in COLUMNS if c.key == self.sort_key)
        parts = [f"{len(self.rows)} queues", f"sorted by {label} {arrow}", self.replica]
        self.sub_title = " · ".join(p for p in parts if p)

    def _highlighted(self) -> str | None:
        table = self.query_one("#queues", DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return None if key.value is None else str(key.value)

    async def _fill_detail(self) -> None:
        queue = self.selected
        self.detail_of = queue
        summary = self.query_one("#summary", Static)
        tables = [self.query_one(f"#{n}", DataTable)
                  for n in ("in_flight", "dead_letters", "times")]
        if queue is None or queue not in self.rows:
            summary.update("no queue")
            for t in tables:
                t.clear()
            return
        r = self.rows[queue]
        flying = await self.client._run(_soonest_in_flight(queue), None)
        dead = await self.client._run(_latest_dead_letters(queue), None)
        times = await self.client.processing_times(
            queue, since=r.at - timedelta(seconds=self.window), until=r.at)
        summary.update(self._summary(r))
        self._fill_in_flight(tables[0], r, flying)
        self._fill_dead(tables[1], dead)
        self._fill_times(tables[2], times)

    @staticmethod
    def _summary(r: QueueOverview) -> Text:
        def flow(suffix: str, span: str) -> str:
            values = [getattr(r, f"{n}_{suffix}") for n in
                      ("sent", "received", "deleted", "lease_expiries", "stale_receipts")]
            if values[0] is None:
                return f"{span}: no sample that old yet (sweep takes them)"
            sent, received, deleted, expiries, stale = values
            return (f"{span}: sent {sent} · received {received} · deleted {deleted} · "
                    f"expiries {expiries} · stale {stale}")

        summary = text(r.queue, style="bold")
        if r.approximate:
            summary.append(" (counts past 1,000: estimates)", style="dim")
        return summary + Text(
            f"\ntimeout {fmt_seconds(r.visibility_timeout)} · advised "
            f"{fmt_seconds(r.recommended_timeout)} · heartbeat {fmt_age(r.heartbeat_interval)}"
            f" · confidence {r.confidence} ({r.samples or 0} samples)\n"
            f"{flow('1m', 'last minute')}\n{flow('1h', 'last hour')}"
        )

    @staticmethod
    def _fill_in_flight(table: DataTable[Any], r: QueueOverview, rows: Sequence[InFlight]) -> None:
        table.clear()
        for m in rows:
            table.add_row(str(m.id), text(m.type or "-"), str(m.receive_count),
                          fmt_age((r.at - m.leased_at).total_seconds()),
                          fmt_age(max((m.visible_until - r.at).total_seconds(), 0)),
                          str(m.lease_expiries))

    @staticmethod
    def _fill_dead(table: DataTable[Any], rows: Sequence[DeadLetter]) -> None:
        table.clear()
        for d in rows:
            table.add_row(str(d.id), text(d.dead_letter_queue), text(d.source_queue or "-"),
                          str(d.receive_count), text(d.reason or d.last_error or "-"))

    @staticmethod
    def _fill_times(table: DataTable[Any], rows: Sequence[ProcessingTimes]) -> None:
        table.clear()
        for p in rows:
            table.add_row(text("(all)" if p.scope == "queue" else (p.type or "(none)")),
                          str(p.messages),
                          *(fmt_age(v) for v in (p.p50, p.p95, p.p99, p.max, p.wait_p50,
                                                 p.wait_p99)))

    # --- keys and clicks ------------------------------------------------------------------------

    async def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        # a refill of the table moves the cursor through other rows: only where it rests counts
        if event.data_table.id != "queues" or event.row_key.value != self._highlighted():
            return
        self.selected = str(event.row_key.value)
        if self.selected != self.detail_of and not self._busy:
            self._busy = True
            try:
                await self._fill_detail()
            finally:
                self._busy = False

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        if event.data_table.id != "queues":
            return
        key = str(event.column_key.value)
        if key == self.sort_key:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_key, self.sort_reverse = key, key != "queue"
        self._fill_queues()

    def action_sort_next(self) -> None:
        """Sort by the next column (numbers largest first)."""
        keys = [c.key for c in COLUMNS]
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.sort_reverse = self.sort_key != "queue"
        self._fill_queues()

    def action_reverse(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._fill_queues()
