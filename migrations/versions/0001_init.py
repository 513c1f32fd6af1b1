"""Queues, messages and history: sql/schema/0001_init.sql.

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0001_init.sql")


def downgrade() -> None:
    # Back to "not installed": everything in the schema goes (api functions and views included),
    # leaving an empty version table. Alembic then deletes the '0001' row it expects to find.
    run_sql(
        """
        DROP SCHEMA queue_pg CASCADE;
        CREATE SCHEMA queue_pg;
        CREATE TABLE queue_pg.alembic_version (
            version_num varchar(32) NOT NULL,
            CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
        );
        INSERT INTO queue_pg.alembic_version (version_num) VALUES ('0001');
        """,
        origin="downgrade 0001",
    )
