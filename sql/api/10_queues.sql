-- Queue configuration: create, alter, drop, list. Every setting is validated here and only here.

-- Refuses the first bad setting of a queue row (after defaults and changes are merged).
CREATE OR REPLACE FUNCTION queue_pg._validate(q queue_pg.queues) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF q.name IS NULL OR q.name !~ '^[A-Za-z0-9_-]{1,80}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('name = %s is invalid: allowed 1 to 80 characters of [A-Za-z0-9_-]',
                             coalesce(quote_literal(left(q.name, 100)), 'NULL'));
    END IF;
    PERFORM queue_pg._check('visibility_timeout', q.visibility_timeout, 0, queue_pg._max_lease_cap());
    IF q.message_ttl IS NOT NULL AND (q.message_ttl <= 0 OR q.message_ttl = 'NaN' OR q.message_ttl > queue_pg._max_ttl()) THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('message_ttl = %s is out of range: allowed a positive number of seconds up to %s (100 years), or NULL for never',
                             q.message_ttl, queue_pg._fmt(queue_pg._max_ttl()));
    END IF;
    PERFORM queue_pg._check('delay', q.delay, 0, queue_pg._max_lease_cap());
    IF q.delay >= q.message_ttl THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('delay = %s is out of range: it must be less than message_ttl = %s seconds (every message would expire unseen)',
                             queue_pg._fmt(q.delay), queue_pg._fmt(q.message_ttl));
    END IF;
    PERFORM queue_pg._check('max_message_size', q.max_message_size, 1024, 16777216, 'bytes');
    PERFORM queue_pg._check('receive_wait', q.receive_wait, 0, 20);
    PERFORM queue_pg._check('max_lease', q.max_lease, 1, queue_pg._max_lease_cap());
    IF q.visibility_timeout > q.max_lease THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('visibility_timeout = %s is out of range: it may not exceed max_lease = %s seconds',
                             queue_pg._fmt(q.visibility_timeout), queue_pg._fmt(q.max_lease));
    END IF;
    IF (q.dead_letter_queue IS NULL) <> (q.max_receive_count IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('dead_letter_queue = %s and max_receive_count = %s: set both or neither',
                             coalesce(quote_literal(left(q.dead_letter_queue, 100)), 'NULL'),
                             coalesce(q.max_receive_count::text, 'NULL'));
    END IF;
    IF q.max_receive_count IS NOT NULL THEN
        PERFORM queue_pg._check('max_receive_count', q.max_receive_count, 1, 1000, 'receives');
        IF q.dead_letter_queue = q.name THEN
            RAISE EXCEPTION USING ERRCODE = 'QP003',
                MESSAGE = format('dead_letter_queue = %s is invalid: a queue cannot be its own dead-letter queue',
                                 quote_literal(q.dead_letter_queue));
        END IF;
        IF NOT EXISTS (SELECT 1 FROM queue_pg.queues WHERE name = q.dead_letter_queue) THEN
            RAISE EXCEPTION USING ERRCODE = 'QP003',
                MESSAGE = format('dead_letter_queue = %s is invalid: no such queue; create it first',
                                 quote_literal(left(q.dead_letter_queue, 100)));
        END IF;
    END IF;
    IF q.in_flight_limit IS NOT NULL THEN
        PERFORM queue_pg._check('in_flight_limit', q.in_flight_limit, 1, 10000000, 'messages');
    END IF;
    IF q.history IS NULL THEN
        PERFORM queue_pg._raise('QP003', 'history = NULL is invalid: allowed true or false');
    END IF;
    PERFORM queue_pg._check('history_retention', q.history_retention, 3600, queue_pg._max_ttl());
    IF q.fifo IS NULL OR q.fair IS NULL OR (q.fifo AND q.fair) THEN  -- sql/api/32_fifo.sql
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('fifo = %s and fair = %s are invalid: allowed true or false, not both true (a FIFO queue serves each group in order, a fair queue shares among tenants)',
                             coalesce(q.fifo::text, 'NULL'), coalesce(q.fair::text, 'NULL'));
    END IF;
    -- deduplication (sql/api/22_dedup.sql)
    IF q.content_dedup IS NULL THEN
        PERFORM queue_pg._raise('QP003', 'content_dedup = NULL is invalid: allowed true or false');
    END IF;
    PERFORM queue_pg._check('dedup_window', q.dedup_window, 1, 604800);
    -- whether a receive's commit waits for its WAL flush (revision 0022, docs/guarantees.md)
    PERFORM queue_pg._check_choice('lease_durability', q.lease_durability, ARRAY['durable', 'relaxed']);
END $$;

-- Keeps the in-flight counter row in step with the queue's in_flight_limit.
CREATE OR REPLACE FUNCTION queue_pg._sync_in_flight(q queue_pg.queues) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF q.in_flight_limit IS NULL THEN
        DELETE FROM queue_pg.in_flight WHERE queue_id = q.id;
    ELSE
        INSERT INTO queue_pg.in_flight (queue_id, n)
        VALUES (q.id, queue_pg._in_flight_exact(q, queue_pg._now()))
        ON CONFLICT (queue_id) DO NOTHING;
    END IF;
END $$;

-- Received-not-deleted messages whose lease has not lapsed, counted no further than the limit.
-- A planned retry waiting out its backoff (change_visibility release => true) is not in
-- flight: like a delayed message, it holds no slot of in_flight_limit (nor of a task's
-- max_running) until a receive takes it again.
CREATE OR REPLACE FUNCTION queue_pg._in_flight_exact(q queue_pg.queues, at timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM (
        SELECT 1 FROM queue_pg.messages m
        WHERE m.queue_id = q.id AND m.visible_at > at AND m.last_received_at IS NOT NULL
          AND NOT m.released
        LIMIT coalesce(q.in_flight_limit, 2147483647)
    ) s
$$;

-- Per-queue sequences of the fast paths (sequences: they change on every receive or send and
-- leave no row versions behind). notified_<id>: when the last NOTIFY went out (see _wake).
-- sent, received, deleted: flow counters, each as units, tens and hundreds (see _count_flow).
-- The claim floor of a queue: where a receive's index scan starts. Every receive leaves the old
-- version of each message it leases at the head of the claim index, and every delete leaves a
-- dead one; while any snapshot older than them is open (a long transaction anywhere in the
-- database), vacuum may remove none, and a scan from the start walks them all. A receive starts
-- at the floor instead: the visible_at of the newest message the last receive took, kept in a
-- sequence because it changes with every receive and a sequence leaves no row versions behind.
-- Messages below the floor (a sending transaction that committed late, a receive rolled back)
-- are found by the one full scan per second per queue, or at once when the floor range has too
-- few messages to fill the receive.
CREATE OR REPLACE FUNCTION queue_pg._sequence_kinds() RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$ SELECT array['claim_floor', 'claim_rescan', 'notified',
                           'sent', 'sent_x10', 'sent_x100', 'received', 'received_x10', 'received_x100',
                           'deleted', 'deleted_x10', 'deleted_x100', 'stale_receipts'] $$;

-- Creates (create => true) the missing per-queue sequences, or drops them (see _sequence), in
-- the order of _sequence_kinds. The lock order of a queue's DDL and its maintenance: drop_queue
-- holds the queue's row (FOR UPDATE) before it drops them; a sweep or tune that writes rows
-- naming a queue takes its row first (FOR SHARE SKIP LOCKED: a queue being dropped is skipped;
-- not FOR KEY SHARE, which ignores SKIP LOCKED on a row version newer than its snapshot and
-- waits for the drop, while the drop may wait for rows that sweep holds), and every reader
-- that takes no row reads the flows (sent, received, deleted) before stale_receipts, the order
-- in which they are dropped: no wait goes round in a circle.
CREATE OR REPLACE FUNCTION queue_pg._queue_sequences(queue_id integer, "create" boolean)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    kind text;
BEGIN
    FOREACH kind IN ARRAY queue_pg._sequence_kinds() LOOP
        IF NOT "create" THEN
            EXECUTE format('DROP SEQUENCE IF EXISTS queue_pg.%s_%s', kind, queue_id);
        ELSIF to_regclass(format('queue_pg.%s_%s', kind, queue_id)) IS NULL THEN
            -- a kind ending in _x<n> counts n at a time (see _count_flow)
            EXECUTE format('CREATE SEQUENCE queue_pg.%s_%s INCREMENT %s MINVALUE 0 START %s', kind, queue_id,
                           coalesce(substring(kind FROM '_x(\d+)$'), '1'), coalesce(substring(kind FROM '_x(\d+)$'), '1'));
        END IF;
    END LOOP;
END $$;

-- Queues created before a kind existed get its sequence on upgrade.
DO $$ BEGIN PERFORM queue_pg._queue_sequences(id, true) FROM queue_pg.queues; END $$;

CREATE OR REPLACE FUNCTION queue_pg.create_queue(
    name text,
    visibility_timeout double precision DEFAULT 30,
    message_ttl double precision DEFAULT 345600,
    delay double precision DEFAULT 0,
    max_message_size integer DEFAULT 1048576,
    receive_wait double precision DEFAULT 0,
    max_lease double precision DEFAULT 43200,
    dead_letter_queue text DEFAULT NULL,
    max_receive_count integer DEFAULT NULL,
    in_flight_limit integer DEFAULT NULL,
    history boolean DEFAULT true,
    history_retention double precision DEFAULT 604800,
    fifo boolean DEFAULT false,
    fair boolean DEFAULT false,
    content_dedup boolean DEFAULT false,
    dedup_window double precision DEFAULT 300,
    lease_durability text DEFAULT 'durable'
) RETURNS SETOF queue_pg.queues
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues;
    old queue_pg.queues;
    diff text;
BEGIN
    PERFORM queue_pg._authorize(NULL, create_queue.name, 'create');
    q.name := create_queue.name;
    q.visibility_timeout := create_queue.visibility_timeout;
    q.message_ttl := create_queue.message_ttl;
    q.delay := create_queue.delay;
    q.max_message_size := create_queue.max_message_size;
    q.receive_wait := create_queue.receive_wait;
    q.max_lease := create_queue.max_lease;
    q.dead_letter_queue := create_queue.dead_letter_queue;
    q.max_receive_count := create_queue.max_receive_count;
    q.in_flight_limit := create_queue.in_flight_limit;
    q.history := create_queue.history;
    q.history_retention := create_queue.history_retention;
    q.fifo := create_queue.fifo;
    q.fair := create_queue.fair;
    q.content_dedup := create_queue.content_dedup;
    q.dedup_window := create_queue.dedup_window;
    q.lease_durability := create_queue.lease_durability;
    PERFORM queue_pg._validate(q);
    IF q.dead_letter_queue IS NOT NULL THEN  -- the dead-letter queue's own say (57_redrive.sql)
        PERFORM queue_pg._check_redrive_allow(q.name, q.dead_letter_queue);
    END IF;

    INSERT INTO queue_pg.queues AS t (name, visibility_timeout, message_ttl, delay, max_message_size,
        receive_wait, max_lease, dead_letter_queue, max_receive_count, in_flight_limit, history,
        history_retention, fifo, fair, content_dedup, dedup_window, lease_durability)
    VALUES (q.name, q.visibility_timeout, q.message_ttl, q.delay, q.max_message_size, q.receive_wait,
        q.max_lease, q.dead_letter_queue, q.max_receive_count, q.in_flight_limit, q.history,
        q.history_retention, q.fifo, q.fair, q.content_dedup, q.dedup_window, q.lease_durability)
    ON CONFLICT ON CONSTRAINT queues_name_key DO NOTHING
    RETURNING t.* INTO old;

    IF old.id IS NOT NULL THEN  -- created now
        PERFORM queue_pg._queue_sequences(old.id, true);
        PERFORM queue_pg._sync_in_flight(old);
        RETURN NEXT old;
        RETURN;
    END IF;

    -- It exists: the same settings make this a no-op, others an error that names them.
    old := queue_pg._queue(q.name);
    SELECT string_agg(format('%s = %s (asked %s)', k, coalesce(o, 'NULL'), coalesce(n, 'NULL')), ', ')
    INTO diff
    FROM (VALUES
        ('visibility_timeout', old.visibility_timeout::text, q.visibility_timeout::text),
        ('message_ttl', old.message_ttl::text, q.message_ttl::text),
        ('delay', old.delay::text, q.delay::text),
        ('max_message_size', old.max_message_size::text, q.max_message_size::text),
        ('receive_wait', old.receive_wait::text, q.receive_wait::text),
        ('max_lease', old.max_lease::text, q.max_lease::text),
        ('dead_letter_queue', old.dead_letter_queue, q.dead_letter_queue),
        ('max_receive_count', old.max_receive_count::text, q.max_receive_count::text),
        ('in_flight_limit', old.in_flight_limit::text, q.in_flight_limit::text),
        ('history', old.history::text, q.history::text),
        ('history_retention', old.history_retention::text, q.history_retention::text),
        ('fifo', old.fifo::text, q.fifo::text),
        ('fair', old.fair::text, q.fair::text),
        ('content_dedup', old.content_dedup::text, q.content_dedup::text),
        ('dedup_window', old.dedup_window::text, q.dedup_window::text),
        ('lease_durability', old.lease_durability, q.lease_durability)
    ) AS s(k, o, n)
    WHERE o IS DISTINCT FROM n;
    IF diff IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP002',
            MESSAGE = format('queue %s already exists with other settings: %s', quote_literal(q.name), diff);
    END IF;
    RETURN NEXT old;
END $$;

-- Changes the given settings; NULL leaves one as it is, `clear` sets nullable ones to NULL.
CREATE OR REPLACE FUNCTION queue_pg.alter_queue(
    name text,
    visibility_timeout double precision DEFAULT NULL,
    message_ttl double precision DEFAULT NULL,
    delay double precision DEFAULT NULL,
    max_message_size integer DEFAULT NULL,
    receive_wait double precision DEFAULT NULL,
    max_lease double precision DEFAULT NULL,
    dead_letter_queue text DEFAULT NULL,
    max_receive_count integer DEFAULT NULL,
    in_flight_limit integer DEFAULT NULL,
    history boolean DEFAULT NULL,
    history_retention double precision DEFAULT NULL,
    fifo boolean DEFAULT NULL,
    fair boolean DEFAULT NULL,
    content_dedup boolean DEFAULT NULL,
    dedup_window double precision DEFAULT NULL,
    lease_durability text DEFAULT NULL,
    clear text[] DEFAULT NULL
) RETURNS SETOF queue_pg.queues
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues;
    c text;
BEGIN
    SELECT * INTO q FROM queue_pg.queues WHERE queues.name = alter_queue.name FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM queue_pg._queue(alter_queue.name);
    END IF;
    PERFORM queue_pg._authorize(q.id, q.name, 'manage');
    -- Whole days of history are dropped past the longest retention of any queue: a retention
    -- beyond the managers' cap keeps every queue's days, so only an admin (or the owner) sets it.
    IF alter_queue.history_retention > queue_pg._manager_retention_cap()
       AND alter_queue.history_retention IS DISTINCT FROM q.history_retention
       AND queue_pg._denied(NULL, 'create') IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('history_retention = %s is out of range: allowed 3600 to %s seconds (30 days) for a manager of queue %s; a longer one keeps every queue''s history, so a member of queue_pg_admin sets it',
                             alter_queue.history_retention, queue_pg._fmt(queue_pg._manager_retention_cap()),
                             quote_literal(q.name));
    END IF;
    q.visibility_timeout := coalesce(alter_queue.visibility_timeout, q.visibility_timeout);
    q.message_ttl := coalesce(alter_queue.message_ttl, q.message_ttl);
    q.delay := coalesce(alter_queue.delay, q.delay);
    q.max_message_size := coalesce(alter_queue.max_message_size, q.max_message_size);
    q.receive_wait := coalesce(alter_queue.receive_wait, q.receive_wait);
    q.max_lease := coalesce(alter_queue.max_lease, q.max_lease);
    q.dead_letter_queue := coalesce(alter_queue.dead_letter_queue, q.dead_letter_queue);
    q.max_receive_count := coalesce(alter_queue.max_receive_count, q.max_receive_count);
    q.in_flight_limit := coalesce(alter_queue.in_flight_limit, q.in_flight_limit);
    q.history := coalesce(alter_queue.history, q.history);
    q.history_retention := coalesce(alter_queue.history_retention, q.history_retention);
    IF alter_queue.fifo IS DISTINCT FROM q.fifo AND alter_queue.fifo IS NOT NULL THEN
        -- SQS: FifoQueue is set at create only; the waiting messages' state depends on it
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('fifo = %s is invalid: fifo is fixed when the queue is created (queue %s has fifo = %s)',
                             alter_queue.fifo::text, quote_literal(q.name), q.fifo::text);
    END IF;
    q.fair := coalesce(alter_queue.fair, q.fair);
    q.content_dedup := coalesce(alter_queue.content_dedup, q.content_dedup);
    q.dedup_window := coalesce(alter_queue.dedup_window, q.dedup_window);
    q.lease_durability := coalesce(alter_queue.lease_durability, q.lease_durability);
    FOREACH c IN ARRAY coalesce(clear, '{}') LOOP
        CASE c
            WHEN 'message_ttl' THEN q.message_ttl := NULL;
            WHEN 'dead_letter_queue', 'max_receive_count' THEN
                q.dead_letter_queue := NULL; q.max_receive_count := NULL;
            WHEN 'in_flight_limit' THEN q.in_flight_limit := NULL;
            ELSE
                PERFORM queue_pg._check_choice('clear', c, ARRAY['message_ttl', 'dead_letter_queue',
                                                                 'max_receive_count', 'in_flight_limit']);
        END CASE;
    END LOOP;
    PERFORM queue_pg._validate(q);
    IF alter_queue.dead_letter_queue IS NOT NULL THEN  -- linking queues: manage both
        PERFORM queue_pg._queue(alter_queue.dead_letter_queue, 'manage');
        PERFORM queue_pg._check_redrive_allow(q.name, alter_queue.dead_letter_queue);
    END IF;
    UPDATE queue_pg.queues t SET
        visibility_timeout = q.visibility_timeout, message_ttl = q.message_ttl, delay = q.delay,
        max_message_size = q.max_message_size, receive_wait = q.receive_wait, max_lease = q.max_lease,
        dead_letter_queue = q.dead_letter_queue, max_receive_count = q.max_receive_count,
        in_flight_limit = q.in_flight_limit, history = q.history, history_retention = q.history_retention,
        fair = q.fair,
        content_dedup = q.content_dedup, dedup_window = q.dedup_window,
        lease_durability = q.lease_durability
    WHERE t.id = q.id;
    PERFORM queue_pg._sync_in_flight(q);
    RETURN NEXT q;
END $$;

CREATE OR REPLACE FUNCTION queue_pg.drop_queue(name text, if_exists boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues;
    users text;
BEGIN
    SELECT * INTO q FROM queue_pg.queues WHERE queues.name = drop_queue.name FOR UPDATE;
    IF NOT FOUND THEN
        IF if_exists THEN
            RETURN false;
        END IF;
        PERFORM queue_pg._queue(drop_queue.name);
    END IF;
    PERFORM queue_pg._authorize(q.id, q.name, 'manage');
    SELECT string_agg(quote_literal(u.name), ', ') INTO users
    FROM queue_pg.queues u WHERE u.dead_letter_queue = q.name;
    IF users IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP010',
            MESSAGE = format('queue %s is the dead_letter_queue of %s; alter or drop those first',
                             quote_literal(q.name), users);
    END IF;
    -- The sequences go first: dropping them waits for the sends into the queue still in
    -- progress (see _hold), so their messages are seen and deleted here; a send that comes
    -- later waits for this transaction and then fails.
    PERFORM queue_pg._queue_sequences(q.id, false);
    DELETE FROM queue_pg.messages WHERE queue_id = q.id;
    UPDATE queue_pg.messages SET source_queue_id = NULL WHERE source_queue_id = q.id;
    DELETE FROM queue_pg.queues WHERE id = q.id;
    RETURN true;
END $$;

-- The queues the caller has some grant on (every queue for admins and the owner: _sees, the
-- rule of every listing and view), so no surface built on it (SQS ListQueues, the dashboard,
-- the CLI) shows a role another queue's name or settings.
CREATE OR REPLACE FUNCTION queue_pg.list_queues() RETURNS SETOF queue_pg.queues
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY SELECT * FROM queue_pg.queues q WHERE queue_pg._sees(q.id) ORDER BY q.name;
END $$;

-- A queue's settings: QueueNotFound, or AccessDenied without a grant on it (_queue_seen).
CREATE OR REPLACE FUNCTION queue_pg.get_queue(name text) RETURNS SETOF queue_pg.queues
LANGUAGE plpgsql STABLE AS $$ BEGIN RETURN NEXT queue_pg._queue_seen(name); END $$;
