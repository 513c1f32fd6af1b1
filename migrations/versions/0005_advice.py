"""Samples, per-type leases, the tuner's settings and log, routes: sql/schema/0005_advice.sql.

Revision ID: 0005
Revises: 0004
Create Date: 2025-05-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from queue_pg.install import run_schema_file, run_sql

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    run_schema_file("0005_advice.sql")


# What this revision's api added: dropped on downgrade so an older api finds nothing in its way.
_API_FUNCTIONS = (
    "_tally", "_count_flow", "_flow", "_sees", "_exact_up_to", "_sample", "_queue_stats",
    "_in_flight_messages",
    "_dead_letters", "_check_window", "_history_figures", "processing_times", "_advise", "_advice",
    "timeout_advice", "alter_tuning", "_refresh_type_leases", "_tune_step", "_tune", "tune",
    "_maintain", "_tuning_log", "_route", "_routed_sends", "add_route", "drop_route", "list_routes",
    "split", "_stale_since", "_target",
)

# queue_stats as revision 0004's api defined it, so the revisions below find it.
_OLD_QUEUE_STATS = """
CREATE VIEW queue_pg.queue_stats WITH (security_barrier = true) AS
SELECT q.name AS queue,
       coalesce(s.visible, 0) AS visible,
       coalesce(s.in_flight, 0) AS in_flight,
       coalesce(s.delayed, 0) AS delayed,
       (SELECT count(*) FROM queue_pg.messages d WHERE d.source_queue_id = q.id) AS dead_lettered,
       s.oldest_visible_age,
       queue_pg._stat_counter('stale_receipts', q.id) AS stale_receipts,
       queue_pg._stat_counter('lease_expiries', q.id) AS lease_expiries
FROM queue_pg.queues q
CROSS JOIN LATERAL (SELECT queue_pg.now() AS at) t
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE m.visible_at <= t.at) AS visible,
           count(*) FILTER (WHERE m.visible_at > t.at AND m.last_received_at IS NOT NULL)
               AS in_flight,
           count(*) FILTER (WHERE m.visible_at > t.at AND m.last_received_at IS NULL) AS delayed,
           extract(epoch FROM t.at - min(m.enqueued_at) FILTER (WHERE m.visible_at <= t.at))::float8
               AS oldest_visible_age
    FROM queue_pg.messages m
    WHERE m.queue_id = q.id AND (m.expires_at IS NULL OR m.expires_at > t.at)
) s ON true;
CREATE FUNCTION queue_pg.stats(queue text) RETURNS SETOF queue_pg.queue_stats
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM queue_pg._queue(queue);
    RETURN QUERY SELECT * FROM queue_pg.queue_stats s WHERE s.queue = stats.queue;
END $$;
DO $$
DECLARE
    g text;
BEGIN
    FOR g IN SELECT rolname FROM pg_catalog.pg_roles
             WHERE rolname IN ('queue_pg_admin', 'queue_pg_producer', 'queue_pg_consumer') LOOP
        EXECUTE format('GRANT SELECT ON queue_pg.queue_stats TO %I', g);
    END LOOP;
END $$;
"""


def downgrade() -> None:
    names = ", ".join(f"'{n}'" for n in _API_FUNCTIONS)
    run_sql(
        f"""
        DROP VIEW IF EXISTS queue_pg.tuning_log, queue_pg.timeout_advice, queue_pg.processing_times,
            queue_pg.in_flight_messages, queue_pg.dead_letters;
        DROP VIEW queue_pg.queue_stats CASCADE;
        DO $$
        DECLARE
            f regprocedure;
        BEGIN
            FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p
                     WHERE p.pronamespace = 'queue_pg'::regnamespace AND p.proname IN ({names}) LOOP
                EXECUTE format('DROP FUNCTION %s', f);
            END LOOP;
        END $$;
        DROP TABLE queue_pg.routes, queue_pg.tuning_history, queue_pg.tuning_runs,
            queue_pg.type_leases, queue_pg.queue_samples;
        DROP TYPE queue_pg.tuning_step, queue_pg.route_info;
        ALTER TABLE queue_pg.queues DROP COLUMN lease_policy, DROP COLUMN auto_tune,
            DROP COLUMN tune_min, DROP COLUMN tune_max, DROP COLUMN has_routes;
        {_OLD_QUEUE_STATS}
        """,
        origin="downgrade 0005",
    )
