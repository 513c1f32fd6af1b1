"""Schedules keyed by (queue, name): sql/schema/0014_schedule_keys.sql.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0014_schedule_keys.sql")


def downgrade() -> None:
    # Names must be unique again: a name two queues use stops the downgrade, naming them.
    run_sql(
        """
        DO $$
        DECLARE
            dup text;
        BEGIN
            SELECT string_agg(format('%s (queues %s)', name, ids), ', ') INTO dup
            FROM (SELECT p.name, string_agg(q.name, ', ' ORDER BY q.name) AS ids
                  FROM queue_pg.periodic p JOIN queue_pg.queues q ON q.id = p.queue_id
                  GROUP BY p.name HAVING count(*) > 1) d;
            IF dup IS NOT NULL THEN
                RAISE EXCEPTION 'downgrade 0014: schedule names used by several queues: %; '
                    'drop all but one of each (queue_pg.drop_schedule(name, queue))', dup;
            END IF;
        END $$;
        -- this version's set_schedule upserts by (queue, name): under the old key it would
        -- overwrite another queue's schedule of the same name. The package of the revision
        -- gone back to applies its own.
        DROP FUNCTION IF EXISTS queue_pg.drop_schedule(text, text);
        DROP FUNCTION IF EXISTS queue_pg.set_schedule(text, text, text, jsonb, text, jsonb, text,
                                                      integer, double precision);
        ALTER TABLE queue_pg.periodic DROP CONSTRAINT periodic_pkey;
        ALTER TABLE queue_pg.periodic ADD CONSTRAINT periodic_pkey PRIMARY KEY (name);
        """,
        origin="downgrade 0014",
    )
