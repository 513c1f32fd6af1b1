"""A redrive task's starting role: sql/schema/0016_boundaries.sql.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0016_boundaries.sql")


def downgrade() -> None:
    # this version's functions that the older package does not replace (new signatures) go, so
    # its own (same names, older signatures) are not ambiguous; the column goes last
    run_sql(
        """
        DROP FUNCTION IF EXISTS
            queue_pg._in_flight_held(queue_pg.queues, timestamptz, integer, double precision);
        DROP FUNCTION IF EXISTS queue_pg._in_flight_less(integer, bigint);
        DROP FUNCTION IF EXISTS
            queue_pg._move_back(integer, integer, bigint, timestamptz, timestamptz, name);
        DROP FUNCTION IF EXISTS queue_pg._movable_to(name);
        DROP FUNCTION IF EXISTS queue_pg._queue_seen(text);
        DROP FUNCTION IF EXISTS queue_pg._manager_retention_cap();
        DROP FUNCTION IF EXISTS queue_pg._denied_to(name, integer, text);
        ALTER TABLE queue_pg.redrive_tasks DROP COLUMN started_by;
        """,
        origin="downgrade 0016",
    )
