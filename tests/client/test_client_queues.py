"""The client tests, queues: run against both clients (see conftest.py)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from client.helpers import Snapshot, db_messages
from queue_pg import (
    Client,
    InvalidParameter,
    QueueAlreadyExists,
    QueueConfig,
    QueueError,
    QueueInUse,
    QueueNotFound,
)


def test_create_queue_returns_its_config_with_the_documented_defaults(client: Client) -> None:
    cfg = client.create_queue("jobs")
    assert isinstance(cfg, QueueConfig)
    assert (
        cfg.name,
        cfg.visibility_timeout,
        cfg.message_ttl,
        cfg.delay,
        cfg.max_message_size,
        cfg.receive_wait,
        cfg.max_lease,
        cfg.dead_letter_queue,
        cfg.max_receive_count,
        cfg.in_flight_limit,
        cfg.history,
        cfg.history_retention,
    ) == ("jobs", 30.0, 345600.0, 0.0, 1048576, 0.0, 43200.0, None, None, None, True, 604800.0)
    assert isinstance(cfg.created_at, datetime) and cfg.created_at.tzinfo is not None
    assert client.get_queue("jobs") == cfg


def test_create_queue_takes_timedelta_settings(client: Client) -> None:
    client.create_queue("dlq")
    cfg = client.create_queue(
        "jobs",
        visibility_timeout=timedelta(minutes=2),
        message_ttl=timedelta(days=1, milliseconds=500),
        delay=timedelta(milliseconds=250),
        max_message_size=4096,
        receive_wait=timedelta(seconds=3),
        max_lease=timedelta(hours=1),
        dead_letter_queue="dlq",
        max_receive_count=5,
        in_flight_limit=100,
        history=False,
        history_retention=timedelta(hours=2),
    )
    assert (
        cfg.visibility_timeout,
        cfg.message_ttl,
        cfg.delay,
        cfg.max_message_size,
        cfg.receive_wait,
        cfg.max_lease,
        cfg.dead_letter_queue,
        cfg.max_receive_count,
        cfg.in_flight_limit,
        cfg.history,
        cfg.history_retention,
    ) == (120.0, 86400.5, 0.25, 4096, 3.0, 3600.0, "dlq", 5, 100, False, 7200.0)
    # the same settings again (as floats now) are a no-op that returns the existing row
    again = client.create_queue(
        "jobs",
        visibility_timeout=120,
        message_ttl=86400.5,
        delay=0.25,
        max_message_size=4096,
        receive_wait=3,
        max_lease=3600,
        dead_letter_queue="dlq",
        max_receive_count=5,
        in_flight_limit=100,
        history=False,
        history_retention=7200,
    )
    assert again == cfg


def test_create_queue_with_other_settings_is_refused_and_changes_nothing(
    client: Client, snapshot: Snapshot
) -> None:
    client.create_queue("jobs", visibility_timeout=10)
    before = snapshot()
    with pytest.raises(QueueAlreadyExists, match=r"visibility_timeout = 10 \(asked 11\)") as err:
        client.create_queue("jobs", visibility_timeout=11)
    assert err.value.sqlstate == "QP002"
    with pytest.raises(QueueAlreadyExists, match="message_ttl"):
        client.create_queue("jobs", visibility_timeout=10, message_ttl=None)
    assert snapshot() == before
    assert client.get_queue("jobs").visibility_timeout == 10


def test_message_ttl_none_means_messages_never_expire(client: Client) -> None:
    assert client.create_queue("forever", message_ttl=None).message_ttl is None
    client.send("forever", 1)
    [m] = client.peek("forever")
    assert m.expires_at is None


def test_unknown_setting_is_a_type_error_before_any_sql(client: Client) -> None:
    with pytest.raises(TypeError, match="visibilty_timeout"):
        client.create_queue("jobs", visibilty_timeout=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="bogus"):
        client.alter_queue("jobs", bogus=1)  # type: ignore[call-arg]
    assert client.list_queues() == []


@pytest.mark.parametrize(
    ("name", "settings", "match"),
    [
        ("bad name", {}, "name = 'bad name'"),
        ("", {}, "name"),
        ("x" * 81, {}, "name"),
        (
            "jobs",
            {"visibility_timeout": timedelta(days=7, seconds=1)},
            "visibility_timeout = 604801",
        ),
        ("jobs", {"visibility_timeout": math.nan}, "visibility_timeout = NaN"),
        ("jobs", {"visibility_timeout": -0.5}, "visibility_timeout"),
        ("jobs", {"message_ttl": 0}, "message_ttl = 0"),
        ("jobs", {"message_ttl": math.inf}, "message_ttl"),
        ("jobs", {"delay": timedelta(seconds=-1)}, "delay = -1"),
        ("jobs", {"max_message_size": 1023}, "max_message_size = 1023"),
        ("jobs", {"max_message_size": 2**40}, "out of range"),  # PostgreSQL's own 22003
        ("jobs", {"receive_wait": 20.5}, "receive_wait = 20.5"),
        ("jobs", {"max_lease": 0}, "max_lease = 0"),
        ("jobs", {"max_lease": 5, "visibility_timeout": 6}, "max_lease = 5"),
        ("jobs", {"max_receive_count": 3}, "set both or neither"),
        ("jobs", {"dead_letter_queue": "missing", "max_receive_count": 3}, "no such queue"),
        ("jobs", {"dead_letter_queue": "jobs", "max_receive_count": 3}, "its own"),
        ("jobs", {"dead_letter_queue": "dlq", "max_receive_count": 0}, "max_receive_count = 0"),
        ("jobs", {"in_flight_limit": 0}, "in_flight_limit = 0"),
        ("jobs", {"history": None}, "history = NULL"),
        ("jobs", {"history_retention": 3599}, "history_retention = 3599"),
    ],
)
def test_bad_queue_settings_raise_invalid_parameter_and_change_nothing(
    client: Client, snapshot: Snapshot, name: str, settings: dict[str, Any], match: str
) -> None:
    client.create_queue("dlq")
    before = snapshot()
    with pytest.raises(InvalidParameter, match=match) as err:
        client.create_queue(name, **settings)
    assert isinstance(err.value, ValueError)
    assert snapshot() == before


def test_alter_queue_changes_only_what_it_is_given(client: Client) -> None:
    client.create_queue("dlq")
    created = client.create_queue("jobs", visibility_timeout=10, delay=1)
    cfg = client.alter_queue(
        "jobs", visibility_timeout=timedelta(seconds=45), receive_wait=timedelta(milliseconds=500)
    )
    assert (cfg.visibility_timeout, cfg.receive_wait, cfg.delay) == (45.0, 0.5, 1.0)
    assert cfg.created_at == created.created_at
    cfg = client.alter_queue(
        "jobs", dead_letter_queue="dlq", max_receive_count=3, in_flight_limit=7
    )
    assert (cfg.dead_letter_queue, cfg.max_receive_count, cfg.in_flight_limit) == ("dlq", 3, 7)
    assert client.get_queue("jobs") == cfg


def test_alter_queue_clear_sets_nullable_settings_to_null(client: Client) -> None:
    client.create_queue("dlq")
    client.create_queue("jobs", dead_letter_queue="dlq", max_receive_count=3, in_flight_limit=5)
    cfg = client.alter_queue("jobs", clear=["message_ttl", "in_flight_limit"])
    assert (cfg.message_ttl, cfg.in_flight_limit, cfg.max_receive_count) == (None, None, 3)
    cfg = client.alter_queue("jobs", clear=("dead_letter_queue",))  # any iterable; pairs clear
    assert (cfg.dead_letter_queue, cfg.max_receive_count) == (None, None)
    assert client.get_queue("jobs") == cfg
    # a cleared dead_letter_queue is no longer "in use"
    assert client.drop_queue("dlq") is True


@pytest.mark.parametrize(
    ("settings", "clear", "error", "match"),
    [
        ({"visibility_timeout": 604801}, None, InvalidParameter, "visibility_timeout"),
        ({"max_lease": 20}, None, InvalidParameter, "max_lease = 20"),  # below visibility 30
        ({"max_receive_count": 4}, None, InvalidParameter, "set both"),
        ({"delay": 1}, ["visibility_timeout"], InvalidParameter, "clear = 'visibility_timeout'"),
        ({"dead_letter_queue": "nope", "max_receive_count": 2}, None, InvalidParameter, "no such"),
    ],
)
def test_bad_alter_queue_changes_nothing(
    client: Client,
    snapshot: Snapshot,
    settings: dict[str, Any],
    clear: list[str] | None,
    error: type[QueueError],
    match: str,
) -> None:
    client.create_queue("jobs", in_flight_limit=3)
    before = snapshot()
    with pytest.raises(error, match=match):
        client.alter_queue("jobs", clear=clear, **settings)
    assert snapshot() == before


def test_alter_get_drop_of_a_missing_queue_raise_queue_not_found(client: Client) -> None:
    for call in (
        lambda: client.alter_queue("nope", delay=1),
        lambda: client.get_queue("nope"),
        lambda: client.drop_queue("nope"),
    ):
        with pytest.raises(QueueNotFound, match="queue 'nope' does not exist") as err:
            call()
        assert err.value.sqlstate == "QP001"
    assert client.drop_queue("nope", if_exists=True) is False


def test_list_queues_is_sorted_by_name(client: Client) -> None:
    for name in ("b", "c", "a"):
        client.create_queue(name, delay=ord(name) - ord("a"))
    queues = client.list_queues()
    assert [(q.name, q.delay) for q in queues] == [("a", 0.0), ("b", 1.0), ("c", 2.0)]
    assert all(isinstance(q, QueueConfig) for q in queues)


def test_drop_queue_removes_it_and_its_messages_only(
    client: Client, conn: psycopg.Connection
) -> None:
    client.create_queue("jobs")
    client.create_queue("other")
    client.send_batch("jobs", [1, 2])
    client.receive("jobs")
    client.send("other", 3)
    assert client.drop_queue("jobs") is True
    assert [q.name for q in client.list_queues()] == ["other"]
    assert db_messages(conn) == 1
    assert client.drop_queue("jobs", if_exists=True) is False
    with pytest.raises(QueueNotFound):
        client.send("jobs", 1)


def test_drop_of_a_dead_letter_queue_in_use_raises_queue_in_use(
    client: Client, snapshot: Snapshot
) -> None:
    client.create_queue("dlq")
    client.create_queue("jobs", dead_letter_queue="dlq", max_receive_count=2)
    client.send("dlq", "parked")
    before = snapshot()
    with pytest.raises(QueueInUse, match="'jobs'") as err:
        client.drop_queue("dlq")
    assert err.value.sqlstate == "QP010"
    assert snapshot() == before
    client.drop_queue("jobs")
    assert client.drop_queue("dlq") is True
