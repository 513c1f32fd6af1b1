"""Procrastinate: the no-op task, run by
``procrastinate --app=bench.worker_apps.procr.app worker``."""

from __future__ import annotations

import os
from typing import Any

import procrastinate

from bench.worker_apps import DSN_ENV, QUEUE, stamp


def noop(**kwargs: Any) -> None:
    stamp(kwargs.get("t"))


def make(conninfo: str) -> procrastinate.App:
    """An app on ``conninfo`` with the task (the parent sends through one of its own)."""
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    app.task(name=QUEUE, queue=QUEUE)(noop)
    return app


app = make(os.environ.get(DSN_ENV, ""))
