"""Account keys and queue metadata of the Azure Queue endpoint: sql/schema/0024_azure.sql.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-27 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0024"
down_revision: str | Sequence[str] | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0024_azure.sql")


def downgrade() -> None:
    # the functions of sql/api/59_azure.sql that read them go too: the package of the revision
    # gone back to applies its own
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.azure_create_key(name, text);
        DROP FUNCTION IF EXISTS queue_pg.azure_revoke_key(text);
        DROP FUNCTION IF EXISTS queue_pg.azure_key(text);
        DROP FUNCTION IF EXISTS queue_pg.azure_set_metadata(text, jsonb);
        DROP FUNCTION IF EXISTS queue_pg.azure_metadata(text);
        DROP FUNCTION IF EXISTS queue_pg.azure_list_queues(text, text, integer);
        DROP TABLE queue_pg.azure_queue_metadata;
        DROP TABLE queue_pg.azure_keys;
        """,
        origin="downgrade 0024",
    )
