"""Transactional lease-expiry counters: sql/schema/0003_counters.sql.

Revision ID: 0003
Revises: 0002
Create Date: 2025-03-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0003_counters.sql")


def downgrade() -> None:
    # Back to one sequence per queue, carrying the counts over.
    run_sql(
        """
        DO $$
        DECLARE
            r record;
        BEGIN
            FOR r IN SELECT q.id, coalesce(c.lease_expiries, 0) AS n
                     FROM queue_pg.queues q LEFT JOIN queue_pg.queue_counters c ON c.queue_id = q.id
            LOOP
                EXECUTE format('CREATE SEQUENCE IF NOT EXISTS queue_pg.lease_expiries_%s', r.id);
                IF r.n > 0 THEN
                    PERFORM setval(format('queue_pg.lease_expiries_%s', r.id)::regclass, r.n);
                END IF;
            END LOOP;
        END $$;
        DROP TABLE queue_pg.queue_counters;
        """,
        origin="downgrade 0003",
    )
