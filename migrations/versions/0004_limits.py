"""The sweep's lock row: sql/schema/0004_limits.sql.

Revision ID: 0004
Revises: 0003
Create Date: 2025-04-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0004_limits.sql")


def downgrade() -> None:
    run_sql("DROP TABLE queue_pg.sweeper;", origin="downgrade 0004")
