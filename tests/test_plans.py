"""The plans the hot paths run with, when the table's statistics are missing or out of date.

A queue's statistics are always out of date: ``visible_at`` only grows, so the newest messages
lie above the histogram of the last ANALYZE, and without statistics (a new install, autovacuum
off) the planner guesses a handful of rows. Believing the claim range nearly empty, it picks a
bitmap scan and a sort of the whole backlog (67 ms for a receive of 10 among 200,000 messages,
measured). So the claim runs without bitmap scans and sorts (``_claim``, sql/api/30_receive.sql),
and the entry points run every statement with a generic plan (``plan_cache_mode``,
sql/api/60_access.sql; tests/test_access.py checks the setting): a custom plan re-plans, and
re-parses each inlined helper, on every call. These tests look at the plans the server really used (``auto_explain`` of the nested
statements) after the plan cache has settled, with no statistics and a 200,000-message backlog.
"""
from __future__ import annotations

import re
from collections.abc import Callable

import psycopg
import pytest

import queue_pg

BACKLOG = 200_000


def _plans(conn: psycopg.Connection, run: Callable[[], object]) -> list[str]:
    """The plans of every statement ``run`` had our functions run, as auto_explain reported
    them (notices), after 8 runs to let the session's plan cache settle."""
    for _ in range(8):
        run()
    notes: list[str] = []
    handler = lambda d: notes.append(d.message_primary or "")  # noqa: E731
    conn.add_notice_handler(handler)
    conn.execute("SET auto_explain.log_min_duration = 0")
    try:
        run()
    finally:
        conn.execute("SET auto_explain.log_min_duration = -1")
        conn.remove_notice_handler(handler)
    return notes


def _scans_of_messages(plan: str) -> list[tuple[str, str]]:
    """(kind, " using <index>" or "") of every scan of the messages table in ``plan``."""
    return re.findall(r"(Seq Scan|Bitmap Heap Scan|Index Scan|Index Only Scan)( using \w+)? on messages\b",
                      plan)


@pytest.fixture
def explaining(clean: str) -> psycopg.Connection:
    conn = psycopg.connect(clean, autocommit=True)
    conn.execute("LOAD 'auto_explain'")
    for setting, value in [("log_nested_statements", "on"), ("log_analyze", "off"),
                           ("log_level", "notice"), ("log_min_duration", "-1")]:
        conn.execute(f"SET auto_explain.{setting} = {value}")
    conn.execute("SET client_min_messages = notice")
    return conn


def test_hot_paths_never_scan_the_backlog(client: queue_pg.Client, conn: psycopg.Connection,
                                          explaining: psycopg.Connection) -> None:
    client.create_queue("jobs")
    # no statistics yet (a new install, or autovacuum off), and a backlog of 200,000: the
    # planner's guess for the claim range is then a handful of rows
    conn.execute("DELETE FROM pg_statistic WHERE starelid = 'queue_pg.messages'::regclass")
    conn.execute(
        "INSERT INTO queue_pg.messages (queue_id, visible_at, enqueued_at, body)"
        " SELECT q.id, now() - interval '1 minute' + g * interval '1 microsecond', now(), to_jsonb(g)"
        " FROM queue_pg.queues q, generate_series(1, %s) g WHERE q.name = 'jobs'", [BACKLOG])
    conn.commit()
    receipts = [m.receipt for m in client.receive("jobs", 10)]

    def cycle() -> None:  # receive a batch, deleting the previous one in the same call
        nonlocal receipts
        rows = explaining.execute(
            "SELECT receipt FROM queue_pg._receive('jobs', 10, NULL, NULL, false, %s)", [receipts]
        ).fetchall()
        receipts = [r[0] for r in rows]
        assert len(receipts) == 10

    cases = {
        "receive(delete=)": cycle,
        "receive": lambda: explaining.execute("SELECT count(*) FROM queue_pg.receive('jobs', 10)"),
        "send": lambda: explaining.execute("SELECT queue_pg.send('jobs', '1')"),
        "send_batch": lambda: explaining.execute(
            "SELECT count(*) FROM queue_pg.send_batch('jobs', ARRAY['1', '2']::jsonb[])"),
    }
    for name, run in cases.items():
        plans = _plans(explaining, run)
        text = "\n".join(plans)
        assert plans, name
        scans = _scans_of_messages(text)
        assert ("Seq Scan", "") not in scans, f"{name}: {text}"
        if name.startswith("receive"):
            # the claim walks the claim index in order: no sort of the backlog
            claim = next(p for p in plans if "FOR UPDATE SKIP LOCKED" in p)
            assert "Index Scan using messages_claim on messages" in claim, claim
            assert "Sort" not in claim, claim
        if name == "receive(delete=)":
            assert ("Index Scan", " using messages_pkey") in scans, text


def test_hot_paths_call_no_uninlined_sql_function(clean: str) -> None:
    """A sql function PostgreSQL does not inline (a body with a subquery, an INSERT or an
    UPDATE) is planned again at every call (a history INSERT over the partitions: 333 µs a
    delete_message); plpgsql keeps its plans. Inlined ones are not calls, so the functions a
    transaction called (``pg_stat_xact_user_functions``) must all be plpgsql."""
    with psycopg.connect(clean, autocommit=True) as reg, psycopg.connect(clean) as conn:
        me = reg.execute("SELECT queue_pg.register_consumer('plans')").fetchone()[0]
        conn.execute("SELECT queue_pg.create_queue('hot', dead_letter_queue => NULL)")
        conn.commit()
        conn.execute("SET track_functions = 'all'")

        def receipts(n: int, **kw: object) -> list[str]:
            args = ", ".join(f"{k} => %({k})s" for k in kw)
            rows = conn.execute(f"SELECT receipt FROM queue_pg.receive('hot', {n}, 30"
                                f"{', ' if args else ''}{args})", kw).fetchall()
            return [r[0] for r in rows]

        conn.execute("SELECT queue_pg.send('hot', '{\"a\": 1}', attributes => '{\"type\": \"t\"}')")
        conn.execute("SELECT count(*) FROM queue_pg.send_batch('hot', array['1', '2', '3', '4']::jsonb[])")
        first = receipts(2, consumer=me)
        rest = receipts(3, consumer=me, delete=first)
        conn.execute("SELECT queue_pg.change_visibility('hot', %s, 60)", [rest[0]])
        conn.execute("SELECT queue_pg.delete_message('hot', %s)", [rest[0]])
        conn.execute("SELECT count(*) FROM queue_pg.delete_batch('hot', %s)", [rest[1:]])
        called = conn.execute(
            "SELECT f.funcname, l.lanname FROM pg_stat_xact_user_functions f"
            " JOIN pg_proc p ON p.oid = f.funcid JOIN pg_language l ON l.oid = p.prolang"
            " WHERE f.schemaname = 'queue_pg'"
            # constants (_max_ttl()): folded into the plan when it is made, not called after
            " AND NOT (p.provolatile = 'i' AND p.pronargs = 0)").fetchall()
        conn.rollback()
    names = {name for name, _ in called}
    assert {"_receive", "_claim", "_delete_receipts", "_history", "_consumer_on"} <= names, names
    assert [name for name, lang in called if lang != "plpgsql"] == []
