"""Deduplication and dead-letter redrive tasks: sql/schema/0009_dedup_redrive.sql.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0009_dedup_redrive.sql")


def downgrade() -> None:
    # what this revision's api added goes first (it names the new columns, tables and type),
    # so that an older api, applied by its own package, finds nothing in its way
    run_sql(
        """
        DO $$
        DECLARE f regprocedure;
        BEGIN
            FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                     WHERE p.pronamespace = 'queue_pg'::regnamespace
                       AND p.proname IN ('_dedup_key', '_dedup_one', '_dedup_ids',
                                         '_forget_dedup', '_move_back', '_redrive_task',
                                         '_redrive_advance', '_redrive_steps', 'start_redrive',
                                         'list_redrives', 'cancel_redrive', 'redrive_step')
            LOOP
                EXECUTE format('DROP FUNCTION %s', f);
            END LOOP;
        END $$;
        -- the signatures this revision's api gave them: an older api's would be ambiguous
        DROP FUNCTION IF EXISTS
            queue_pg.send(text, jsonb, double precision, double precision, jsonb, boolean, text,
                          text),
            queue_pg.send_batch(text, jsonb[], double precision, double precision, jsonb[],
                                boolean, text[], text[]),
            queue_pg.create_queue(text, double precision, double precision, double precision,
                                  integer, double precision, double precision, text, integer,
                                  integer, boolean, double precision, boolean, boolean, boolean,
                                  double precision),
            queue_pg.alter_queue(text, double precision, double precision, double precision,
                                 integer, double precision, double precision, text, integer,
                                 integer, boolean, double precision, boolean, boolean, boolean,
                                 double precision, text[]);
        DROP TABLE queue_pg.dedup, queue_pg.redrive_tasks;
        DROP TYPE queue_pg.redrive_task;
        ALTER TABLE queue_pg.queues DROP COLUMN content_dedup, DROP COLUMN dedup_window;
        """,
        origin="downgrade 0009",
    )
