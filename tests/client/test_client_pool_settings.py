"""The pool settings of a client's own pool: argument, else environment, else default."""

from __future__ import annotations

import pytest

import queue_pg


def test_pool_settings_from_arguments_and_environment(
    clean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUEUE_PG_POOL_TIMEOUT", "7.5")
    monkeypatch.setenv("QUEUE_PG_RECONNECT_MAX", "0.5")
    with queue_pg.Client(clean, sweep_interval=None) as c:
        assert c._pool is not None
        assert c._pool.timeout == 7.5
        assert c._pool.reconnect_max == 0.5  # type: ignore[attr-defined]
    with queue_pg.Client(clean, sweep_interval=None, pool_timeout=3, reconnect_max=2) as c:
        assert c._pool is not None
        assert (c._pool.timeout, c._pool.reconnect_max) == (3, 2)  # type: ignore[attr-defined]
    monkeypatch.delenv("QUEUE_PG_POOL_TIMEOUT")
    monkeypatch.delenv("QUEUE_PG_RECONNECT_MAX")
    with queue_pg.Client(clean, sweep_interval=None) as c:
        assert c._pool is not None
        assert (c._pool.timeout, c._pool.reconnect_max) == (30, 1)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kwargs", "env", "message"),
    [
        ({"pool_timeout": 0}, {}, "pool_timeout must be > 0 and <= 3600 seconds, not 0"),
        ({"reconnect_max": -1}, {}, "reconnect_max must be > 0 and <= 3600 seconds, not -1"),
        ({}, {"QUEUE_PG_RECONNECT_MAX": "soon"}, "QUEUE_PG_RECONNECT_MAX must be a number"),
        ({}, {"QUEUE_PG_POOL_TIMEOUT": "99999"}, "pool_timeout must be > 0 and <= 3600"),
    ],
)
def test_pool_settings_out_of_range_are_refused(
    clean: str, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, float],
    env: dict[str, str], message: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(queue_pg.InvalidParameter, match=message):
        queue_pg.Client(clean, sweep_interval=None, **kwargs)
    with pytest.raises(queue_pg.InvalidParameter, match=message):
        queue_pg.AsyncClient(clean, sweep_interval=None, **kwargs)
