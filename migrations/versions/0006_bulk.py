"""Bulk writes that happen once: sql/schema/0006_bulk.sql.

Revision ID: 0006
Revises: 0004
Create Date: 2025-05-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0006_bulk.sql")


def downgrade() -> None:
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.stage(text, text, integer, integer),
            queue_pg.send_staged(text, text, integer, integer, double precision, double precision),
            queue_pg._check_write_key(text, integer, integer), queue_pg._staging(),
            queue_pg._refuse_staged(queue_pg.queues, jsonb, jsonb, tid),
            queue_pg._forget_writes(integer), queue_pg._forget_writes(integer, integer[]);
        DROP TABLE queue_pg.bulk_writes;
        """,
        origin="downgrade 0006",
    )
