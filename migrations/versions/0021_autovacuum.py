"""Autovacuum by row count for messages' TOAST table and dedup: sql/schema/0021_autovacuum.sql.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27 03:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0021_autovacuum.sql")


def downgrade() -> None:
    run_sql(
        """
        ALTER TABLE queue_pg.messages RESET (
            toast.autovacuum_vacuum_scale_factor, toast.autovacuum_vacuum_threshold,
            toast.autovacuum_vacuum_insert_scale_factor, toast.autovacuum_vacuum_insert_threshold,
            toast.autovacuum_vacuum_cost_delay);
        ALTER TABLE queue_pg.dedup RESET (
            autovacuum_vacuum_cost_delay, autovacuum_vacuum_insert_scale_factor,
            autovacuum_vacuum_insert_threshold, autovacuum_analyze_scale_factor,
            autovacuum_analyze_threshold);
        """,
        origin="downgrade 0021",
    )
