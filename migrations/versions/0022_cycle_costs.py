"""History rows of busy queues are a weighted sample; relaxed lease durability on request:
sql/schema/0022_cycle_costs.sql.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27 03:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0022_cycle_costs.sql")


def downgrade() -> None:
    # this version's history writers name the column: the package of the revision gone back to
    # applies its own (the five-argument _history_row goes first: its row type loses a column)
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg._history_row(queue_pg.queues, queue_pg.messages, text,
                                                      timestamptz, integer);
        DROP FUNCTION IF EXISTS queue_pg._history_sampling(timestamptz);
        DROP FUNCTION IF EXISTS queue_pg._history_rows_per_second();
        DROP TABLE queue_pg.history_sampling;
        DROP FUNCTION IF EXISTS queue_pg.create_queue(text, double precision, double precision,
            double precision, integer, double precision, double precision, text, integer, integer,
            boolean, double precision, boolean, boolean, boolean, double precision, text);
        DROP FUNCTION IF EXISTS queue_pg.alter_queue(text, double precision, double precision,
            double precision, integer, double precision, double precision, text, integer, integer,
            boolean, double precision, boolean, boolean, boolean, double precision, text, text[]);
        DROP FUNCTION IF EXISTS queue_pg._current_lease(bigint, integer, integer, timestamptz,
            integer, bigint, integer, timestamptz, timestamptz, text);
        DROP FUNCTION IF EXISTS queue_pg._diagnose(queue_pg.queues, text, bigint, integer, text);
        DROP FUNCTION IF EXISTS queue_pg._parse_receipt(integer, text, bytea);
        DROP FUNCTION IF EXISTS queue_pg._parse_receipts(integer, text[], bytea);
        DROP FUNCTION IF EXISTS queue_pg._receipt(integer, bigint, integer, bytea, text);
        DROP FUNCTION IF EXISTS queue_pg._mac(integer, bigint, integer, bytea, text);
        DROP FUNCTION IF EXISTS queue_pg._lease_token(timestamptz);
        DROP FUNCTION IF EXISTS queue_pg._relax_commit();
        ALTER TABLE queue_pg.queues DROP COLUMN lease_durability;
        ALTER TABLE queue_pg.message_history DROP COLUMN weight;
        """,
        origin="downgrade 0022",
    )
