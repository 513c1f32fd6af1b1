"""Rollups wait for late-committing history rows; the tuner's own stale-receipt baselines:
sql/schema/0012_rollup_marks.sql.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0012_rollup_marks.sql")


def downgrade() -> None:
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg._history_writers();
        DROP FUNCTION IF EXISTS queue_pg._rollup_cap();
        DROP FUNCTION IF EXISTS queue_pg._tune_interval();
        DROP FUNCTION IF EXISTS queue_pg._tune_step(queue_pg.queues, timestamptz, boolean);
        DROP TABLE queue_pg.tuning_marks;
        ALTER TABLE queue_pg.history_rollup_state
            DROP COLUMN safe, DROP COLUMN mark, DROP COLUMN mark_taken, DROP COLUMN mark_writers;
        """,
        origin="downgrade 0012",
    )
