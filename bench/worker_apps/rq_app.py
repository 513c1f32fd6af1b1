"""RQ: the no-op job, run by ``rq worker`` (a fork per job, its default)."""

from __future__ import annotations

from bench.worker_apps import stamp


def noop(n: int | None = None, t: float | None = None) -> None:
    stamp(t)
