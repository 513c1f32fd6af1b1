"""A queue's duplicate budget, read by the per-type leases: sql/schema/0023_duplicate_budget.sql.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-27 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0023"
down_revision: str | Sequence[str] | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0023_duplicate_budget.sql")


def downgrade() -> None:
    # this version's functions name the column: the package of the revision gone back to
    # applies its own
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.alter_tuning(text, text, boolean, double precision,
            double precision, text[], double precision);
        DROP VIEW IF EXISTS queue_pg.lease_advice;
        DROP VIEW IF EXISTS queue_pg.stuck_jobs;
        DROP FUNCTION IF EXISTS queue_pg.lease_advice(timestamptz, timestamptz);
        DROP FUNCTION IF EXISTS queue_pg._lease_advice(timestamptz, timestamptz, integer);
        ALTER TABLE queue_pg.queues DROP COLUMN duplicate_budget;
        """,
        origin="downgrade 0023",
    )
