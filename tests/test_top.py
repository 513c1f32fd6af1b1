"""``queue-pg top`` driven by Textual's Pilot against a real database under a running load:
sort (key and header click), select (detail pane), resize, rates, and a screenshot.

Set QUEUE_PG_SCREENSHOTS=<folder> to keep the screenshot (docs/img/top.svg comes from here).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("textual")
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from queue_pg import Client
from queue_pg.aio import AsyncClient
from queue_pg.ops.top import COLUMNS, WIDE, TopApp
from tests.surface_load import running_load

QUEUES = ("orders", "emails")


async def until(pilot: Pilot[None], ready: Callable[[], bool], what: str) -> None:
    """Let the app run until ``ready()`` (a liveness deadline, not a timing assertion)."""
    for _ in range(300):
        if ready():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"top never showed {what}")


def column(app: TopApp, key: str) -> list[str]:
    table = app.query_one("#queues", DataTable)
    index = [c.key for c in COLUMNS].index(key)
    return [str(table.get_row_at(i)[index]) for i in range(table.row_count)]


def count(text: str) -> float:
    return float("-inf") if text == "-" else float(text)


def detail(app: TopApp, table: str) -> list[list[str]]:
    t = app.query_one(f"#{table}", DataTable)
    return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]


@pytest.mark.slow
async def test_top_under_load(clean: str, tmp_path: Path) -> None:
    with running_load(clean, QUEUES):
        async with AsyncClient(clean, sweep_interval=None, max_size=2) as client:
            app = TopApp(client, window=600, interval=0.5)
            async with app.run_test(size=(WIDE + 20, 45)) as pilot:
                await until(pilot, lambda: len(app.rows) == 3, "every queue")
                assert column(app, "queue") == ["dlq", "emails", "orders"]
                assert app.screen.has_class("-wide")

                # rates appear from the second read on, from the counters' growth
                await until(pilot, lambda: all(count(v) > 0 for v in column(app, "send")[1:]),
                            "send rates")
                assert column(app, "timeout") == ["30s"] * 3
                await until(pilot, lambda: all(v != "-" for v in column(app, "advice")[1:]),
                            "the advice")

                # sort: s moves to the next column (largest first), r reverses
                await pilot.press("s")
                assert app.sort_key == "visible" and app.sort_reverse
                shown = [count(v) for v in column(app, "visible")]
                assert shown == sorted(shown, reverse=True)
                await pilot.press("r")
                shown = [count(v) for v in column(app, "visible")]
                assert shown == sorted(shown)

                # a click on a header sorts by it; a second click reverses
                table = app.query_one("#queues", DataTable)
                x = sum(c.get_render_width(table) for c in list(table.columns.values())[:4]) + 1
                await pilot.click("#queues", offset=(x, 0))
                await pilot.pause()
                assert app.sort_key == "dead_lettered" and app.sort_reverse
                await pilot.click("#queues", offset=(x, 0))
                await pilot.pause()
                assert app.sort_key == "dead_lettered" and not app.sort_reverse

                # back to names; select orders with the arrows: the detail pane follows
                while app.sort_key != "queue":
                    await pilot.press("s")
                await pilot.press("down", "down")
                await until(pilot, lambda: app.detail_of == "orders", "the detail of orders")
                summary = str(app.query_one("#summary", Static).render())
                assert "orders" in summary and "advised" in summary
                await until(pilot, lambda: len(detail(app, "in_flight")) > 0, "in-flight messages")
                assert {row[1] for row in detail(app, "in_flight")} <= {"email", "resize"}
                await until(pilot, lambda: len(detail(app, "dead_letters")) > 0, "dead letters")
                assert all(row[1:3] == ["dlq", "orders"] and row[4] == "bad input"
                           for row in detail(app, "dead_letters"))
                await until(pilot, lambda: {r[0] for r in detail(app, "times")}
                            == {"(all)", "email", "resize"}, "processing times per type")
                saved = app.save_screenshot("top.svg", str(tmp_path))
                assert "orders" in Path(saved).read_text()
                keep = os.environ.get("QUEUE_PG_SCREENSHOTS")
                if keep:
                    shutil.copy(saved, Path(keep) / "top.svg")

                # the selection survives refreshes and re-sorting
                await pilot.press("s", "r")
                await pilot.pause(1.2)
                assert app.selected == "orders"

                # narrow terminal: the detail pane goes under the table; wide again: beside it
                await pilot.resize_terminal(120, 40)
                await until(pilot, lambda: not app.screen.has_class("-wide"), "the narrow layout")
                await pilot.pause()
                queues, pane = app.query_one("#queues").region, app.query_one("#detail").region
                assert pane.y >= queues.bottom and pane.width == 120
                await pilot.resize_terminal(WIDE + 30, 40)
                await until(pilot, lambda: app.screen.has_class("-wide"), "the wide layout")
                await pilot.pause()
                queues, pane = app.query_one("#queues").region, app.query_one("#detail").region
                assert pane.x >= queues.right and pane.y == queues.y

                await pilot.press("q")


HOSTILE = "[/] [bold]x\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil"


async def test_hostile_strings_show_as_plain_text(client: Client, clean: str) -> None:
    """A producer's type and a consumer's dead-letter reason holding markup and terminal
    escapes: top shows them as the characters they are, and never dies of them."""
    client.create_queue("hq-dlq")
    client.create_queue("hq", dead_letter_queue="hq-dlq", max_receive_count=5)
    client.send("hq", {"n": 1}, attributes={"type": HOSTILE})
    client.send("hq", {"n": 2}, attributes={"type": "[/]"})
    got = client.receive("hq", max_messages=2, visibility_timeout=600)
    assert len(got) == 2
    dead = next(m for m in got if m.body == {"n": 2})
    assert client.dead_letter("hq", dead.receipt or "", reason=HOSTILE)
    async with AsyncClient(clean, sweep_interval=None, max_size=2) as aclient:
        app = TopApp(aclient, window=600, interval=0.5)
        async with app.run_test(size=(WIDE + 20, 45)) as pilot:
            await until(pilot, lambda: app.detail_of == "hq", "the detail of hq")
            await until(pilot, lambda: len(detail(app, "in_flight")) == 1
                        and len(detail(app, "dead_letters")) == 1, "the hostile rows")
            for _ in range(3):  # refreshes render the rows again
                await pilot.pause(0.6)
            escaped = "[/] [bold]x\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202eevil"
            assert detail(app, "in_flight")[0][1] == escaped
            assert detail(app, "dead_letters")[0][4] == escaped
            screen = app.export_screenshot()
            assert "\x1b" not in screen and "\x9b" not in screen and "\u202e" not in screen
            assert "[/] [bold]x" in screen.replace("&#160;", " ")
            await pilot.press("q")
