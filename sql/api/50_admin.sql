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

-- History upkeep, on the real clock whatever the session's: rows older than their queue's
-- history_retention are deleted (bounded batches, rows another sweep holds are skipped, given up
-- after 50 ms of waiting for a table lock), by any caller. Partitions (one per UTC day, made up to two days ahead; whole days older than the
-- longest retention dropped) are DDL, whose locks last until the caller's transaction ends: only
-- the owner's sweep (a superuser or a member of the owner's role) does them, one sweep at a time
-- (a row lock on queue_pg.sweeper, which no other role can reach), never waiting for a lock.
-- Until one runs, a day's rows go to the default partition and are deleted row by row.
CREATE OR REPLACE FUNCTION queue_pg._history_maintenance(max_rows integer)
RETURNS void
LANGUAGE plpgsql SET lock_timeout = '50ms' AS $$
DECLARE
    at timestamptz := clock_timestamp();
    keep double precision;
    q record;
BEGIN
    SELECT coalesce(max(history_retention), 604800) INTO keep FROM queue_pg.queues;
    BEGIN  -- a table lock held by the owner's partition upkeep: skipped, done by a later sweep
        FOR q IN SELECT id, history_retention FROM queue_pg.queues WHERE history_retention < keep LOOP
            DELETE FROM queue_pg.message_history h
            USING (SELECT x.tableoid AS part, x.ctid AS row_id FROM queue_pg.message_history x
                   WHERE x.queue_id = q.id AND x.finished_at < at - queue_pg._seconds(q.history_retention)
                   LIMIT max_rows FOR UPDATE SKIP LOCKED) old
            WHERE h.tableoid = old.part AND h.ctid = old.row_id;
        END LOOP;
        DELETE FROM queue_pg.message_history_default h
        WHERE h.ctid = ANY (ARRAY(
            SELECT x.ctid FROM queue_pg.message_history_default x
            WHERE x.finished_at < at - queue_pg._seconds(keep)
            LIMIT max_rows FOR UPDATE SKIP LOCKED));
    EXCEPTION WHEN lock_not_available THEN
        NULL;
    END;
    IF queue_pg._is_owner() THEN  -- apart: nobody else may ever hold the sweeper row
        IF EXISTS (SELECT 1 FROM queue_pg.sweeper FOR UPDATE SKIP LOCKED) THEN
            PERFORM queue_pg._history_partitions(at, keep);
        END IF;
    END IF;
END $$;

-- The partition DDL of _history_maintenance. A new day's table is made on its own and then
-- attached (SHARE UPDATE EXCLUSIVE on the parent: inserts and deletes go on); each step gives
-- up after 50 ms of waiting for a lock (the lock_timeout of _history_maintenance), to be tried
-- by the next sweep. A sweep attaches days ahead only (from_day 1): a day whose rows are being
-- written may not be attached under them (a row routed to the default partition just before
-- the attach would fail its insert, PostgreSQL re-checking the default's new constraint), so
-- today's partition is made by the install (from_day 0, see queue_pg.install), before traffic.
CREATE OR REPLACE FUNCTION queue_pg._history_partitions(at timestamptz, keep double precision,
                                                        from_day integer DEFAULT 1)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    today date := (at AT TIME ZONE 'UTC')::date;
    d date;
    part record;
    name text;
BEGIN
    FOR d IN SELECT generate_series(today + from_day, today + 2, interval '1 day')::date LOOP
        name := format('message_history_%s', to_char(d, 'YYYYMMDD'));
        CONTINUE WHEN to_regclass('queue_pg.' || name) IS NOT NULL;
        BEGIN
            EXECUTE format('CREATE TABLE queue_pg.%I (LIKE queue_pg.message_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
            EXECUTE format('ALTER TABLE queue_pg.message_history ATTACH PARTITION queue_pg.%I FOR VALUES FROM (%L) TO (%L)',
                           name, (d::timestamp AT TIME ZONE 'UTC'), ((d + 1)::timestamp AT TIME ZONE 'UTC'));
        EXCEPTION WHEN lock_not_available OR check_violation OR duplicate_table OR invalid_object_definition THEN
            NULL;  -- busy, or the default partition holds rows of that day (they stay there)
        END;
    END LOOP;

    FOR part IN
        SELECT c.oid::regclass AS name, to_date(substring(c.relname FROM '(\d{8})$'), 'YYYYMMDD') AS day
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'queue_pg.message_history'::regclass
          AND c.relname ~ '^message_history_\d{8}$'
    LOOP
        IF ((part.day + 1)::timestamp AT TIME ZONE 'UTC') < at - queue_pg._seconds(keep) THEN
            BEGIN
                EXECUTE format('DROP TABLE %s', part.name);
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
        END IF;
    END LOOP;
END $$;

-- Deletes expired messages (a bounded batch; concurrent sweeps skip each other's rows) and keeps
-- history (_history_maintenance). Expiry follows the queue clock, which only the owner can move.
-- A caller who does not manage every queue sweeps only the queues it has a grant on (`scope`),
-- and leaves the work of all queues (rollups, tuning, the reap of every role's lost consumers)
-- to those who do: what a sweep deletes or updates stays locked while its transaction is open,
-- and a limited role may hold only rows of its own queues that way.
CREATE OR REPLACE FUNCTION queue_pg.sweep(max_rows integer DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := queue_pg._now();
    cnt bigint;
    scope integer[];  -- NULL: every queue
BEGIN
    PERFORM queue_pg._check('max_rows', max_rows, 1, 1000000, 'rows');
    IF queue_pg._denied(NULL, 'manage') IS NOT NULL THEN
        scope := ARRAY(SELECT q.id FROM queue_pg.queues q WHERE queue_pg._sees(q.id));
    END IF;
    WITH e AS (
        SELECT m.id FROM queue_pg.messages m
        WHERE m.expires_at <= at AND (scope IS NULL OR m.queue_id = ANY (scope))
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
    PERFORM queue_pg._history_maintenance(max_rows);
    -- samples for queue_stats, rollups, auto-tuning (sql/api/56_tuning.sql)
    PERFORM queue_pg._maintain(at, scope);
    PERFORM queue_pg._forget_writes(max_rows, scope);
    PERFORM queue_pg._forget_dedup(at, max_rows, scope);  -- sql/api/22_dedup.sql
    PERFORM queue_pg._forget_results(at, max_rows, scope);  -- sql/api/54_task_results.sql
    PERFORM queue_pg._forget_chords(max_rows, scope);  -- dead chords, sql/api/54_task_steps.sql
    PERFORM queue_pg._redrive_steps(max_rows, at);  -- redrive tasks, sql/api/57_redrive.sql
    IF scope IS NULL THEN
        -- lost consumers no limited role's reap looks at (sql/api/34_consumers.sql)
        PERFORM queue_pg.reap_consumers();
    END IF;
    RETURN cnt;
END $$;

-- The queues role `mover` may move messages into: those it may send to (SQS's move task needs
-- SendMessage on the destination). NULL: every queue (an admin, the owner, a superuser).
CREATE OR REPLACE FUNCTION queue_pg._movable_to(mover name) RETURNS integer[]
LANGUAGE plpgsql STABLE AS $$  -- plpgsql: _denied_to comes later (60_access.sql)
BEGIN
    IF queue_pg._denied_to(mover, NULL, 'create') IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN ARRAY(SELECT q.id FROM queue_pg.queues q WHERE queue_pg._denied_to(mover, q.id, 'send') IS NULL);
END $$;

DROP FUNCTION IF EXISTS queue_pg._move_back(integer, integer, bigint, timestamptz, timestamptz);

-- Moves up to `max` dead-lettered messages of queue dlq_id back, as if new (receive count
-- reset, visible now): to target_id, or each to the queue it came from (those whose source was
-- dropped stay, unless target_id is given). Only messages visible at `cutoff`, and only into
-- queues `mover` may send to (_movable_to): the others stay where they are; rows another
-- transaction holds are skipped. The one move of redrive and of the redrive tasks
-- (sql/api/57_redrive.sql), and of redrive_message (`ids`: only those); the number moved.
CREATE OR REPLACE FUNCTION queue_pg._move_back(dlq_id integer, target_id integer, max bigint,
                                               cutoff timestamptz, at timestamptz, mover name,
                                               ids bigint[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    cnt bigint;
    qids integer[];
    mids bigint[];
    mqids integer[];
    key bytea;
    allowed integer[] := queue_pg._movable_to(mover);
BEGIN
    WITH pick AS (
        SELECT m.id FROM queue_pg.messages m
        WHERE m.queue_id = dlq_id AND m.visible_at <= cutoff
          AND (m.source_queue_id IS NOT NULL OR target_id IS NOT NULL)
          AND (allowed IS NULL OR coalesce(target_id, m.source_queue_id) = ANY (allowed))
          AND (ids IS NULL OR m.id = ANY (ids))
        ORDER BY m.visible_at
        LIMIT max
        FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        UPDATE queue_pg.messages m SET
            queue_id = coalesce(target_id, m.source_queue_id), source_queue_id = NULL,
            visible_at = at, receive_count = 0, lease_no = m.lease_no + 1, lease_expiries = 0,
            released = false, first_received_at = NULL, last_received_at = NULL
        FROM pick WHERE m.id = pick.id
        RETURNING m.id, m.queue_id
    )
    SELECT count(*), array_agg(DISTINCT moved.queue_id), array_agg(moved.id), array_agg(moved.queue_id)
    INTO cnt, qids, mids, mqids FROM moved;
    -- a FIFO queue on either side: the groups move on and the moved join theirs (32_fifo.sql)
    IF EXISTS (SELECT 1 FROM queue_pg.queues q WHERE q.fifo AND q.id = ANY (qids || dlq_id)) THEN
        PERFORM queue_pg._fifo_moved(dlq_id, x,
                                     ARRAY(SELECT u.i FROM unnest(mids, mqids) u(i, d) WHERE u.d = x), at)
        FROM unnest(qids) x;
    END IF;
    key := queue_pg._key();
    PERFORM pg_notify(queue_pg._channel(x, key), '') FROM unnest(qids) x;
    RETURN cnt;
END $$;

-- The queue a move sends into (NULL: each message's source): moving messages into a queue is
-- sending to it, so it needs `send`. One rule for redrive and redrive_message.
CREATE OR REPLACE FUNCTION queue_pg._move_target(dest text) RETURNS queue_pg.queues
LANGUAGE plpgsql AS $$
BEGIN
    IF dest IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN queue_pg._queue(dest, 'send');
END $$;

-- SQS StartMessageMoveTask, synchronous: dead-lettered messages go back to the queue each came
-- from (or `to`), as if new: receive count reset, visible now. start_redrive (57_redrive.sql)
-- does it as a task, at a rate. Needs manage on dlq and send on `to`; without `to`, messages
-- whose source queue the caller may not send to stay in dlq.
CREATE OR REPLACE FUNCTION queue_pg.redrive(dlq text, "to" text DEFAULT NULL, "limit" integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    d queue_pg.queues := queue_pg._queue(dlq, 'manage');
    target queue_pg.queues := queue_pg._move_target("to");
    at timestamptz := queue_pg._now();
BEGIN
    IF "limit" IS NOT NULL THEN
        PERFORM queue_pg._check('limit', "limit", 1, 2147483647, 'messages');
    END IF;
    RETURN queue_pg._move_back(d.id, target.id, "limit", at, at, queue_pg._caller());
END $$;

-- One dead-lettered message of dlq back, as redrive moves them (a failed job retried by hand):
-- true if it moved; false if dlq holds no such message now (never was, moved on, or leased by
-- a consumer of dlq at this moment).
CREATE OR REPLACE FUNCTION queue_pg.redrive_message(dlq text, id bigint, "to" text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    d queue_pg.queues := queue_pg._queue(dlq, 'manage');
    target queue_pg.queues := queue_pg._move_target("to");
    at timestamptz := queue_pg._now();
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003', MESSAGE = 'id = NULL is invalid: name a message id';
    END IF;
    RETURN queue_pg._move_back(d.id, target.id, 1, at, at, queue_pg._caller(), ARRAY[id]) = 1;
END $$;

-- Revokes a job that has not started: deletes message `id` of `queue` unless a consumer holds
-- its lease now (a released retry waiting out its backoff has not started). True if deleted;
-- false if the queue holds no such message, or it runs: a lease is never taken away. Its history
-- row says 'purged', a purge of one.
-- Revoke: delete a message that has not started (waiting, delayed, or waiting out a retry's
-- backoff); with terminate, one a consumer holds now too: its next heartbeat or settle is
-- refused (a worker's process pool then kills the run).
CREATE OR REPLACE FUNCTION queue_pg.cancel_message(queue text, id bigint, terminate boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    at timestamptz := queue_pg._now();
    gone queue_pg.messages;
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003', MESSAGE = 'id = NULL is invalid: name a message id';
    END IF;
    IF terminate IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003', MESSAGE = 'terminate = NULL is invalid: true or false';
    END IF;
    IF q.fifo THEN  -- the group's row first, as a send locks it (the delete trigger moves it on)
        PERFORM 1 FROM queue_pg.fifo_groups f
        WHERE f.queue_id = q.id
          AND f.group_id = (SELECT m.group_id FROM queue_pg.messages m
                            WHERE m.id = cancel_message.id AND m.queue_id = q.id)
        FOR UPDATE;
    END IF;
    DELETE FROM queue_pg.messages t
    WHERE t.id = cancel_message.id AND t.queue_id = q.id
      AND (terminate OR NOT (t.visible_at > at AND t.last_received_at IS NOT NULL AND NOT t.released))
    RETURNING t.* INTO gone;
    IF gone.id IS NULL THEN
        RETURN false;
    END IF;
    IF q.history THEN
        INSERT INTO queue_pg.message_history
        SELECT (queue_pg._history_row(q, gone, 'purged', at)).*;
    END IF;
    RETURN true;
END $$;
