"""Hostile input: every operation fed bad values gets its named error and changes nothing.

Each case runs through the Python client and, where the protocol can carry the value, as raw
SQL; a snapshot of every table and counter is compared before and after.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from queue_pg import (
    Client,
    InvalidParameter,
    InvalidReceipt,
    MessageTooLarge,
    QueueError,
    QueueNotFound,
)
from queue_pg.errors import translate

Q, OTHER = "hq", "hq-other"
SIZE = 1024  # hq's max_message_size, the smallest allowed


def snapshot(conn: psycopg.Connection) -> tuple[Any, ...]:
    return (
        conn.execute("SELECT * FROM queue_pg.queues ORDER BY id").fetchall(),
        conn.execute("SELECT * FROM queue_pg.messages ORDER BY id").fetchall(),
        conn.execute("SELECT * FROM queue_pg.message_history ORDER BY message_id").fetchall(),
        conn.execute("SELECT * FROM queue_pg.in_flight ORDER BY queue_id").fetchall(),
        conn.execute("SELECT queue, stale_receipts, lease_expiries FROM queue_pg.queue_stats"
                     " ORDER BY queue").fetchall(),
    )


@pytest.fixture
def world(client: Client, conn: psycopg.Connection) -> dict[str, str]:
    client.create_queue(OTHER)
    client.create_queue(Q, max_message_size=SIZE, dead_letter_queue=OTHER, max_receive_count=3,
                        in_flight_limit=100)
    client.send_batch(Q, [1, 2, 3])
    client.send(OTHER, "x")
    mine = client.receive(Q, 1, visibility_timeout=300)[0].receipt
    theirs = client.receive(OTHER, 1, visibility_timeout=300)[0].receipt
    assert mine and theirs
    return {"mine": mine, "theirs": theirs}


def sql(conn: psycopg.Connection, query: str, params: Any = None) -> Callable[[], object]:
    """A raw SQL call whose errors are translated like the client's."""

    def run() -> object:
        with translate():
            return conn.execute(query, params).fetchall()

    return run


def refused(conn: psycopg.Connection, error: type[QueueError], call: Callable[[], object]) -> None:
    before = snapshot(conn)
    with pytest.raises(error):
        call()
    assert snapshot(conn) == before


BAD_SECONDS = [math.nan, math.inf, -math.inf, -1.0, -1e-9, 1e308, 10 * 365 * 86400.0]
BAD_NAMES = ["a'b", "x'; DROP TABLE queue_pg.messages; --", "q;q", "队列", "naïve", "",
             "a" * 81, "a b", "a\"b", "$1", "a\\b", "Ω" * 2000]


def _nested(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


# NUL and lone surrogates (PostgreSQL cannot store them); nesting past 100 arrays and objects and
# numbers past float8's range (no client could read them back)
@pytest.mark.parametrize("body", ["a\x00b", {"k\x00": 1}, ["\x00"], {"k": "\ud800"}, _nested(101),
                                  {"a": _nested(100)}, 10**400, -(10**309), [1, {"k": 2 * 10**308}]])
def test_unusable_json_in_bodies_and_attributes(
    client: Client, conn: psycopg.Connection, world: dict[str, str], body: Any
) -> None:
    refused(conn, InvalidParameter, lambda: client.send(Q, body))
    refused(conn, InvalidParameter, lambda: client.send(Q, 1, attributes={"a": body}))
    refused(conn, InvalidParameter, lambda: client.send_batch(Q, [1, body]))
    refused(conn, InvalidParameter, lambda: client.send_batch(Q, [1, 2], attributes=[None, {"a": body}]))
    refused(conn, InvalidParameter, lambda: client.update(Q, world["mine"], body=body))
    refused(conn, InvalidParameter, lambda: client.update(Q, world["mine"],
                                                          attributes={"a": body}))


def test_invalid_utf8_in_sql_is_refused(conn: psycopg.Connection, world: dict[str, str]) -> None:
    """Bytes that are not UTF-8, sent as text parameters straight through libpq."""
    for query, params in [
        (b"SELECT queue_pg.send('hq', $1::jsonb)", [b'"\xff\xfe"']),
        (b"SELECT queue_pg.send($1, '1')", [b"hq\xc3"]),
        (b"SELECT queue_pg.delete_message('hq', $1)", [b"1.1.1.\xe2\x82"]),
        (b"SELECT queue_pg.create_queue($1)", [b"\xed\xa0\x80"]),  # an encoded surrogate
    ]:
        before = snapshot(conn)
        result = conn.pgconn.exec_params(query, params, [0])
        assert result.error_field(psycopg.pq.DiagnosticField.SQLSTATE) == b"22021", query
        assert snapshot(conn) == before


def test_bodies_at_and_over_the_size_limit(
    client: Client, conn: psycopg.Connection, world: dict[str, str]
) -> None:
    """The size is the body's UTF-8 bytes (a string's own, else its JSON text) plus the
    attributes' JSON text (json.dumps, ensure_ascii=False)."""
    at = "x" * SIZE  # a string body counts its own bytes, not its JSON quoting
    refused(conn, MessageTooLarge, lambda: client.send(Q, at + "x"))
    refused(conn, MessageTooLarge, lambda: client.send_batch(Q, [1, at + "x"]))
    refused(conn, MessageTooLarge, lambda: client.update(Q, world["mine"], body=at + "x"))
    attrs = {"k": "v"}  # '{"k": "v"}': 10 bytes
    short = "x" * (SIZE - 10)
    refused(conn, MessageTooLarge, lambda: client.send(Q, short + "x", attributes=attrs))
    refused(conn, MessageTooLarge,
            lambda: client.send_batch(Q, [1, short + "x"], attributes=[None, attrs]))
    refused(conn, MessageTooLarge, lambda: client.update(Q, world["mine"], body=short + "x",
                                                         attributes=attrs))
    wide = "é" * (SIZE // 2)  # two bytes each in UTF-8
    refused(conn, MessageTooLarge, lambda: client.send(Q, wide + "x"))
    listed = ["x" * (SIZE - 4)]  # '["xx...x"]': a JSON body counts its JSON text
    refused(conn, MessageTooLarge, lambda: client.send(Q, [listed[0] + "x"]))
    for body, attributes in ((at, None), (short, attrs), (wide, None), (listed, None)):
        mid = client.send(Q, body, attributes=attributes)  # exactly at the limit: accepted
        row = conn.execute("SELECT queue_pg._message_size(body, attributes)"
                           " FROM queue_pg.messages WHERE id = %s", [mid]).fetchone()
        assert row == (SIZE,)


@pytest.mark.parametrize("bad", BAD_SECONDS)
def test_bad_durations(
    client: Client, conn: psycopg.Connection, world: dict[str, str], bad: float
) -> None:
    r = world["mine"]
    refused(conn, InvalidParameter, lambda: client.send(Q, 1, delay=bad))
    refused(conn, InvalidParameter, lambda: client.send_batch(Q, [1], delay=bad))
    refused(conn, InvalidParameter, lambda: client.receive(Q, visibility_timeout=bad))
    refused(conn, InvalidParameter, lambda: client.receive(Q, wait=bad))
    refused(conn, InvalidParameter, lambda: client.change_visibility(Q, r, bad))
    refused(conn, InvalidParameter, lambda: client.update(Q, r, visibility_timeout=bad))
    ten_years = bad == 10 * 365 * 86400.0  # a fine ttl and history_retention
    for setting in ("visibility_timeout", "delay", "receive_wait", "max_lease",
                    "history_retention")[: 4 if ten_years else 5]:
        refused(conn, InvalidParameter, lambda s=setting: client.create_queue("new", **{s: bad}))
        refused(conn, InvalidParameter, lambda s=setting: client.alter_queue(Q, **{s: bad}))
    if not ten_years:
        refused(conn, InvalidParameter, lambda: client.send(Q, 1, ttl=bad))
        refused(conn, InvalidParameter, lambda: client.create_queue("new", message_ttl=bad))


@pytest.mark.parametrize("bad", [0, -1, 1001, 2**31, 2**63 - 1, -(2**63)])
def test_bad_counts(
    client: Client, conn: psycopg.Connection, world: dict[str, str], bad: int
) -> None:
    refused(conn, InvalidParameter, lambda: client.receive(Q, bad))
    refused(conn, InvalidParameter, lambda: client.peek(Q, bad))
    refused(conn, InvalidParameter, lambda: client.create_queue("new", max_message_size=bad))
    refused(conn, InvalidParameter, lambda: client.alter_queue(Q, max_receive_count=bad))
    if bad != 1001:  # a fine in_flight_limit and redrive limit
        refused(conn, InvalidParameter, lambda: client.alter_queue(Q, in_flight_limit=bad))
        refused(conn, InvalidParameter, lambda: client.redrive(OTHER, limit=bad))


@pytest.mark.parametrize("name", [*BAD_NAMES, "a\x00b"])
def test_hostile_queue_names(
    client: Client, conn: psycopg.Connection, world: dict[str, str], name: str
) -> None:
    refused(conn, InvalidParameter, lambda: client.create_queue(name))
    missing = InvalidParameter if "\x00" in name else QueueNotFound
    for call in (
        lambda: client.send(name, 1),
        lambda: client.send_batch(name, [1]),
        lambda: client.receive(name),
        lambda: client.peek(name),
        lambda: client.purge(name),
        lambda: client.delete(name, world["mine"]),
        lambda: client.delete_batch(name, [world["mine"]]),
        lambda: client.change_visibility(name, world["mine"], 1),
        lambda: client.update(name, world["mine"], body=1),
        lambda: client.dead_letter(name, world["mine"]),
        lambda: client.drop_queue(name),
        lambda: client.alter_queue(name, delay=1),
        lambda: client.stats(name),
        lambda: client.get_queue(name),
        lambda: client.redrive(name),
        lambda: client.redrive(OTHER, to=name),
    ):
        refused(conn, missing, call)
    if "\x00" not in name:
        refused(conn, InvalidParameter, lambda: client.alter_queue(Q, dead_letter_queue=name))


def _forge(receipt: str) -> list[str]:
    q, m, lease, mac = receipt.split(".")
    return [
        f"{q}.{m}.{lease}.{'0' * 16}",  # wrong MAC
        f"{q}.{m}.{int(lease) + 1}.{mac}",  # a later lease, same MAC
        f"{q}.{int(m) + 1}.{lease}.{mac}",  # another message, same MAC
        f"{q}.{m}.{lease}.{mac.upper()}",
        f"{q}.{m}.{lease}.{mac}0",
        f"{q}.{m}.{lease}",
        f"{q}.{m}.{lease}.{mac}.x",
        f"{q}.{m}.99999999999.{mac}",
        f"{q}.99999999999999999999.{lease}.{mac}",
        f"-{q}.{m}.{lease}.{mac}",
        f" {receipt}",
        f"{receipt}\n",
        receipt.replace(".", ";"),
        "",
        "....",
        "'; DELETE FROM queue_pg.messages; --",
        "1" * 100_000,
        "\u0663.\u0661.\u0661.0123456789abcdef",  # Arabic-Indic digits: not [0-9]
    ]


def test_malformed_forged_and_foreign_receipts(
    client: Client, conn: psycopg.Connection, world: dict[str, str]
) -> None:
    bad = [*_forge(world["mine"]), world["theirs"]]
    for r in bad:
        refused(conn, InvalidReceipt, lambda r=r: client.delete(Q, r))
        refused(conn, InvalidReceipt, lambda r=r: client.change_visibility(Q, r, 1))
        refused(conn, InvalidReceipt, lambda r=r: client.update(Q, r, body=1))
        refused(conn, InvalidReceipt, lambda r=r: client.dead_letter(Q, r))
    before = snapshot(conn)
    results = client.delete_batch(Q, bad)
    assert [x.error for x in results] == ["InvalidReceipt"] * len(bad)
    assert snapshot(conn) == before
    refused(conn, InvalidParameter, lambda: client.delete(Q, "1.1.1.\x00"))
    # SQL NULL receipts
    refused(conn, InvalidReceipt, sql(conn, "SELECT queue_pg.delete_message('hq', NULL)"))
    refused(conn, InvalidReceipt, sql(conn, "SELECT queue_pg.change_visibility('hq', NULL, 1)"))
    before = snapshot(conn)
    rows = conn.execute("SELECT * FROM queue_pg.delete_batch('hq', ARRAY[NULL, 'x'])").fetchall()
    assert [r[2] for r in rows] == ["InvalidReceipt", "InvalidReceipt"]
    assert snapshot(conn) == before


def test_a_receipt_the_clients_encoding_cannot_show_is_only_invalid(
    conn: psycopg.Connection, world: dict[str, str]
) -> None:
    """A receipt is checked as text (its MAC first): characters the session's client encoding
    has no code for (a euro sign under LATIN1) make it invalid, never an encoding error."""
    q, m, lease, mac = world["mine"].split(".")
    forged = [f"{q}.{m}€.{lease}.{mac}", f"{q}.€.€.{mac}", f"{q}.{m}.{lease}.{mac[:-1]}€"]
    before = snapshot(conn)
    conn.execute("SET client_encoding = 'LATIN1'")
    try:
        # the receipts are made in the server: the client could not send them in LATIN1
        rows = conn.execute(
            "SELECT deleted, error FROM queue_pg.delete_batch(%s, ARRAY[convert_from(%s, 'UTF8'),"
            " convert_from(%s, 'UTF8'), convert_from(%s, 'UTF8')])",
            [Q, *(f.encode() for f in forged)]).fetchall()
        assert rows == [(False, "InvalidReceipt")] * 3
    finally:
        conn.execute("RESET client_encoding")
    assert snapshot(conn) == before


def test_batches_with_duplicate_bad_or_no_entries(
    client: Client, conn: psycopg.Connection, world: dict[str, str]
) -> None:
    r = world["mine"]
    refused(conn, InvalidParameter, lambda: client.delete_batch(Q, [r, r]))
    refused(conn, InvalidParameter, lambda: client.delete_batch(Q, ["x", "x"]))
    refused(conn, InvalidParameter, lambda: client.delete_batch(Q, []))
    refused(conn, InvalidParameter, lambda: client.delete_batch(Q, [f"r{i}" for i in range(1001)]))
    refused(conn, InvalidParameter, lambda: client.send_batch(Q, []))
    refused(conn, InvalidParameter, lambda: client.send_batch(Q, [1] * 10_001))
    refused(conn, InvalidParameter, lambda: client.send_batch(Q, [1, 2], attributes=[{"a": 1}]))
    refused(conn, InvalidParameter, lambda: client.send_batch(Q, [1, 2], attributes=[{}, [1]]))  # type: ignore[list-item]
    refused(conn, InvalidParameter, lambda: client.send(Q, 1, attributes=[1]))  # type: ignore[arg-type]
    refused(conn, InvalidParameter, lambda: client.alter_queue(Q, clear=["max_lease"]))
    refused(conn, InvalidParameter, lambda: client.alter_queue(Q, clear=["message_ttl'; --"]))
    for query in ("SELECT queue_pg.send_batch('hq', ARRAY['1'::jsonb, NULL])",
                  "SELECT queue_pg.send_batch('hq', NULL)",
                  "SELECT queue_pg.delete_batch('hq', NULL)"):
        refused(conn, InvalidParameter, sql(conn, query))


def test_sql_nulls_everywhere(conn: psycopg.Connection, world: dict[str, str]) -> None:
    cases: list[tuple[str, type[QueueError]]] = [
        ("SELECT queue_pg.create_queue(NULL)", InvalidParameter),
        ("SELECT queue_pg.create_queue('n', visibility_timeout => NULL)", InvalidParameter),
        ("SELECT queue_pg.create_queue('n', history => NULL)", InvalidParameter),
        ("SELECT queue_pg.send(NULL, '1')", QueueNotFound),
        ("SELECT queue_pg.send('hq', NULL)", InvalidParameter),
        ("SELECT queue_pg.receive('hq', NULL)", InvalidParameter),
        ("SELECT queue_pg.peek('hq', NULL)", InvalidParameter),
        ("SELECT queue_pg.purge(NULL)", QueueNotFound),
        ("SELECT queue_pg.sweep(NULL)", InvalidParameter),
        ("SELECT queue_pg.redrive(NULL)", QueueNotFound),
        ("SELECT queue_pg.stats(NULL)", QueueNotFound),
        ("SELECT queue_pg.drop_queue(NULL)", QueueNotFound),
        ("SELECT queue_pg.change_visibility('hq', %(r)s, NULL)", InvalidParameter),
        ("SELECT queue_pg.change_visibility('hq', %(r)s, 1, NULL)", InvalidParameter),
    ]
    for query, error in cases:
        refused(conn, error, sql(conn, query, {"r": world["mine"]}))
