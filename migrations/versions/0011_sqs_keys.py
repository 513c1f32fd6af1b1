"""Access keys and queue tags of the SQS endpoint: sql/schema/0011_sqs_keys.sql.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0011_sqs_keys.sql")


def downgrade() -> None:
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.sqs_create_key(name);
        DROP FUNCTION IF EXISTS queue_pg.sqs_revoke_key(text);
        DROP FUNCTION IF EXISTS queue_pg.sqs_key(text);
        DROP FUNCTION IF EXISTS queue_pg.sqs_tag_queue(text, jsonb);
        DROP FUNCTION IF EXISTS queue_pg.sqs_untag_queue(text, text[]);
        DROP FUNCTION IF EXISTS queue_pg.sqs_queue_tags(text);
        DROP TABLE queue_pg.sqs_keys, queue_pg.queue_tags;
        """,
        origin="downgrade 0011",
    )
