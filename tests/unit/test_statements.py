"""The statement builders (queue_pg._ops) without a server: what they send, and the argument
types they refuse before anything is sent."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from queue_pg import InvalidParameter, _ops


def test_receive_sends_seconds_and_receipts() -> None:
    call = _ops.receive("q", 5, timedelta(seconds=30), 2, ["a", "b"])
    assert "queue_pg._receive(" in str(call.query)
    assert call.params == {"queue": "q", "max_messages": 5, "visibility_timeout": 30.0,
                           "wait": 2.0, "delete": ["a", "b"], "consumer": None}


def test_settings_are_cast_to_one_signature_and_unknown_ones_are_a_type_error() -> None:
    call = _ops.create_queue("q", {"visibility_timeout": timedelta(minutes=1), "history": True})
    assert "visibility_timeout => %(visibility_timeout)s::float8" in str(call.query)
    assert call.params["visibility_timeout"] == 60.0
    with pytest.raises(TypeError, match="colour"):
        _ops.create_queue("q", {"colour": "red"})


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: _ops.send("q", 1, delay="5"), "delay"),
        (lambda: _ops.send("q", 1, delay=True), "delay"),
        (lambda: _ops.send("q", 1, ttl=[1]), "ttl"),
        (lambda: _ops.send(5, 1), "queue"),  # type: ignore[arg-type]
        (lambda: _ops.send_batch("q", "abc"), "bodies"),
        (lambda: _ops.receive("q", 1.5), "max_messages"),
        (lambda: _ops.receive("q", True), "max_messages"),
        (lambda: _ops.receive("q", 1, visibility_timeout="30"), "visibility_timeout"),
        (lambda: _ops.receive("q", 1, wait=b"1"), "wait"),
        (lambda: _ops.receive("q", 1, delete="receipt"), "delete"),
        (lambda: _ops.delete("q", 123), "receipt"),  # type: ignore[arg-type]
        (lambda: _ops.delete_batch("q", [b"r"]), "receipts"),
        (lambda: _ops.change_visibility("q", "r", "10"), "timeout"),
        (lambda: _ops.change_visibility("q", "r", 10, release=1), "release"),
        (lambda: _ops.peek("q", 2.0), "n"),  # type: ignore[arg-type]
        (lambda: _ops.redrive("d", limit=1.0), "limit"),  # type: ignore[arg-type]
        (lambda: _ops.dead_letter("q", "r", reason=5), "reason"),  # type: ignore[arg-type]
        (lambda: _ops.drop_queue("q", if_exists="yes"), "if_exists"),  # type: ignore[arg-type]
        (lambda: _ops.create_queue("q", {"max_message_size": 1.5}), "max_message_size"),
        (lambda: _ops.create_queue("q", {"history": "no"}), "history"),
        (lambda: _ops.alter_queue("q", {}, clear="message_ttl"), "clear"),
        (lambda: _ops.grant("q", "role", 1), "privilege"),  # type: ignore[arg-type]
    ],
)
def test_wrong_argument_types_are_invalid_parameter_naming_the_parameter(
    build: Any, name: str
) -> None:
    with pytest.raises(InvalidParameter, match=rf"^{name}\b") as err:
        build()
    assert err.value.sqlstate is None  # refused here: nothing was sent


def test_types_are_checked_not_ranges() -> None:
    """Out-of-range values of the right type go through: the range is SQL's rule."""
    assert _ops.receive("q", 0, -1, 99).params["max_messages"] == 0
    assert _ops.send("q", 1, delay=float("nan")).params["delay"] != 0
