-- Sending: one message, or many in one statement.

CREATE OR REPLACE FUNCTION queue_pg._check_body(q queue_pg.queues, body jsonb, attributes jsonb,
                                               idx integer DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    at text := CASE WHEN idx IS NULL THEN '' ELSE format('[%s]', idx) END;
    size integer;
BEGIN
    IF body IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('body%s = NULL is invalid: allowed any JSON value (use JSON null, not SQL NULL)', at);
    END IF;
    size := pg_column_size(body);
    IF size > q.max_message_size THEN
        RAISE EXCEPTION USING ERRCODE = 'QP004',
            MESSAGE = format('body%s is %s bytes as stored: allowed up to max_message_size = %s bytes of queue %s',
                             at, size, q.max_message_size, quote_literal(q.name));
    END IF;
    IF attributes IS NOT NULL AND jsonb_typeof(attributes) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('attributes%s is a JSON %s: allowed a JSON object or NULL', at, jsonb_typeof(attributes));
    END IF;
END $$;

CREATE OR REPLACE FUNCTION queue_pg._bad_ttl(ttl double precision) RETURNS double precision
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'QP003',
        MESSAGE = format('ttl = %s is out of range: allowed more than 0 up to 3153600000 seconds (100 years)', ttl);
END $$;

-- The ttl itself; inlined like queue_pg._check.
CREATE OR REPLACE FUNCTION queue_pg._checked_ttl(ttl double precision) RETURNS double precision
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN ttl <= 0 OR ttl = 'NaN' OR ttl > 3153600000 THEN queue_pg._bad_ttl(ttl) ELSE ttl END
$$;

-- Wakes the queue's listeners. NOTIFY serializes committing transactions on a cluster-wide
-- lock held through the WAL flush, so a notify per send caps concurrent senders at one commit at
-- a time. `debounce` (for sessions whose send commits at once: the Python client's own
-- connections pass it) skips the notify when one went out less than 2 ms ago; a listener that
-- got that one re-checks shortly after it (queue_pg._ops.FOLLOW_UP), which finds what the skipped
-- notifies would have announced. Never debounced inside a caller's longer transaction: its
-- commit may come long after the notify it would rely on.
CREATE OR REPLACE FUNCTION queue_pg._wake(queue_id integer, debounce boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    seq regclass;
    last_us bigint;
    now_us bigint;
BEGIN
    IF debounce THEN
        seq := queue_pg._counter('notified', queue_id);
        now_us := queue_pg._micros(clock_timestamp());
        last_us := pg_sequence_last_value(seq);
        IF last_us IS NOT NULL AND now_us - last_us BETWEEN 0 AND 2000 THEN
            RETURN;
        END IF;
        PERFORM setval(seq, now_us);
    END IF;
    PERFORM pg_notify(queue_pg._channel(queue_id), '');
END $$;

CREATE OR REPLACE FUNCTION queue_pg.send(
    queue text,
    body jsonb,
    delay double precision DEFAULT NULL,
    ttl double precision DEFAULT NULL,
    attributes jsonb DEFAULT NULL,
    debounce boolean DEFAULT false
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'send');
    d double precision := queue_pg._check('delay', coalesce(delay, q.delay), 0, 604800);
    t double precision := coalesce(queue_pg._checked_ttl(ttl), q.message_ttl);
    n timestamptz := queue_pg._now();
    new_id bigint;
BEGIN
    PERFORM queue_pg._check_body(q, body, attributes);
    INSERT INTO queue_pg.messages (queue_id, visible_at, expires_at, enqueued_at, body, attributes)
    VALUES (q.id, n + queue_pg._seconds(d), n + queue_pg._seconds(t), n, body, attributes)
    RETURNING id INTO new_id;
    IF d = 0 THEN
        PERFORM queue_pg._wake(q.id, debounce);
    END IF;
    RETURN new_id;
END $$;

-- A batch is one INSERT; ids come back in the order of the bodies.
CREATE OR REPLACE FUNCTION queue_pg.send_batch(
    queue text,
    bodies jsonb[],
    delay double precision DEFAULT NULL,
    ttl double precision DEFAULT NULL,
    attributes jsonb[] DEFAULT NULL,
    debounce boolean DEFAULT false
) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'send');
    d double precision := queue_pg._check('delay', coalesce(delay, q.delay), 0, 604800);
    t double precision := coalesce(queue_pg._checked_ttl(ttl), q.message_ttl);
    n timestamptz := queue_pg._now();
    cnt integer := coalesce(cardinality(bodies), 0);
    bad record;
BEGIN
    PERFORM queue_pg._check('len(bodies)', cnt, 1, 10000, 'messages');
    IF attributes IS NOT NULL AND cardinality(attributes) <> cnt THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('len(attributes) = %s is invalid: allowed NULL or len(bodies) = %s',
                             cardinality(attributes), cnt);
    END IF;
    -- Find the first bad entry without a loop on the good path: NULL bodies, oversize bodies,
    -- attributes that are not objects.
    SELECT b.body, a.attr, b.i INTO bad
    FROM unnest(bodies) WITH ORDINALITY AS b(body, i)
    LEFT JOIN unnest(attributes) WITH ORDINALITY AS a(attr, j) ON a.j = b.i
    WHERE b.body IS NULL OR pg_column_size(b.body) > q.max_message_size
       OR (a.attr IS NOT NULL AND jsonb_typeof(a.attr) <> 'object')
    ORDER BY b.i LIMIT 1;
    IF FOUND THEN
        PERFORM queue_pg._check_body(q, bad.body, bad.attr, (bad.i - 1)::integer);
    END IF;
    RETURN QUERY
    WITH ins AS (
        INSERT INTO queue_pg.messages (queue_id, visible_at, expires_at, enqueued_at, body, attributes)
        SELECT q.id, n + queue_pg._seconds(d), n + queue_pg._seconds(t), n, b.body, attributes[b.i]
        FROM unnest(bodies) WITH ORDINALITY AS b(body, i)
        ORDER BY b.i
        RETURNING id
    )
    SELECT ins.id FROM ins ORDER BY ins.id;
    IF d = 0 THEN
        PERFORM queue_pg._wake(q.id, debounce);
    END IF;
END $$;
