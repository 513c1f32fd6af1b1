-- Bulk sends that happen once (revision 0006): a writer stages a chunk of rows with COPY into a
-- temporary table of its session, then send_staged sends them in the same transaction under
-- the key (writer, write_id, part, chunk), which queue_pg.bulk_writes records first.
--
-- The staging table belongs to the owner of queue_pg (stage creates it, inside the SECURITY
-- DEFINER entry point) and the caller may only INSERT into it: so what send_staged reads as the
-- owner is rows, never a view, rule or function the caller planted under that name. Its rows go
-- at commit. It lives in the caller's own temporary schema, so all a caller can grow with it is
-- what any role with TEMP on the database can grow with a temporary table of its own.

CREATE OR REPLACE FUNCTION queue_pg._check_write_key(write_id text, part integer, chunk integer)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF write_id IS NULL OR length(write_id) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('write_id = %s is invalid: allowed text of 1 to 200 characters',
                             coalesce(quote_literal(left(write_id, 100)), 'NULL'));
    END IF;
    PERFORM queue_pg._check('part', part, 0, 2147483647, '(a partition number)');
    PERFORM queue_pg._check('chunk', chunk, 0, 2147483647, '(a chunk number within the partition)');
END $$;

-- Whether the session's staging table exists; raises when something else took its name.
CREATE OR REPLACE FUNCTION queue_pg._staging() RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    SELECT r.relkind, r.relowner INTO c FROM pg_catalog.pg_class r
    WHERE r.relname = 'queue_pg_staging' AND r.relnamespace = pg_catalog.pg_my_temp_schema();
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF c.relkind <> 'r' OR c.relowner <> to_regrole(current_user)::oid THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = 'pg_temp.queue_pg_staging is not the staging table of queue_pg: allowed only the table queue_pg.stage creates',
            HINT = 'DROP the temporary relation queue_pg_staging of this session, then call queue_pg.stage again';
    END IF;
    RETURN true;
END $$;

-- Makes the session's staging table ready for a COPY of (body, attributes, dedup_id, group_id)
-- rows, empty, and says whether the key was written already (the caller may then skip the COPY;
-- send_staged decides for good). A table of an older shape (fewer columns) is made anew.
CREATE OR REPLACE FUNCTION queue_pg.stage(queue text, write_id text, part integer, chunk integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'send');
BEGIN
    PERFORM queue_pg._check_write_key(write_id, part, chunk);
    IF queue_pg._staging()
       AND (SELECT r.relnatts FROM pg_catalog.pg_class r WHERE r.relname = 'queue_pg_staging'
            AND r.relnamespace = pg_catalog.pg_my_temp_schema()) = 4 THEN
        TRUNCATE pg_temp.queue_pg_staging;
    ELSE
        DROP TABLE IF EXISTS pg_temp.queue_pg_staging;
        CREATE TEMPORARY TABLE queue_pg_staging (body jsonb, attributes jsonb, dedup_id text, group_id text)
            ON COMMIT DELETE ROWS;
    END IF;
    EXECUTE format('GRANT INSERT ON pg_temp.queue_pg_staging TO %I', queue_pg._caller());
    RETURN EXISTS (SELECT 1 FROM queue_pg.bulk_writes w
                   WHERE w.queue_id = q.id AND w.writer = to_regrole(queue_pg._caller())::oid
                     AND w.write_id = stage.write_id AND w.part = stage.part AND w.chunk = stage.chunk);
END $$;

-- Sends the staged rows as messages with send_batch's rules (_send_rows: size, depth,
-- attributes, groups, dedup ids, routes; delay and ttl as _sending checks them), in the order
-- they were staged (a bad row is named by its place in the chunk, body[17]), and records the
-- key; the number of messages sent (a row whose dedup id was sent within the queue's
-- dedup_window is not sent again), or NULL when the key was written already (then nothing is
-- sent and the staged rows are dropped). The key goes in first: a concurrent writer of the same
-- key waits here until this transaction ends, then finds it written (or, if this one rolled
-- back, writes it).
CREATE OR REPLACE FUNCTION queue_pg.send_staged(
    queue text,
    write_id text,
    part integer,
    chunk integer,
    delay double precision DEFAULT NULL,
    ttl double precision DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'send');
    d double precision; t double precision; n timestamptz;  -- delay, ttl, now: _sending
    who oid := to_regrole(queue_pg._caller())::oid;
    sent bigint;
    staged record;
BEGIN
    -- plpgsql_check cannot see stage's temporary table: the pragma describes it (a no-op here)
    PERFORM 'PRAGMA:TABLE: pg_temp.queue_pg_staging (body jsonb, attributes jsonb, dedup_id text, group_id text)';
    SELECT * INTO d, t, n FROM queue_pg._sending(q, delay, ttl);
    PERFORM queue_pg._check_write_key(write_id, part, chunk);
    IF NOT queue_pg._staging() THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = 'pg_temp.queue_pg_staging does not exist: allowed after queue_pg.stage in the same session';
    END IF;
    INSERT INTO queue_pg.bulk_writes AS w (queue_id, writer, write_id, part, chunk)
    VALUES (q.id, who, send_staged.write_id, send_staged.part, send_staged.chunk)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        TRUNCATE pg_temp.queue_pg_staging;
        RETURN NULL;
    END IF;
    -- the chunk as send_batch's lists (no list for a column that is NULL throughout)
    SELECT array_agg(s.body) AS bodies,
           CASE WHEN bool_or(s.attributes IS NOT NULL) THEN array_agg(s.attributes) END AS attributes,
           CASE WHEN bool_or(s.dedup_id IS NOT NULL) THEN array_agg(s.dedup_id) END AS dedup_ids,
           CASE WHEN bool_or(s.group_id IS NOT NULL) THEN array_agg(s.group_id) END AS groups
    INTO staged
    FROM pg_temp.queue_pg_staging s;  -- a scan of the table COPY just filled: its order
    TRUNCATE pg_temp.queue_pg_staging;
    IF staged.bodies IS NULL THEN
        sent := 0;
    ELSE
        SELECT count(*) FILTER (WHERE x.sent) INTO sent
        FROM queue_pg._send_rows(q, d, t, n, delay, staged.bodies, staged.attributes, staged.groups,
                                 staged.dedup_ids, false) x;
    END IF;
    UPDATE queue_pg.bulk_writes w SET messages = sent
    WHERE w.queue_id = q.id AND w.writer = who AND w.write_id = send_staged.write_id
      AND w.part = send_staged.part AND w.chunk = send_staged.chunk;
    RETURN sent;
END $$;

-- Forgets keys older than their queue's history_retention, on the real clock (a bounded batch;
-- concurrent sweeps skip each other's rows): what a producer's keys grow is bounded by time as
-- its messages' history is. Called by queue_pg.sweep.
CREATE OR REPLACE FUNCTION queue_pg._forget_writes(max_rows integer, scope integer[] DEFAULT NULL)
RETURNS void
LANGUAGE sql AS $$
    DELETE FROM queue_pg.bulk_writes w
    WHERE w.ctid = ANY (ARRAY(
        SELECT x.ctid FROM queue_pg.bulk_writes x
        JOIN queue_pg.queues q ON q.id = x.queue_id
        WHERE x.written_at < clock_timestamp() - queue_pg._seconds(q.history_retention)
          AND (scope IS NULL OR x.queue_id = ANY (scope))
        LIMIT max_rows FOR UPDATE OF x SKIP LOCKED))
$$;
