"""Fuzzing the SQL API: every public function called with arguments Hypothesis makes up (text
with unicode and SQL, NUL characters inside JSON, NaN / infinite / huge numbers, NULLs, real and
mangled receipts, JSON nested around the depth bound or holding numbers past float8's range, in
bodies and attributes, arrays of every shape, and the clock setting queue_pg.time_offset).

Each call either works or raises one of the API's errors (class QP, or PostgreSQL's bad-input
codes the client maps to InvalidParameter): never an internal error, never anything else; and a
call that raised changed nothing. Each example runs in a transaction that is rolled back, so all
start from the same queues and messages.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import hypothesis.strategies as st
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from psycopg.types.json import Jsonb

from queue_pg import Client
from queue_pg.errors import SQLSTATE_ERRORS

ALLOWED = set(SQLSTATE_ERRORS)

names = st.one_of(st.just("fz"), st.just("fz"), st.just("fz"), st.sampled_from(["fz-dlq", "nope"]),
                  st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=90))
floats = st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, 1e-300, 20.0, 20.0001, 604800.0, 604800.5, 3153600000.0, 1e308, -1.0])
ints = st.none() | st.integers(-(2**31), 2**31 - 1) | st.sampled_from(
    [0, 1, 1000, 1001, 1024, 16777216, 16777217, 10_000_000])
json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20) \
    | st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
jsonb = st.none() | json_values.map(Jsonb)
# JSON text no client can read, and the values at the bounds: nesting, numbers past float8
json_texts = st.one_of(
    st.integers(95, 105).map(lambda n: "[" * n + "]" * n),
    st.integers(95, 105).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.sampled_from(["1.7976931348623157e308", "1.8e308", "-1e400", "1e-400", "[1e5000]",
                     '{"a": -1e309}', "9" * 320, "0", '"x"']),
    json_values.map(json.dumps),
)
# array literals of every shape: bounds other than 1, two dimensions, empty
array_shapes = st.sampled_from(["{%s,%s}", "[0:1]={%s,%s}", "[5:6]={%s,%s}", "{{%s,%s},{%s,%s}}",
                                "{}", "[1:1]={%s}"])
# the clock setting: honoured for the owner (who runs this fuzz) when it is a sane interval
offsets = st.none() | st.sampled_from(["", "1 day", "-1 hour", "10 years", "200 years", "abc",
                                       "1e400 seconds", "infinity", "0"]) \
    | st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12)


def array_of(shape: str, item: str) -> str:
    return shape.replace("%s", item)


@st.composite
def receipts(draw: st.DrawFn, real: list[str]) -> str | None:
    kind = draw(st.sampled_from(["real", "mangled", "text", "null"]))
    if kind == "null":
        return None
    if kind == "text":
        return draw(st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40))
    r = draw(st.sampled_from(real))
    if kind == "real":
        return r
    i = draw(st.integers(0, len(r) - 1))
    return r[:i] + draw(st.sampled_from(["0", "9", ".", "", "a", "-", "99999999999"])) + r[i + 1:]


def calls(real: list[str]) -> st.SearchStrategy[tuple[str, list[Any]]]:
    """(SQL, parameters) for one call of one public function."""
    r = receipts(real)
    q = names
    return st.one_of(
        st.tuples(st.just("SELECT * FROM queue_pg.create_queue(%s, %s, %s, %s, %s, %s, %s, %s,"
                          " %s, %s, %s, %s)"),
                  st.tuples(q, floats, floats, floats, ints, floats, floats, st.none() | q, ints,
                            ints, st.none() | st.booleans(), floats).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.alter_queue(%s, %s, %s, %s, %s, %s, %s, %s,"
                          " %s, %s, %s, %s, %s)"),
                  st.tuples(q, floats, floats, floats, ints, floats, floats, st.none() | q, ints,
                            ints, st.none() | st.booleans(), floats,
                            st.none() | st.lists(st.none() | q, max_size=3)).map(list)),
        st.tuples(st.just("SELECT queue_pg.drop_queue(%s, %s)"),
                  st.tuples(q, st.none() | st.booleans()).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.get_queue(%s)"), st.tuples(q).map(list)),
        st.tuples(st.just("SELECT queue_pg.send(%s, %s, %s, %s, %s)"),
                  st.tuples(q, jsonb, floats, floats, jsonb).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.send_batch(%s, %s::jsonb[], %s, %s,"
                          " %s::jsonb[])"),
                  st.tuples(q, st.none() | st.lists(jsonb, max_size=4), floats, floats,
                            st.none() | st.lists(jsonb, max_size=4)).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.receive(%s, %s, %s, %s)"),
                  st.tuples(q, ints, floats, st.none() | st.sampled_from(
                      [0.0, 0.01, -1.0, 20.5, math.nan, math.inf])).map(list)),
        st.tuples(st.just("SELECT queue_pg.delete_message(%s, %s)"),
                  st.tuples(q, r).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.delete_batch(%s, %s::text[])"),
                  st.tuples(q, st.none() | st.lists(r, max_size=4)).map(list)),
        st.tuples(st.just("SELECT queue_pg.change_visibility(%s, %s, %s, %s)"),
                  st.tuples(q, r, floats, st.none() | st.booleans()).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.update_message(%s, %s, %s, %s, %s)"),
                  st.tuples(q, r, jsonb, floats, jsonb).map(list)),
        st.tuples(st.just("SELECT queue_pg.dead_letter(%s, %s, %s)"),
                  st.tuples(q, r, st.none() | st.text(max_size=10).filter(
                      lambda t: "\x00" not in t)).map(list)),
        st.tuples(st.just("SELECT queue_pg.send(%s, %s::jsonb, attributes => jsonb_build_object('a', %s::jsonb))"),
                  st.tuples(q, json_texts, json_texts).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.send_batch(%s, %s::jsonb[], attributes => %s::jsonb[])"),
                  st.tuples(q, array_shapes.map(lambda a: array_of(a, "1")),
                            st.none() | array_shapes.map(lambda a: array_of(a, '"{}"'))).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.send_batch(%s, array[%s::jsonb])"),
                  st.tuples(q, json_texts).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.delete_batch(%s, %s::text[])"),
                  st.tuples(q, st.tuples(array_shapes, r).map(
                      lambda t: array_of(t[0], '"' + (t[1] or "") + '"'))).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.update_message(%s, %s, %s::jsonb, %s,"
                          " jsonb_build_object('a', %s::jsonb))"),
                  st.tuples(q, r, json_texts, floats, json_texts).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.peek(%s, %s)"), st.tuples(q, ints).map(list)),
        st.tuples(st.just("SELECT queue_pg.purge(%s)"), st.tuples(q).map(list)),
        st.tuples(st.just("SELECT queue_pg.sweep(%s)"), st.tuples(ints).map(list)),
        st.tuples(st.just("SELECT queue_pg.redrive(%s, %s, %s)"),
                  st.tuples(q, st.none() | q, ints).map(list)),
        st.tuples(st.just("SELECT queue_pg.channel(%s)"), st.tuples(q).map(list)),
        st.tuples(st.just("SELECT * FROM queue_pg.stats(%s)"), st.tuples(q).map(list)),
    )


def snapshot(conn: psycopg.Connection) -> tuple[Any, ...]:
    return (
        conn.execute("SELECT * FROM queue_pg.queues ORDER BY id").fetchall(),
        conn.execute("SELECT * FROM queue_pg.messages ORDER BY id").fetchall(),
        conn.execute("SELECT * FROM queue_pg.message_history ORDER BY message_id").fetchall(),
        conn.execute("SELECT * FROM queue_pg.in_flight ORDER BY queue_id").fetchall(),
    )


@pytest.fixture
def fuzz_world(client: Client, clean: str) -> Iterator[tuple[psycopg.Connection, list[str]]]:
    client.create_queue("fz-dlq")
    client.create_queue("fz", dead_letter_queue="fz-dlq", max_receive_count=2,
                        in_flight_limit=50, max_message_size=1024)
    client.send_batch("fz", [{"n": i} for i in range(6)])
    client.send("fz-dlq", "x")
    real = [m.receipt or "" for m in client.receive("fz", 3, visibility_timeout=600)]
    real += [m.receipt or "" for m in client.receive("fz-dlq", 1)]
    with psycopg.connect(clean) as conn:  # not autocommit: each example is rolled back
        yield conn, real


@pytest.mark.slow
def test_sql_api_fuzz(fuzz_world: tuple[psycopg.Connection, list[str]]) -> None:
    conn, real = fuzz_world
    seen: dict[str, int] = {}

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        query, params = data.draw(calls(real))
        offset = data.draw(offsets)
        try:
            before = snapshot(conn)
            conn.execute("SAVEPOINT call")
            try:
                if offset is not None:
                    conn.execute("SELECT set_config('queue_pg.time_offset', %s, true)", [offset])
                conn.execute(query, params).fetchall()
                outcome = "ok"
            except psycopg.Error as exc:
                assert exc.sqlstate in ALLOWED, (exc.sqlstate, str(exc), query, params)
                conn.execute("ROLLBACK TO SAVEPOINT call")
                assert snapshot(conn) == before, (query, params)
                outcome = exc.sqlstate or "?"
            seen[outcome] = seen.get(outcome, 0) + 1
        finally:
            conn.rollback()

    one()
    print(f"\n[fuzz] outcomes: {dict(sorted(seen.items()))}")
    assert {"ok", "QP001", "QP003", "QP006"} <= set(seen)  # both sides of the API were reached
