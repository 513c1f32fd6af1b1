"""Decoding without a server: rows into dataclasses, jsonb text into Python (or a marker)."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from queue_pg import UndecodableBody, decode


def test_rows_decode_by_column_name_whatever_the_order() -> None:
    """Rows are tuples matched to the dataclass by column name: in field order they build
    positionally; reordered or with a column a newer schema added they still decode; a
    missing column is an error that says so."""
    from datetime import datetime, timezone

    from queue_pg.types import Message

    now = datetime.now(timezone.utc)
    values = {"id": 7, "queue": "q", "body": {"a": 1}, "attributes": None, "receipt": "r",
              "receive_count": 1, "enqueued_at": now, "first_received_at": now,
              "visible_until": now, "expires_at": None}
    want = Message(**values)
    in_order = tuple(values)
    decoder = decode.many(decode.message)
    assert decoder(in_order, [tuple(values.values())]) == [want]
    shuffled = ("extra", *reversed(in_order))
    assert decoder(shuffled, [("x", *reversed(tuple(values.values())))]) == [want]
    with pytest.raises(RuntimeError, match="receipt"):
        decoder(tuple(c for c in in_order if c != "receipt"), [tuple(range(9))])
    # the positional builder sets the slots itself: still a frozen, hashable Message
    built = decoder(in_order, [tuple(values.values())])[0]
    assert type(built) is Message and built == want and repr(built) == repr(want)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.receipt = "other"  # type: ignore[misc]


def test_jsonb_loader_marks_a_value_python_refuses_and_never_raises() -> None:
    """Nesting past the recursion limit, integers of more digits than Python reads (what jsonb
    makes of 1e5000), and text PostgreSQL never sends: an UndecodableBody with the text and the
    error, where json.loads would raise."""
    load = decode.JsonbLoader(3802).load
    deep = "[" * 100_000 + "]" * 100_000
    huge = "1" + "0" * 5000
    for text, error in ((deep, "RecursionError"), (huge, "ValueError"),
                        ('{"a": 1} x', "JSONDecodeError"), ("", "JSONDecodeError")):
        got = load(text.encode())
        assert isinstance(got, UndecodableBody), text[:20]
        assert got.text == text and got.error.startswith(error + ": ")
        with pytest.raises((RecursionError, ValueError)):
            json.loads(text)
    assert load(b' {"a": [1, 2]} ') == {"a": [1, 2]}  # what json.loads accepts, it reads
    assert load(str(2**70).encode()) == 2**70
    assert sys.get_int_max_str_digits() < 5001
