"""Per-minute rollups of the history, read by the advice: sql/schema/0010_rollups.sql.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0010_rollups.sql")


# What this revision's api added: dropped on downgrade so an older api finds nothing in its way.
_API_FUNCTIONS = (
    "_work_time", "_wait_time", "_floor_to", "_ceil_to", "_rollup_hour", "_bucket", "_bucket_value",
    "_histogram_value", "_rollup_history", "_forget_rollups", "_rolled_figures",
    "_history_figures_exact", "_route_of",
)


def downgrade() -> None:
    names = ", ".join(f"'{n}'" for n in _API_FUNCTIONS)
    run_sql(
        f"""
        DO $$
        DECLARE
            f regprocedure;
        BEGIN
            FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p
                     WHERE p.pronamespace = 'queue_pg'::regnamespace AND p.proname IN ({names}) LOOP
                EXECUTE format('DROP FUNCTION %s', f);
            END LOOP;
        END $$;
        DROP TABLE queue_pg.history_rollups, queue_pg.history_rollup_state;
        """,
        origin="downgrade 0010",
    )
