"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

A queue_pg revision runs exactly its own sql/schema/NNNN_*.sql file (tables only; functions and
views belong in sql/api and are re-applied by env.py). install_script() concatenates the schema
files, so keep upgrade() to that one call.
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.migrate import run_schema_file, run_sql

revision: str = ${repr(up_revision)}
down_revision: str | Sequence[str] | None = ${repr(down_revision)}
branch_labels: str | Sequence[str] | None = ${repr(branch_labels)}
depends_on: str | Sequence[str] | None = ${repr(depends_on)}


def upgrade() -> None:
    run_schema_file("${up_revision}_CHANGEME.sql")


def downgrade() -> None:
    run_sql("-- undo ${up_revision} here")
