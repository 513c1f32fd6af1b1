-- Receiving: claim visible messages with FOR UPDATE SKIP LOCKED and lease them.

-- Moves messages of q to its dead-letter queue: same id, source recorded, a new lease number so
-- every old receipt is stale, one history row each, and a NOTIFY for the dead-letter queue.
CREATE OR REPLACE FUNCTION queue_pg._dead_letter(q queue_pg.queues, ids bigint[], n timestamptz,
                                                 reason text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    moved queue_pg.messages;
    cnt integer := 0;
    key bytea;
BEGIN
    FOR moved IN
        UPDATE queue_pg.messages t SET
            queue_id = d.id, source_queue_id = q.id, visible_at = n, lease_no = t.lease_no + 1,
            lease_expiries = t.lease_expiries + (t.visible_at <= n AND NOT t.released)::int,
            released = false,
            attributes = CASE WHEN reason IS NULL THEN t.attributes
                              ELSE coalesce(t.attributes, '{}') || jsonb_build_object('dead_letter_reason', reason) END
        FROM queue_pg.queues d
        WHERE d.name = q.dead_letter_queue AND t.id = ANY (ids)
        RETURNING t.*
    LOOP
        PERFORM queue_pg._history(q, moved, 'dead_lettered', n);
        cnt := cnt + 1;
    END LOOP;
    -- FIFO groups on either side move on (sql/api/32_fifo.sql)
    PERFORM queue_pg._fifo_moved(q.id, d.id, ids, n) FROM queue_pg.queues d
    WHERE d.name = q.dead_letter_queue AND (q.fifo OR d.fifo) AND cnt > 0;
    key := queue_pg._key();
    PERFORM pg_notify(queue_pg._channel(d.id, key), '') FROM queue_pg.queues d
    WHERE d.name = q.dead_letter_queue AND cnt > 0;
    RETURN cnt;
END $$;

-- Messages of q in flight, for a caller about to put `want` more in flight: the counter row,
-- locked until the transaction ends. The counter is an upper bound (a lapsed lease is not
-- subtracted); when it says the limit would be passed, count exactly, no further than the
-- limit, and store the truth. NULL when another transaction holds the row for longer than
-- `patience` seconds (a receive kept open in a transaction, whose claims nobody else can
-- count): the caller answers "full" instead of waiting for that transaction to end. The row is
-- taken with SKIP LOCKED and tried again after a short sleep, so no call waits on a lock.
DROP FUNCTION IF EXISTS queue_pg._in_flight_held(queue_pg.queues, timestamptz, integer);  -- before patience
CREATE OR REPLACE FUNCTION queue_pg._in_flight_held(q queue_pg.queues, n timestamptz, want integer,
                                                    patience double precision DEFAULT 1)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    held bigint;
    until timestamptz;
    nap double precision := 0.001;
BEGIN
    LOOP
        SELECT f.n INTO held FROM queue_pg.in_flight f WHERE f.queue_id = q.id FOR UPDATE SKIP LOCKED;
        EXIT WHEN FOUND OR NOT EXISTS (SELECT 1 FROM queue_pg.in_flight f WHERE f.queue_id = q.id);
        until := coalesce(until, clock_timestamp() + queue_pg._seconds(patience));
        IF clock_timestamp() >= until THEN
            RETURN NULL;
        END IF;
        PERFORM pg_sleep(nap);
        nap := least(nap * 2, 0.02);
    END LOOP;
    IF held IS NULL OR held + want > q.in_flight_limit THEN
        held := queue_pg._in_flight_exact(q, n);
        INSERT INTO queue_pg.in_flight AS f (queue_id, n) VALUES (q.id, held)
        ON CONFLICT (queue_id) DO UPDATE SET n = excluded.n;
    END IF;
    RETURN held;
END $$;

-- Takes `k` leases off q's in-flight counter (an upper bound): skipped when another transaction
-- holds the row, so a delete or release never waits for a receive kept open; the counter then
-- stays high, and the exact count corrects it when it reaches the limit.
-- plpgsql: its plan is kept for the session (a sql function's statement is planned every call).
CREATE OR REPLACE FUNCTION queue_pg._in_flight_less(queue_id integer, k bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE queue_pg.in_flight f SET n = greatest(f.n - k, 0)
    WHERE f.queue_id = _in_flight_less.queue_id
      AND f.ctid = (SELECT x.ctid FROM queue_pg.in_flight x WHERE x.queue_id = _in_flight_less.queue_id
                    FOR UPDATE SKIP LOCKED);
END $$;

CREATE OR REPLACE FUNCTION queue_pg._in_flight_full(q queue_pg.queues, held bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF held IS NULL THEN  -- _in_flight_held ran out of patience
        RAISE EXCEPTION USING ERRCODE = 'QP008',
            MESSAGE = format('queue %s has its in-flight count held by a transaction still open: in_flight_limit = %s counts as reached until it ends',
                             quote_literal(q.name), q.in_flight_limit),
            HINT = 'a receive inside a transaction left open holds the count; end that transaction';
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'QP008',
        MESSAGE = format('queue %s has %s messages in flight: in_flight_limit = %s is reached',
                         quote_literal(q.name), held, q.in_flight_limit);
END $$;

-- One claim attempt. Dead-letters claimed messages that used up their receives (SQS: the receive
-- after the last allowed one moves the message instead of returning it); returns the rest leased.
-- The claim must walk the claim index in order whatever the statistics say: they are always
-- behind (visible_at only grows), and a planner that believes the range nearly empty picks a
-- bitmap scan and a sort of the whole backlog (67 ms for 10 of 200,000 messages, measured).
-- Hence no bitmap scans and no sorts in here (tests/test_plans.py).
-- undo_fruitless: an attempt that finds nothing to do raises QP900 (caught by _receive), so the
-- subtransaction it runs in is rolled back and its row locks (the in-flight counter's) released.
CREATE OR REPLACE FUNCTION queue_pg._claim(q queue_pg.queues, max_messages integer,
                                           vt double precision, long_poll boolean,
                                           undo_fruitless boolean DEFAULT false,
                                           consumer integer DEFAULT NULL)
RETURNS SETOF queue_pg.message
LANGUAGE plpgsql SET enable_bitmapscan = off SET enable_sort = off AS $$
DECLARE
    n timestamptz := queue_pg._now();
    want integer := max_messages;
    held bigint;
    ids bigint[];
    dead bigint[];
    lapsed integer;
    token text;  -- a relaxed lease's token (00_util.sql): one per claim, so _receipt stays inlined
    got integer;
    floor_seq regclass := queue_pg._sequence('claim_floor', q.id);
    rescan_seq regclass := queue_pg._sequence('claim_rescan', q.id);
    floor_at timestamptz;
    top timestamptz;
    found_n integer;
    real_us bigint := queue_pg._micros(clock_timestamp());
    mark bigint;  -- the rescan mark, then setval's value (setval is assigned: PERFORM would run a statement)
BEGIN
    IF q.in_flight_limit IS NOT NULL THEN
        -- a server-side poll tries again in 50 ms anyway: it does not wait for the row
        held := queue_pg._in_flight_held(q, n, want, CASE WHEN undo_fruitless THEN 0 ELSE 1 END);
        IF held IS NULL OR held >= q.in_flight_limit THEN
            IF undo_fruitless THEN
                RAISE EXCEPTION USING ERRCODE = 'QP900', MESSAGE = 'fruitless claim attempt';
            ELSIF long_poll THEN
                RETURN;
            END IF;
            PERFORM queue_pg._in_flight_full(q, held);
        END IF;
        want := least(want, q.in_flight_limit - held);
    END IF;

    -- Where the scan starts (see _sequence_kinds): from the floor, except once a second per
    -- queue, when one claim scans from the start to pick up stragglers the floor has passed.
    -- Both sequences follow the real clock, whatever the session's: a mark in the future (from
    -- a moved clock) counts as due, so it heals at the next claim.
    mark := coalesce(pg_sequence_last_value(rescan_seq), 0);
    IF mark < real_us - 1000000 OR mark > real_us THEN
        mark := setval(rescan_seq, real_us);
    ELSE
        floor_at := queue_pg._from_micros(pg_sequence_last_value(floor_seq));
    END IF;

    -- A claim that found only messages to dead-letter tries again, a bounded number of times.
    FOR attempt IN 1..4 LOOP
        LOOP
            IF q.fair THEN  -- tenants with few in flight first (sql/api/32_fifo.sql)
                SELECT array_agg(c.id),
                       array_agg(c.id) FILTER (WHERE c.receive_count >= q.max_receive_count),
                       count(*) FILTER (WHERE c.receive_count > 0 AND NOT c.released),
                       max(c.visible_at), count(*)
                INTO ids, dead, lapsed, top, found_n
                FROM queue_pg._fair_claim(q, want, n) c;
                EXIT;
            END IF;
            IF q.fifo THEN  -- heads, each with its group's next messages (sql/api/32_fifo.sql)
                SELECT array_agg(c.id),
                       array_agg(c.id) FILTER (WHERE c.receive_count >= q.max_receive_count),
                       count(*) FILTER (WHERE c.receive_count > 0 AND NOT c.released),
                       max(c.visible_at), count(*)
                INTO ids, dead, lapsed, top, found_n
                FROM queue_pg._fifo_claim(q, want, n, floor_at) c;
                EXIT WHEN found_n = want OR floor_at IS NULL;
                floor_at := NULL;
                CONTINUE;
            END IF;
            SELECT array_agg(c.id),
                   array_agg(c.id) FILTER (WHERE c.receive_count >= q.max_receive_count),
                   count(*) FILTER (WHERE c.receive_count > 0 AND NOT c.released),
                   max(c.visible_at), count(*)
            INTO ids, dead, lapsed, top, found_n
            FROM (
                SELECT m.id, m.receive_count, m.released, m.visible_at
                FROM queue_pg.messages m
                WHERE m.queue_id = q.id AND m.visible_at <= n
                  AND m.visible_at >= coalesce(floor_at, '-infinity')
                  AND (m.expires_at IS NULL OR m.expires_at > n)
                ORDER BY m.visible_at
                LIMIT want
                FOR UPDATE SKIP LOCKED
            ) c;
            -- Too few above the floor: look below it too before answering "nothing".
            EXIT WHEN found_n = want OR floor_at IS NULL;
            floor_at := NULL;
        END LOOP;
        IF ids IS NULL THEN
            IF undo_fruitless AND attempt = 1 THEN
                RAISE EXCEPTION USING ERRCODE = 'QP900', MESSAGE = 'fruitless claim attempt';
            END IF;
            RETURN;
        END IF;
        -- Every visible message below `top` is now taken or locked by another claim: later
        -- claims may start there. A full scan may lower the floor, a floor scan only raise it.
        IF floor_at IS NULL OR top > floor_at THEN
            mark := setval(floor_seq, least(queue_pg._micros(top), real_us));
        END IF;
        IF lapsed > 0 THEN
            INSERT INTO queue_pg.queue_counters AS c (queue_id, lease_expiries)
            VALUES (q.id, lapsed)
            ON CONFLICT (queue_id) DO UPDATE SET lease_expiries = c.lease_expiries + excluded.lease_expiries;
        END IF;
        EXIT WHEN dead IS NULL;
        PERFORM queue_pg._dead_letter(q, dead, n, NULL);
        ids := ARRAY(SELECT i FROM unnest(ids) i WHERE i <> ALL (dead));  -- claim order kept
        EXIT WHEN cardinality(ids) > 0;
    END LOOP;
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    -- A queue's start rate (sql/api/53_task_limits.sql); queues without one
    -- skip this (their options have no rate_limit). Claimed rows past the rate stay untouched.
    IF q.options ? 'rate_limit' THEN
        ids := ids[1:queue_pg._rate_take(q.id, cardinality(ids), n)];
        IF cardinality(ids) = 0 THEN
            IF undo_fruitless THEN
                RAISE EXCEPTION USING ERRCODE = 'QP900', MESSAGE = 'fruitless claim attempt';
            END IF;
            RETURN;
        END IF;
    END IF;

    token := CASE WHEN q.lease_durability = 'relaxed' THEN queue_pg._lease_token(n) END;
    -- lease_policy 'per_type' (only when the receive left out visibility_timeout, see _receive):
    -- each message's lease is its type's from queue_pg.type_leases, else vt.
    UPDATE queue_pg.messages t SET
        visible_at = n + queue_pg._seconds(CASE WHEN q.lease_policy = 'per_type'
            THEN least(q.max_lease, coalesce((SELECT l.lease FROM queue_pg.type_leases l
                                              WHERE l.queue_id = q.id AND l.type = left(t.attributes ->> 'type', 100)), vt))
            ELSE vt END),
        receive_count = t.receive_count + 1,
        lease_no = t.lease_no + 1,
        lease_expiries = t.lease_expiries + (t.receive_count > 0 AND NOT t.released)::int,
        released = false,
        first_received_at = coalesce(t.first_received_at, n),
        last_received_at = n,
        consumer_id = consumer  -- whose lease (sql/api/34_consumers.sql)
    WHERE t.id = ANY (ids);
    GET DIAGNOSTICS got = ROW_COUNT;
    -- Returned in claim order (oldest first), which UPDATE ... RETURNING does not keep: read
    -- back by primary key in the order of ids, which the nested loop over ids gives without a
    -- sort (the planner keeps the ORDER BY). Measured on a receive of 100: a join of
    -- RETURNING's rows back to ids was a nested loop over the materialized rows, n² comparisons
    -- (1.2 ms more server CPU a call); sorting them (an aggregate or a Sort node, which under
    -- this function's enable_sort = off also costs 1e10 and sets off JIT) cost 10 % of the
    -- receive; this second read costs what the unordered RETURNING did, within noise.
    -- The install's secret (as _key reads it) is read here, not in a statement of its own.
    RETURN QUERY
    SELECT t.id, q.name, t.body, t.attributes, queue_pg._receipt(q.id, t.id, t.lease_no, k.key, token),
           t.receive_count, t.enqueued_at, t.first_received_at, t.visible_at, t.expires_at
    FROM unnest(ids) WITH ORDINALITY o(id, i) JOIN queue_pg.messages t ON t.id = o.id
    CROSS JOIN (SELECT s.key FROM queue_pg.secret s OFFSET 0) k
    ORDER BY o.i;
    got := queue_pg._count_flow('received', q.id, got);  -- an assignment: no statement to run
    IF q.in_flight_limit IS NOT NULL AND got > 0 AND vt > 0 THEN
        UPDATE queue_pg.in_flight f SET n = f.n + got WHERE f.queue_id = q.id;
    END IF;
END $$;

-- The body of receive. poll => false makes one attempt and never sleeps: the Python client
-- waits on LISTEN/NOTIFY between attempts instead, with `wait` still checked here.
CREATE OR REPLACE FUNCTION queue_pg._receive(
    queue text,
    max_messages integer,
    visibility_timeout double precision,
    wait double precision,
    poll boolean,
    "delete" text[] DEFAULT NULL,
    consumer integer DEFAULT NULL
) RETURNS SETOF queue_pg.message
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'receive');
    vt double precision := coalesce(visibility_timeout, q.visibility_timeout);
    w double precision := coalesce(wait, q.receive_wait);
    deadline timestamptz;
    bad integer;  -- the first forged entry of `delete`, by position
    got boolean;
    known boolean;  -- whether the consumer has received from the queue before
BEGIN
    -- The four checks (in this order) in one expression, an assignment: plpgsql evaluates it
    -- without starting the executor (a statement's start is most of a check's cost, and a
    -- receive's fixed cost is what bounds a worker). A check returns its value or raises;
    -- the operands of + and AND are evaluated left to right.
    known := queue_pg._check('max_messages', max_messages, 1, 1000, 'messages')
             + queue_pg._check('visibility_timeout', vt, 0, queue_pg._max_lease_cap())
             + queue_pg._check('wait', w, 0, 20) >= 0
             AND queue_pg._consumer_on(consumer, q.id);  -- sql/api/34_consumers.sql
    IF NOT known THEN  -- the consumer's first receive on this queue
        PERFORM queue_pg._consumer_add_queue(consumer, q.id);
    END IF;
    IF q.lease_durability = 'relaxed' THEN  -- no WAL flush wait at commit (00_util.sql)
        PERFORM queue_pg._relax_commit();
    END IF;
    IF visibility_timeout IS NOT NULL THEN  -- an explicit lease overrides a per-type one
        q.lease_policy := 'fixed';
    END IF;
    IF vt > q.max_lease THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('visibility_timeout = %s is out of range: it may not exceed max_lease = %s seconds of queue %s',
                             queue_pg._fmt(vt), queue_pg._fmt(q.max_lease), quote_literal(q.name));
    END IF;
    -- The finished batch goes first, in the same transaction: one round trip and one commit
    -- per batch. Refusals are not raised (a stale receipt is counted, as in delete_batch).
    IF cardinality("delete") > 0 THEN  -- assignments: no statement runs on the usual path
        bad := array_position(queue_pg._delete_receipts(q, "delete", 'delete'), 'InvalidReceipt');
        IF bad IS NOT NULL THEN
            PERFORM queue_pg._invalid_receipt(q.name, "delete"[bad]);
        END IF;
    END IF;
    deadline := clock_timestamp() + queue_pg._seconds(w);
    -- A server-side poll runs each attempt in a subtransaction, undone when fruitless, so the
    -- wait between attempts holds no row lock (the in-flight counter's): other consumers'
    -- receives and deletes go on. An attempt that did work and found nothing to return (it
    -- dead-lettered) keeps its locks, and so does a delete batch on a queue with an
    -- in_flight_limit (the counter): then the answer comes at once. The other paths make one
    -- attempt, never sleep and pay no subtransaction.
    IF poll AND w > 0 AND NOT (q.in_flight_limit IS NOT NULL AND coalesce(cardinality("delete"), 0) > 0) THEN
        LOOP
            got := NULL;  -- stays NULL when the attempt was fruitless and undone
            BEGIN
                RETURN QUERY SELECT * FROM queue_pg._claim(q, max_messages, vt, true, true, consumer);
                got := FOUND;
            EXCEPTION WHEN SQLSTATE 'QP900' THEN
                NULL;
            END;
            IF got IS NOT NULL OR clock_timestamp() >= deadline THEN
                RETURN;
            END IF;
            PERFORM pg_sleep(least(0.05, extract(epoch FROM deadline - clock_timestamp())));
        END LOOP;
    END IF;
    RETURN QUERY SELECT * FROM queue_pg._claim(q, max_messages, vt, w > 0, false, consumer);
END $$;

-- SQS ReceiveMessage. `wait` > 0 polls inside the server every 50 ms for callers that cannot
-- LISTEN (psql, other languages); the Python client waits on LISTEN/NOTIFY instead.
-- `delete`: receipts of the caller's finished batch, deleted first in the same transaction
-- (a stale or lapsed one is skipped and counted, a forged one raises InvalidReceipt).
-- `consumer`: the caller's id from register_consumer, so its leases end soon after it dies.
CREATE OR REPLACE FUNCTION queue_pg.receive(
    queue text,
    max_messages integer DEFAULT 1,
    visibility_timeout double precision DEFAULT NULL,
    wait double precision DEFAULT NULL,
    "delete" text[] DEFAULT NULL,
    consumer integer DEFAULT NULL
) RETURNS SETOF queue_pg.message
LANGUAGE plpgsql AS $$  -- plpgsql: a SECURITY DEFINER sql function is re-planned every call
BEGIN
    RETURN QUERY SELECT * FROM queue_pg._receive(queue, max_messages, visibility_timeout, wait, true, "delete", consumer);
END $$;
