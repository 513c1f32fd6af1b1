"""queue_pg: the no-op task, run by ``queue-pg worker bench.worker_apps.qpg``."""

from __future__ import annotations

import queue_pg
from bench.worker_apps import QUEUE, stamp


@queue_pg.task(queue=QUEUE, name="bench.noop")
def noop(n: int | None = None, t: float | None = None) -> None:
    stamp(t)
