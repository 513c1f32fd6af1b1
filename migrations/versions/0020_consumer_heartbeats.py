"""Consumer heartbeats and server identity: sql/schema/0020_consumer_heartbeats.sql.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0020_consumer_heartbeats.sql")


def downgrade() -> None:
    # this version's functions name the new columns: the package of the revision gone back to
    # applies its own
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.register_consumer(text, integer, boolean);
        DROP FUNCTION IF EXISTS queue_pg.consumer_heartbeat(integer);
        DROP FUNCTION IF EXISTS queue_pg.reap_consumers();
        DROP FUNCTION IF EXISTS queue_pg._consumer_server();
        DROP FUNCTION IF EXISTS queue_pg._consumer_rejoin();
        ALTER TABLE queue_pg.consumers DROP COLUMN last_seen, DROP COLUMN seen_on,
            DROP COLUMN session, DROP COLUMN lost_on;
        """,
        origin="downgrade 0020",
    )
