"""SQS queue attributes and permissions kept for the endpoint: sql/schema/0019_sqs_attributes.sql.

Revision ID: 0019
Revises: 0016
Create Date: 2026-11-27 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0019_sqs_attributes.sql")


def downgrade() -> None:
    # the functions of sql/api/59_sqs.sql that read them go too: the package of the revision
    # gone back to applies its own
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.sqs_set_queue_attributes(text, jsonb);
        DROP FUNCTION IF EXISTS queue_pg.sqs_queue_attributes(text);
        DROP FUNCTION IF EXISTS queue_pg.sqs_add_permission(text, text, text[], text[]);
        DROP FUNCTION IF EXISTS queue_pg.sqs_remove_permission(text, text);
        DROP TABLE queue_pg.sqs_permissions;
        DROP TABLE queue_pg.sqs_queue_attributes;
        """,
        origin="downgrade 0019",
    )
