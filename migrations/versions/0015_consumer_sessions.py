"""A consumer's backend start recorded at registration: sql/schema/0015_consumer_sessions.sql.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0015_consumer_sessions.sql")


def downgrade() -> None:
    # this version's registration and reap name the column: the package of the revision gone
    # back to applies its own
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.register_consumer(text, integer);
        DROP FUNCTION IF EXISTS queue_pg.reap_consumers();
        ALTER TABLE queue_pg.consumers DROP COLUMN backend_start;
        """,
        origin="downgrade 0015",
    )
