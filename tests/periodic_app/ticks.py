"""Tasks for tests/test_periodic.py: a task fired every second whose runs record their tick."""

from __future__ import annotations

import os

import psycopg

import queue_pg


@queue_pg.task(queue="ticks", schedule="* * * * * *", create=True)
def tick() -> None:
    job = queue_pg.current_job()
    with psycopg.connect(os.environ["QUEUE_PG_DSN"], autocommit=True) as c:
        c.execute("INSERT INTO periodic_runs (tick, pid) VALUES (%s, %s)",
                  [job.message.attributes["tick"], os.getpid()])
