"""Task results kept for a time: sql/schema/0026_task_results.sql.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-27 04:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0026"
down_revision: str | Sequence[str] | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0026_task_results.sql")


def downgrade() -> None:
    # the functions of sql/api/54_task_results.sql that read it go too: the package of the
    # revision gone back to applies its own (and its sweep, which does not call _forget_results)
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.complete_task(text, text, jsonb, double precision);
        DROP FUNCTION IF EXISTS queue_pg.fail_task(text, text, text, double precision);
        DROP FUNCTION IF EXISTS queue_pg.task_result(text, bigint);
        DROP FUNCTION IF EXISTS queue_pg.task_result_channel(text);
        DROP FUNCTION IF EXISTS queue_pg._result_reader(text);
        DROP FUNCTION IF EXISTS queue_pg._keep_result(queue_pg.queues, bigint, text, jsonb, text,
                                                      double precision);
        DROP FUNCTION IF EXISTS queue_pg._forget_results(timestamptz, integer, integer[]);
        DROP TABLE queue_pg.task_results;
        """,
        origin="downgrade 0025",
    )
