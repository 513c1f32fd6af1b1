"""FIFO queues and fair queues: sql/schema/0008_fifo.sql.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0008_fifo.sql")


def downgrade() -> None:
    run_sql(
        """
        DROP TRIGGER IF EXISTS messages_fifo_gone ON queue_pg.messages;
        DROP FUNCTION IF EXISTS queue_pg._fifo_gone(),
            queue_pg._fifo_advance(integer, text, bigint, timestamptz),
            queue_pg._fifo_send(queue_pg.queues, jsonb[], jsonb[], text[], timestamptz,
                                double precision, bigint[]),
            queue_pg._fifo_enter(integer, bigint[]),
            queue_pg._fifo_moved(integer, integer, bigint[], timestamptz),
            queue_pg._check_groups(queue_pg.queues, text[], double precision, integer),
            queue_pg._fair_claim(queue_pg.queues, integer, timestamptz);
        DROP INDEX queue_pg.messages_group;
        DROP TABLE queue_pg.fifo_groups;
        ALTER TABLE queue_pg.queues DROP COLUMN fifo, DROP COLUMN fair;
        """,
        origin="downgrade 0008",
    )
