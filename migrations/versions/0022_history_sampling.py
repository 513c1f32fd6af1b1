"""History rows of busy queues are a weighted sample: sql/schema/0022_history_sampling.sql.

Revision ID: 0022
Revises: 0015
Create Date: 2026-11-27 03:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0022_history_sampling.sql")


def downgrade() -> None:
    # this version's history writers name the column: the package of the revision gone back to
    # applies its own (the five-argument _history_row goes first: its row type loses a column)
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg._history_row(queue_pg.queues, queue_pg.messages, text,
                                                      timestamptz, integer);
        DROP FUNCTION IF EXISTS queue_pg._history_sampling(timestamptz);
        DROP FUNCTION IF EXISTS queue_pg._history_rows_per_second();
        DROP TABLE queue_pg.history_sampling;
        ALTER TABLE queue_pg.message_history DROP COLUMN weight;
        """,
        origin="downgrade 0022",
    )
