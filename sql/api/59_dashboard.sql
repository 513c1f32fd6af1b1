-- The history the dashboard charts: each queue's samples (taken by sweep, at most one per 15
-- seconds, kept two hours; see _sample in 55_monitoring.sql) over the last `seconds`, with the
-- flows between one sample and the one before it as rates per second. Read-only, no bodies; a
-- role sees only the queues it has some grant on (_sees), like queue_stats.
CREATE OR REPLACE FUNCTION queue_pg.queue_history(queue_name text DEFAULT NULL, seconds double precision DEFAULT 3600)
RETURNS TABLE (queue text, at timestamptz, visible bigint, in_flight bigint, delayed bigint,
               dead_lettered bigint, sent_per_s double precision, received_per_s double precision,
               deleted_per_s double precision, lease_expiries_per_s double precision,
               stale_receipts_per_s double precision)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    only_id integer;
    since timestamptz;
BEGIN
    PERFORM queue_pg._check('seconds', seconds, 1, 7200);
    IF queue_name IS NOT NULL THEN
        only_id := (queue_pg._queue(queue_name)).id;
    END IF;
    since := queue_pg._now() - queue_pg._seconds(seconds);
    RETURN QUERY
    SELECT x.name, x.at, x.visible, x.in_flight, x.delayed, x.dead_lettered,
           (x.sent - x.p_sent) / x.dt, (x.received - x.p_received) / x.dt,
           (x.deleted - x.p_deleted) / x.dt, (x.lease_expiries - x.p_lease_expiries) / x.dt,
           (x.stale_receipts - x.p_stale_receipts) / x.dt
    FROM (
        SELECT q.name, s.at, s.visible, s.in_flight, s.delayed, s.dead_lettered,
               s.sent, s.received, s.deleted, s.lease_expiries, s.stale_receipts,
               lag(s.sent) OVER w AS p_sent, lag(s.received) OVER w AS p_received,
               lag(s.deleted) OVER w AS p_deleted, lag(s.lease_expiries) OVER w AS p_lease_expiries,
               lag(s.stale_receipts) OVER w AS p_stale_receipts,
               nullif(extract(epoch FROM s.at - lag(s.at) OVER w)::float8, 0) AS dt
        FROM queue_pg.queues q
        -- one sample before the window too: the first point in it gets its rates
        JOIN queue_pg.queue_samples s ON s.queue_id = q.id
         AND s.at >= since - interval '15 minutes'
        WHERE (only_id IS NULL OR q.id = only_id) AND queue_pg._sees(q.id)
        WINDOW w AS (PARTITION BY q.id ORDER BY s.at)
    ) x
    WHERE x.at >= since
    ORDER BY x.name, x.at;
END $$;

-- The dashboard's longer ranges (24 hours, 7 days): each queue's finished messages per hour,
-- read from the history rollups (an hour row, else the hour's minute rows), as rates per
-- second: messages finished, dead-lettered, and leases that lapsed. No bodies, no types; a
-- role sees only the queues it has some grant on (_sees).
CREATE OR REPLACE FUNCTION queue_pg.queue_throughput(queue_name text DEFAULT NULL, seconds double precision DEFAULT 86400)
RETURNS TABLE (queue text, at timestamptz, finished_per_s double precision,
               dead_lettered_per_s double precision, lease_expiries_per_s double precision)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    only_id integer;
    since timestamptz;
BEGIN
    PERFORM queue_pg._check('seconds', seconds, 1, 8 * 86400);
    IF queue_name IS NOT NULL THEN
        only_id := (queue_pg._queue(queue_name)).id;
    END IF;
    since := queue_pg._floor_to(queue_pg._now() - queue_pg._seconds(seconds), 3600);
    RETURN QUERY
    SELECT q.name, queue_pg._floor_to(r.start, 3600) AS hour,
           sum(r.messages)::float8 / 3600, sum(r.dead_lettered)::float8 / 3600,
           sum(r.lease_expiries)::float8 / 3600
    FROM queue_pg.queues q
    JOIN queue_pg.history_rollups r ON r.queue_id = q.id AND r.start >= since
    WHERE (only_id IS NULL OR q.id = only_id) AND queue_pg._sees(q.id)
      AND (r.minutes = 60 OR NOT EXISTS (
            SELECT 1 FROM queue_pg.history_rollups h
            WHERE h.queue_id = r.queue_id AND h.minutes = 60
              AND h.start = queue_pg._floor_to(r.start, 3600)))
    GROUP BY q.name, hour
    ORDER BY q.name, hour;
END $$;

-- The dashboard's Workers page: the registered consumers (34_consumers.sql) a role may see
-- (its own, and those that received from a queue it has some grant on, shown with those queues
-- only): what each calls itself (host:pid), its backend, whether its session still holds its
-- lock (alive) or since when it is lost, the messages it holds leased now, when it registered.
-- No bodies; `name` is the worker's own text, shown escaped.
CREATE OR REPLACE FUNCTION queue_pg.workers()
RETURNS TABLE (id integer, name text, role text, pid integer, queues text[], running bigint,
               registered_at timestamptz, alive boolean, lost_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    at timestamptz := queue_pg._now();
BEGIN
    RETURN QUERY
    SELECT c.id, c.name, c.role, c.pid,
           ARRAY(SELECT q.name FROM queue_pg.queues q
                 WHERE q.id = ANY (c.queue_ids) AND queue_pg._sees(q.id) ORDER BY q.name),
           (SELECT count(*) FROM queue_pg.messages m
            WHERE m.consumer_id = c.id AND m.visible_at > at
              AND m.queue_id = ANY (c.queue_ids) AND queue_pg._sees(m.queue_id)),
           c.registered_at,
           -- pg_locks is the whole server's: an advisory lock of this id in another database
           -- (another install of queue_pg) is not this consumer's
           EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                   WHERE l.locktype = 'advisory' AND l.granted
                     AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                       WHERE d.datname = pg_catalog.current_database())
                     AND l.classid::integer = queue_pg._consumer_space() AND l.objid::integer = c.id
                     AND l.objsubid = 2),
           c.lost_at
    FROM queue_pg.consumers c
    WHERE c.role = queue_pg._caller()::text
       OR EXISTS (SELECT 1 FROM unnest(c.queue_ids) u(qid) WHERE queue_pg._sees(u.qid))
    ORDER BY c.id;
END $$;
