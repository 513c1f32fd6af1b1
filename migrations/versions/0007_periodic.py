"""Periodic tasks: sql/schema/0007_periodic.sql.

Revision ID: 0007
Revises: 0006
Create Date: 2025-05-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0007_periodic.sql")


def downgrade() -> None:
    run_sql(
        """
        DROP VIEW IF EXISTS queue_pg.schedules;
        DROP FUNCTION IF EXISTS queue_pg._schedules(), queue_pg.fire_schedules(text[]),
            queue_pg.drop_schedule(text), queue_pg.drop_schedule(text, text),
            queue_pg.set_schedule(text, text, text, jsonb, text, jsonb, text, integer,
                                  double precision),
            queue_pg._check_cron(text, text, timestamptz),
            queue_pg._cron_next(text, text, timestamptz), queue_pg._cron_fields(text),
            queue_pg._cron_field(text, integer, integer, text[], integer);
        DROP FUNCTION IF EXISTS queue_pg.set_rate_limit(text, double precision),
            queue_pg._rate_take(integer, integer, timestamptz);
        DROP TABLE queue_pg.periodic, queue_pg.rate_limits;
        UPDATE queue_pg.queues SET options = options - 'rate_limit';
        """,
        origin="downgrade 0007",
    )
