"""Chords (a group of jobs and a callback with their results): sql/schema/0027_task_chords.sql.

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-27 06:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0027"
down_revision: str | Sequence[str] | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0027_task_chords.sql")


def downgrade() -> None:
    # the functions of sql/api/54_task_steps.sql that use the tables go too: the package of
    # the revision gone back to applies its own
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.complete_step(text, text, jsonb, double precision);
        DROP FUNCTION IF EXISTS queue_pg.send_chord(jsonb, text, jsonb);
        DROP FUNCTION IF EXISTS queue_pg._next_step(jsonb, jsonb);
        DROP FUNCTION IF EXISTS queue_pg._forget_chords(integer, integer[]);
        DROP TABLE queue_pg.chord_members;
        DROP TABLE queue_pg.chords;
        """,
        origin="downgrade 0026",
    )
