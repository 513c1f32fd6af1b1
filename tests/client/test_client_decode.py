"""The client tests, decoding: bodies as json.loads reads them, and bodies it cannot read."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg.pq import Format
from psycopg.types.json import set_json_loads

import queue_pg
from client.helpers import insert_poison
from queue_pg import decode

TRICKY_BODIES: list[Any] = [
    {"nested": {"list": [1, 2.5, -0.0, 1e308, 2**70, -(2**63)], "t": True, "n": None}},
    "quotes \" and \\ backslashes, tab\t, newline\n",
    "é, 漢字, 🎉 (outside the BMP), \u2028",
    [],
    {},
    0.1,
    12345678901234567890123,
    "",
]




def test_bodies_decode_exactly_as_json_loads(client: Any, clean: str) -> None:
    """The client's own connections load jsonb with the faster loader (decode.JsonbLoader); every
    body decodes to what json.loads makes of the server's own text for it."""
    client.create_queue("jobs")
    client.send_batch("jobs", TRICKY_BODIES)
    got = client.receive("jobs", 10)
    with psycopg.connect(clean, autocommit=True) as plain:
        texts = dict(plain.execute("select id, body::text from queue_pg.messages").fetchall())
    assert [m.body for m in got] == [json.loads(texts[m.id]) for m in got]
    assert len(got) == len(TRICKY_BODIES)  # (jsonb itself reorders keys, normalises numbers)
    assert sorted(m.body for m in got if isinstance(m.body, str)) == sorted(
        b for b in TRICKY_BODIES if isinstance(b, str)
    )


def test_own_pool_uses_the_faster_loader(clean: str) -> None:
    with queue_pg.Client(clean, sweep_interval=None) as c, c._borrow() as own:
        assert own.adapters.get_loader(3802, Format.TEXT) is decode.JsonbLoader


def test_a_connection_with_custom_jsonb_loading_keeps_it(clean: str) -> None:
    with psycopg.connect(clean, autocommit=True) as conn:
        set_json_loads(lambda text: ("custom", text), conn)
        decode.fast_jsonb(conn.adapters)
        assert conn.adapters.get_loader(3802, Format.TEXT) is not decode.JsonbLoader
        assert conn.execute("""select '{"a": 1}'::jsonb""").fetchone() == (("custom", b'{"a": 1}'),)


def test_a_poison_body_does_not_take_its_batch_down(client: Any, clean: str) -> None:
    client.create_queue("jobs")
    ids = insert_poison(clean, "jobs")
    got = {m.id: m for m in client.receive("jobs", 10)}
    assert sorted(got) == sorted(ids.values())  # all four leased, none lost
    assert got[ids["ok1"]].body == "fine" and got[ids["ok2"]].body == {"a": 1}
    for name, error in (("deep", "RecursionError"), ("huge", "ValueError")):
        body = got[ids[name]].body
        assert isinstance(body, queue_pg.UndecodableBody), name
        assert body.error.startswith(error), body.error
    assert got[ids["huge"]].body.text == "1" + "0" * 5000  # jsonb's text of 1e5000
    for m in got.values():  # each can still be settled
        assert client.delete("jobs", m.receipt) is True
