"""queue_pg on Spark (``pip install 'queue-pg[spark]'``): DataFrames into queues exactly once,
and the queues' history as DataFrames for the timeout advisor.

``import queue_pg`` never imports this package, and importing it loads Spark only when one of
these names is first used (so the CLI can offer ``queue-pg spark`` without Spark installed).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from queue_pg.spark.advice import Advice, advise
    from queue_pg.spark.history import jdbc_options, read_history, read_queue_stats, session
    from queue_pg.spark.sink import EnqueueResult, enqueue

_WHERE = {
    "Advice": "advice",
    "advise": "advice",
    "EnqueueResult": "sink",
    "enqueue": "sink",
    "jdbc_options": "history",
    "read_history": "history",
    "read_queue_stats": "history",
    "session": "history",
}

__all__ = [
    "Advice",
    "EnqueueResult",
    "advise",
    "enqueue",
    "jdbc_options",
    "read_history",
    "read_queue_stats",
    "session",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'queue_pg.spark' has no attribute {name!r}")
    return getattr(import_module(f"queue_pg.spark.{_WHERE[name]}"), name)
