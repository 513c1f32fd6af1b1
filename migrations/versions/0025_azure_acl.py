"""Stored access policies of the Azure Queue endpoint's queues: sql/schema/0025_azure_acl.sql.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-27 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0025"
down_revision: str | Sequence[str] | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0025_azure_acl.sql")


def downgrade() -> None:
    # the functions of sql/api/59_azure.sql that read them go too: the package of the revision
    # gone back to applies its own
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.azure_set_acl(text, jsonb);
        DROP FUNCTION IF EXISTS queue_pg.azure_acl(text);
        DROP FUNCTION IF EXISTS queue_pg.azure_access_policy(text, text);
        DROP TABLE queue_pg.azure_access_policies;
        """,
        origin="downgrade 0025",
    )
