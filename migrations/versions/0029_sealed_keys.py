"""Endpoint secrets sealed at rest, and Azure service properties by account:
sql/schema/0029_sealed_keys.sql.

Revision ID: 0029
Revises: 0026
Create Date: 2026-11-27 06:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0029"
down_revision: str | Sequence[str] | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0029_sealed_keys.sql")


def downgrade() -> None:
    # the key functions that take sealed secrets go too: the package of the revision gone back
    # to applies its own. Sealed rows stay sealed: the older endpoints find their signatures
    # wrong and refuse them (fail closed); make new keys after going back.
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.sqs_create_key(name, text);
        DROP FUNCTION IF EXISTS queue_pg.azure_create_key(name, text, text);
        DROP FUNCTION IF EXISTS queue_pg.endpoint_secrets(text);
        DROP FUNCTION IF EXISTS queue_pg.endpoint_reseal(text, text, text, text);
        DROP FUNCTION IF EXISTS queue_pg.endpoint_secrets_sealed();
        DROP FUNCTION IF EXISTS queue_pg.azure_set_service_properties(text, jsonb);
        DROP FUNCTION IF EXISTS queue_pg.azure_service_properties(text);
        DROP FUNCTION IF EXISTS queue_pg._azure_account_of_caller(text);
        DROP TABLE queue_pg.azure_service_properties;
        ALTER TABLE queue_pg.sqs_keys DROP CONSTRAINT sqs_keys_sealed;
        ALTER TABLE queue_pg.azure_keys DROP CONSTRAINT azure_keys_sealed;
        """,
        origin="downgrade 0029",
    )
