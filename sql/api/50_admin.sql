-- Looking, clearing, sweeping, redriving, and the figures.

-- Azure Peek Messages: visible messages, visibility unchanged, no receipt.
CREATE OR REPLACE FUNCTION queue_pg.peek(queue text, n integer DEFAULT 1)
RETURNS SETOF queue_pg.message
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'receive');
    at timestamptz := queue_pg._now();
BEGIN
    PERFORM queue_pg._check('n', n, 1, 1000, 'messages');
    RETURN QUERY
    SELECT m.id, q.name, m.body, m.attributes, NULL::text, m.receive_count, m.enqueued_at,
           m.first_received_at, m.visible_at, m.expires_at
    FROM queue_pg.messages m
    WHERE m.queue_id = q.id AND m.visible_at <= at AND (m.expires_at IS NULL OR m.expires_at > at)
    ORDER BY m.visible_at
    LIMIT n;
END $$;

-- SQS PurgeQueue: every message of the queue, in any state.
CREATE OR REPLACE FUNCTION queue_pg.purge(queue text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    at timestamptz := queue_pg._now();
    cnt bigint;
BEGIN
    WITH d AS (DELETE FROM queue_pg.messages m WHERE m.queue_id = q.id RETURNING m.*),
    h AS (
        INSERT INTO queue_pg.message_history
        SELECT (queue_pg._history_row(q, d::queue_pg.messages, 'purged', at)).* FROM d WHERE q.history
    )
    SELECT count(*) INTO cnt FROM d;
    UPDATE queue_pg.in_flight f SET n = 0 WHERE f.queue_id = q.id;
    RETURN cnt;
END $$;

-- History partitions: one per UTC day, made a few days ahead; whole days older than the longest
-- retention are dropped; a queue with a shorter retention has its older rows deleted.
CREATE OR REPLACE FUNCTION queue_pg._history_maintenance(at timestamptz, max_rows integer)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    today date := (at AT TIME ZONE 'UTC')::date;
    d date;
    part record;
    keep double precision;
    q record;
BEGIN
    FOR d IN SELECT generate_series(today, today + 2, interval '1 day')::date LOOP
        IF to_regclass(format('queue_pg.message_history_%s', to_char(d, 'YYYYMMDD'))) IS NULL THEN
            BEGIN
                EXECUTE format('CREATE TABLE queue_pg.message_history_%s PARTITION OF queue_pg.message_history '
                               'FOR VALUES FROM (%L) TO (%L)', to_char(d, 'YYYYMMDD'),
                               (d::timestamp AT TIME ZONE 'UTC'), ((d + 1)::timestamp AT TIME ZONE 'UTC'));
            EXCEPTION WHEN check_violation OR duplicate_table OR invalid_object_definition THEN
                NULL;  -- the default partition already holds rows of that day; they stay there
            END;
        END IF;
    END LOOP;

    SELECT coalesce(max(history_retention), 604800) INTO keep FROM queue_pg.queues;
    FOR part IN
        SELECT c.oid::regclass AS name, to_date(substring(c.relname FROM '(\d{8})$'), 'YYYYMMDD') AS day
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'queue_pg.message_history'::regclass
          AND c.relname ~ '^message_history_\d{8}$'
    LOOP
        IF ((part.day + 1)::timestamp AT TIME ZONE 'UTC') < at - queue_pg._seconds(keep) THEN
            EXECUTE format('DROP TABLE %s', part.name);
        END IF;
    END LOOP;

    FOR q IN SELECT id, history_retention FROM queue_pg.queues WHERE history_retention < keep LOOP
        DELETE FROM queue_pg.message_history h
        WHERE h.ctid = ANY (ARRAY(
            SELECT x.ctid FROM queue_pg.message_history x
            WHERE x.queue_id = q.id AND x.finished_at < at - queue_pg._seconds(q.history_retention)
            LIMIT max_rows));
    END LOOP;
    DELETE FROM queue_pg.message_history_default h
    WHERE h.finished_at < at - queue_pg._seconds(keep);
END $$;

-- Deletes expired messages (a bounded batch, one sweeper at a time) and keeps history partitions.
CREATE OR REPLACE FUNCTION queue_pg.sweep(max_rows integer DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := queue_pg._now();
    cnt bigint;
BEGIN
    PERFORM queue_pg._check('max_rows', max_rows, 1, 1000000, 'rows');
    IF NOT pg_try_advisory_xact_lock(hashtext('queue_pg.sweep')) THEN
        RETURN 0;
    END IF;
    WITH e AS (
        SELECT m.id FROM queue_pg.messages m
        WHERE m.expires_at <= at
        ORDER BY m.expires_at
        LIMIT max_rows
        FOR UPDATE SKIP LOCKED
    ),
    d AS (DELETE FROM queue_pg.messages m USING e WHERE m.id = e.id RETURNING m.*),
    h AS (
        INSERT INTO queue_pg.message_history
        SELECT (queue_pg._history_row(q, d::queue_pg.messages, 'expired', at)).*
        FROM d JOIN queue_pg.queues q ON q.id = d.queue_id
        WHERE q.history
    )
    SELECT count(*) INTO cnt FROM d;
    PERFORM queue_pg._history_maintenance(at, max_rows);
    RETURN cnt;
END $$;

-- SQS StartMessageMoveTask, synchronous: dead-lettered messages go back to the queue each came
-- from (or `to`), as if new: receive count reset, visible now.
CREATE OR REPLACE FUNCTION queue_pg.redrive(dlq text, "to" text DEFAULT NULL, "limit" integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    d queue_pg.queues := queue_pg._queue(dlq, 'manage');
    target queue_pg.queues;
    at timestamptz := queue_pg._now();
    cnt bigint;
    qids integer[];
BEGIN
    IF "to" IS NOT NULL THEN
        target := queue_pg._queue("to", 'manage');
    END IF;
    IF "limit" IS NOT NULL THEN
        PERFORM queue_pg._check('limit', "limit", 1, 2147483647, 'messages');
    END IF;
    WITH pick AS (
        SELECT m.id FROM queue_pg.messages m
        WHERE m.queue_id = d.id AND m.visible_at <= at
          AND (m.source_queue_id IS NOT NULL OR target.id IS NOT NULL)
        ORDER BY m.visible_at
        LIMIT "limit"
        FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        UPDATE queue_pg.messages m SET
            queue_id = coalesce(target.id, m.source_queue_id), source_queue_id = NULL,
            visible_at = at, receive_count = 0, lease_no = m.lease_no + 1, lease_expiries = 0,
            released = false, first_received_at = NULL, last_received_at = NULL
        FROM pick WHERE m.id = pick.id
        RETURNING m.queue_id
    )
    SELECT count(*), array_agg(DISTINCT moved.queue_id) INTO cnt, qids FROM moved;
    PERFORM pg_notify(queue_pg._channel(x), '') FROM unnest(qids) x;
    RETURN cnt;
END $$;

-- One row per queue. stale_receipts: refused receipts (the seeds' sign that the visibility timeout
-- is too short); lease_expiries: messages delivered again after a lease lapsed; dead_lettered:
-- messages of this queue now sitting in a dead-letter queue.
CREATE OR REPLACE VIEW queue_pg.queue_stats AS
SELECT q.name AS queue,
       coalesce(s.visible, 0) AS visible,
       coalesce(s.in_flight, 0) AS in_flight,
       coalesce(s.delayed, 0) AS delayed,
       (SELECT count(*) FROM queue_pg.messages d WHERE d.source_queue_id = q.id) AS dead_lettered,
       s.oldest_visible_age,
       queue_pg._counted('stale_receipts', q.id) AS stale_receipts,
       queue_pg._counted('lease_expiries', q.id) AS lease_expiries
FROM queue_pg.queues q
CROSS JOIN LATERAL (SELECT queue_pg.now() AS at) t
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE m.visible_at <= t.at) AS visible,
           count(*) FILTER (WHERE m.visible_at > t.at AND m.last_received_at IS NOT NULL) AS in_flight,
           count(*) FILTER (WHERE m.visible_at > t.at AND m.last_received_at IS NULL) AS delayed,
           extract(epoch FROM t.at - min(m.enqueued_at) FILTER (WHERE m.visible_at <= t.at))::float8
               AS oldest_visible_age
    FROM queue_pg.messages m
    WHERE m.queue_id = q.id AND (m.expires_at IS NULL OR m.expires_at > t.at)
) s ON true;

CREATE OR REPLACE FUNCTION queue_pg.stats(queue text) RETURNS SETOF queue_pg.queue_stats
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM queue_pg._queue(queue);
    RETURN QUERY SELECT * FROM queue_pg.queue_stats s WHERE s.queue = stats.queue;
END $$;
