"""Access control (group roles, per-queue grants, tables closed): sql/schema/0002_access.sql.

Revision ID: 0002
Revises: 0001
Create Date: 2025-02-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0002_access.sql")


def downgrade() -> None:
    # Back to 0001's access: the functions this revision's api added go (so an older api applied
    # next finds no overload in its way), the rest run as their caller again with EXECUTE for
    # PUBLIC, and the group roles lose their privileges here. The roles stay: they belong to the
    # cluster, other databases may use them, and dropping them would drop their memberships.
    run_sql(
        """
        DROP FUNCTION IF EXISTS queue_pg.grant(text, text, text), queue_pg.revoke(text, text, text),
            queue_pg.list_grants(text), queue_pg._grant(text, text, text, boolean),
            queue_pg._queue(text, text), queue_pg._authorize(integer, text, text),
            queue_pg._denied(integer, text), queue_pg._caller();
        DROP TABLE queue_pg.grants;
        DROP TYPE queue_pg.grant_info;
        ALTER VIEW queue_pg.queue_stats RESET (security_barrier);
        DO $$
        DECLARE
            f regprocedure;
            g text;
        BEGIN
            FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p
                     WHERE p.pronamespace = 'queue_pg'::regnamespace AND p.prokind = 'f' LOOP
                EXECUTE format('ALTER FUNCTION %s SECURITY INVOKER RESET search_path'
                               ' RESET plan_cache_mode', f);
            END LOOP;
            FOR g IN SELECT rolname FROM pg_catalog.pg_roles
                     WHERE rolname IN ('queue_pg_admin', 'queue_pg_producer', 'queue_pg_consumer')
            LOOP
                EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA queue_pg FROM %I', g);
                EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA queue_pg FROM %I', g);
                EXECUTE format('REVOKE ALL ON SCHEMA queue_pg FROM %I', g);
            END LOOP;
        END $$;
        GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA queue_pg TO PUBLIC;
        """,
        origin="downgrade 0002",
    )
