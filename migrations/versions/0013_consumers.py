"""Consumers that can be seen to die: registration, the consumer of each lease, the reap:
sql/schema/0013_consumers.sql.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0013_consumers.sql")


def downgrade() -> None:
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.register_consumer(text, integer);
        DROP FUNCTION IF EXISTS queue_pg.reap_consumers();
        DROP FUNCTION IF EXISTS queue_pg._consumer_space();
        DROP FUNCTION IF EXISTS queue_pg._reap_batch();
        DROP FUNCTION IF EXISTS queue_pg._consumer_grace();
        DROP FUNCTION IF EXISTS queue_pg._interval_setting(text, interval, interval, interval);
        DROP FUNCTION IF EXISTS queue_pg._check_choice(text, text, text[], text);
        DROP FUNCTION IF EXISTS queue_pg._consumer_on(integer, integer);
        DROP FUNCTION IF EXISTS queue_pg._consumer_add_queue(integer, integer);
        DROP FUNCTION IF EXISTS queue_pg._consumer_unknown(integer);
        DROP FUNCTION IF EXISTS queue_pg._end_leases(integer, integer[], timestamptz);
        DROP FUNCTION IF EXISTS queue_pg._receive(text, integer, double precision,
            double precision, boolean, text[], integer);
        DROP FUNCTION IF EXISTS queue_pg.receive(text, integer, double precision,
            double precision, text[], integer);
        DROP FUNCTION IF EXISTS queue_pg._claim(queue_pg.queues, integer, double precision,
            boolean, boolean, integer);
        ALTER TABLE queue_pg.messages DROP COLUMN consumer_id;
        DROP TABLE queue_pg.consumers;
        """,
        origin="downgrade 0013",
    )
