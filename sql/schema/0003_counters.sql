-- Revision 0003: counters that must roll back with the statement that counts them.
-- lease_expiries (messages delivered again after a lease lapsed) was counted in a sequence,
-- which a rolled-back receive does not roll back: a receive killed mid-way, or run in a caller's
-- transaction that aborted, left the figure too high. A row per queue, updated only by receives
-- that find lapsed leases (rare), keeps it exact. stale_receipts stays a sequence on purpose: a
-- refusal raises, and must still be counted.
CREATE TABLE queue_pg.queue_counters (
    queue_id integer PRIMARY KEY REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    lease_expiries bigint NOT NULL DEFAULT 0
);
REVOKE ALL ON queue_pg.queue_counters FROM PUBLIC;

INSERT INTO queue_pg.queue_counters (queue_id, lease_expiries)
SELECT q.id, coalesce(pg_sequence_last_value(s.oid), 0)
FROM queue_pg.queues q
JOIN pg_class s ON s.relname = 'lease_expiries_' || q.id AND s.relkind = 'S'
               AND s.relnamespace = 'queue_pg'::regnamespace;

DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.relname FROM pg_class c
             WHERE c.relnamespace = 'queue_pg'::regnamespace AND c.relkind = 'S'
               AND c.relname ~ '^lease_expiries_[0-9]+$'
    LOOP
        EXECUTE format('DROP SEQUENCE queue_pg.%I', r.relname);
    END LOOP;
END $$;
