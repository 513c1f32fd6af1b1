"""The table where the tasks of the worker tests' apps (tests/worker_app.py, tests/pool_app.py)
write what they do, one row per event with the process and the attempt: a test reads there what
a process did before it was killed."""

from __future__ import annotations

import os
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from queue_pg.jobs.job import BaseJob

__all__ = ["ddl", "record"]


def ddl(table: str) -> sql.Composed:
    """CREATE TABLE IF NOT EXISTS for the run table ``table``."""
    return sql.SQL("""
CREATE TABLE IF NOT EXISTS {} (
    n bigserial PRIMARY KEY,
    task text NOT NULL,
    key text,
    msg_id bigint,
    attempt int,
    pid int NOT NULL,
    event text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    data jsonb
)
""").format(sql.Identifier(table))


def record(dsn: str, table: str, job: BaseJob, event: str, key: str, **data: Any) -> None:
    """One event of ``job`` in ``table`` of ``dsn``, committed at once."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            sql.SQL("INSERT INTO {} (task, key, msg_id, attempt, pid, event, data)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s)").format(sql.Identifier(table)),
            [job.task.name if job.task else "-", key, job.id, job.receive_count, os.getpid(),
             event, Jsonb(data)],
        )
