"""Deduplication and dead-letter redrive tasks: sql/schema/0009_dedup_redrive.sql.

Revision ID: 0009
Revises: 0006
Create Date: 2026-11-24 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0009_dedup_redrive.sql")


def downgrade() -> None:
    # the api of this revision goes first (it names the new columns, table and type); the
    # older api is re-applied after the downgrade
    run_sql(
        """
        DO $$
        DECLARE f regprocedure;
        BEGIN
            FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                     WHERE p.pronamespace = 'queue_pg'::regnamespace
                       AND p.proname IN ('_dedup_key', '_dedup_ids', '_send_deduped',
                                         '_forget_dedup', '_redrive_task', '_redrive_advance',
                                         'start_redrive', 'list_redrives', 'cancel_redrive',
                                         'redrive_step', '_redrive_steps')
            LOOP
                EXECUTE format('DROP FUNCTION %s', f);
            END LOOP;
        END $$;
        DROP TABLE queue_pg.dedup, queue_pg.redrive_tasks;
        DROP TYPE queue_pg.redrive_task;
        ALTER TABLE queue_pg.queues DROP COLUMN content_dedup, DROP COLUMN dedup_window;
        """,
        origin="downgrade 0009",
    )
