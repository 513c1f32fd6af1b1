"""A hot standby (pg_basebackup -R from a primary of the test's own): what only reads runs there
and says how stale it is; nothing writes there (migrate skips, a write raises ReadOnlyServer)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from queue_pg import Client, ReadOnlyServer, ServerUnavailable
from queue_pg.aio import AsyncClient
from queue_pg.install import migrate
from queue_pg.ops import cli
from queue_pg.ops.dashboard import Dashboard, Request
from tests import standby

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pair() -> Iterator[standby.Pair]:
    why = standby.available()
    if why is not None:
        pytest.skip(why)
    with standby.streaming_pair() as p:
        migrate(p.primary)
        with Client(p.primary, sweep_interval=None) as c:
            c.create_queue("orders")
            for i in range(5):
                c.send("orders", {"i": i})
            got = c.receive("orders", 2)
            c.delete("orders", got[0].receipt or "")
        p.wait_replayed()
        yield p


def _rows(dsn: str, query: str) -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query).fetchall()


def test_views_and_overview_read_on_the_standby_and_say_how_stale(pair: standby.Pair) -> None:
    for view in ("timeout_advice", "processing_times", "in_flight_messages", "dead_letters"):
        _rows(pair.standby, f"SELECT * FROM queue_pg.{view}")
    query = ("SELECT queue, visible, in_flight, delayed, sent, received, deleted"
             " FROM queue_pg.queue_stats")
    (replica,) = _rows(pair.standby, query)
    (primary,) = _rows(pair.primary, query)
    assert replica[:4] == primary[:4] == ("orders", 3, 1, 0)
    # the flow counters live in sequences, which PostgreSQL logs 32 values ahead: a standby
    # reads them up to 32 past the primary's figure (documented in operations.md)
    for on_standby, on_primary in zip(replica[4:], primary[4:], strict=True):
        assert on_primary <= on_standby <= on_primary + 32
    with Client(pair.standby, sweep_interval=None) as c:
        (row,) = [r for r in c.queue_overview() if r.queue == "orders"]
        assert (row.visible, row.in_flight) == (3, 1)
        status = c.replica_status()
        assert status.standby and status.replayed_at is not None
        assert status.replay_age is not None and status.replay_age >= 0
        assert "hot standby" in (status.line() or "")
    with Client(pair.primary, sweep_interval=None) as c:
        status = c.replica_status()
        assert not status.standby and status.replay_age is None and status.line() is None


def test_writes_on_the_standby_raise_read_only_server_and_change_nothing(
    pair: standby.Pair,
) -> None:
    before = _rows(pair.standby, "SELECT id, visible_at FROM queue_pg.messages ORDER BY id")
    with Client(pair.standby) as c:  # sweep_interval on: a receive would sweep
        for write in (lambda: c.send("orders", {"x": 1}), lambda: c.receive("orders"),
                      lambda: c.create_queue("other"), lambda: c.sweep()):
            with pytest.raises(ReadOnlyServer, match="takes no writes") as info:
                write()
            assert "target_session_attrs=read-write" in str(info.value)
            assert isinstance(info.value, ServerUnavailable)
    assert _rows(pair.standby, "SELECT id, visible_at FROM queue_pg.messages ORDER BY id") == before


def test_migrate_on_the_standby_skips(pair: standby.Pair) -> None:
    result = migrate(pair.standby)
    assert result.standby and not result.upgraded and result.after is not None
    with Client(pair.standby, sweep_interval=None) as c:
        assert c.migrate().standby
    out = CliRunner().invoke(cli.main, ["--dsn", pair.standby, "migrate"])
    assert out.exit_code == 0, out.output
    assert "hot standby" in out.stdout and "primary" in out.stdout


def test_cli_stats_reads_the_standby_and_send_fails_clearly(pair: standby.Pair) -> None:
    out = CliRunner().invoke(cli.main, ["--dsn", pair.standby, "stats"])
    assert out.exit_code == 0, out.output
    assert "orders" in out.stdout and "hot standby" in out.stderr
    out = CliRunner().invoke(cli.main, ["--dsn", pair.standby, "send", "orders", "{}"])
    assert out.exit_code != 0
    assert "takes no writes" in out.stderr and "Traceback" not in out.output


def test_metrics_on_the_standby_give_the_replay_age(pair: standby.Pair) -> None:
    pytest.importorskip("prometheus_client")
    from queue_pg.ops.metrics import registry

    with Client(pair.standby, sweep_interval=None) as c:
        families = {m.name: m for m in registry(c).collect()}
    assert families["queue_pg_up"].samples[0].value == 1
    assert any(s.labels.get("queue") == "orders" for s in families["queue_pg_messages"].samples)
    assert families["queue_pg_replica_replay_age_seconds"].samples[0].value >= 0
    with Client(pair.primary, sweep_interval=None) as c:
        names = {m.name for m in registry(c).collect()}
    assert "queue_pg_replica_replay_age_seconds" not in names


def test_dashboard_overview_on_the_standby_says_how_stale(pair: standby.Pair) -> None:
    board = Dashboard(pair.standby)
    try:
        answer = json.loads(board.handle(Request("GET", "api/overview")).body)
    finally:
        board.close()
    assert [s["queue"] for s in answer["stats"]] == ["orders"]
    assert "hot standby" in answer["replica"]


async def test_top_on_the_standby_says_how_stale(pair: standby.Pair) -> None:
    pytest.importorskip("textual")
    from queue_pg.ops.top import TopApp

    async with AsyncClient(pair.standby, sweep_interval=None, max_size=2) as client:
        app = TopApp(client, interval=0.5)
        async with app.run_test(size=(200, 40)) as pilot:
            for _ in range(100):
                if app.rows:
                    break
                await pilot.pause(0.1)
            assert "orders" in app.rows
            assert "hot standby" in app.sub_title
