-- Sending: one message, or many in one statement.

-- The bounds of a message, checked at send, send_batch and update_message:
--   size: the octet length of the JSON text of body plus that of attributes, as PostgreSQL prints
--   them (which is Python's json.dumps(x, ensure_ascii=False)), at most max_message_size;
--   what every client can read: arrays and objects nested at most 100 deep, and numbers within
--   float8's range (a number past it is infinity or an error to most JSON decoders).
-- Inlined sql: a send pays one print of its JSON and two C-level path scans, no plpgsql call.
-- The text a body counts and hashes as: a string body its own characters (what the sender sent,
-- not its JSON quoting), any other JSON value its JSON text.
CREATE OR REPLACE FUNCTION queue_pg._body_text(body jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(body) = 'string' THEN body #>> '{}' ELSE body::text END
$$;

CREATE OR REPLACE FUNCTION queue_pg._message_size(body jsonb, attributes jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT octet_length(queue_pg._body_text(body))::bigint + coalesce(octet_length(attributes::text), 0)
$$;

CREATE OR REPLACE FUNCTION queue_pg._max_depth() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100 $$;

-- The first number of v outside float8's range, or NULL.
CREATE OR REPLACE FUNCTION queue_pg._huge_number(v jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT jsonb_path_query_first(v, 'strict $.** ? (@.type() == "number" && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))')
$$;

-- Whether v nests arrays and objects more than _max_depth() deep (a container at level 100).
CREATE OR REPLACE FUNCTION queue_pg._too_deep(v jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT jsonb_path_exists(v, 'strict $.**{100} ? (@.type() == "array" || @.type() == "object")')
$$;

-- Whether body and attributes, of _message_size `size`, break a bound; NULL counts as false.
-- JSON text under 200 bytes can neither nest 100 deep nor print a number past float8 (numbers
-- print without exponent: 309 digits and more), so small messages skip the path scans.
CREATE OR REPLACE FUNCTION queue_pg._unfit(max_size integer, body jsonb, attributes jsonb, size bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT body IS NULL
        OR (attributes IS NOT NULL AND jsonb_typeof(attributes) <> 'object')
        OR size > max_size
        OR (size >= 200
            AND (queue_pg._huge_number(body) IS NOT NULL OR queue_pg._huge_number(attributes) IS NOT NULL
                 OR queue_pg._too_deep(body) OR coalesce(queue_pg._too_deep(attributes), false)))
$$;

-- Raises the first bound a message breaks (see _unfit); idx names its place in a batch.
CREATE OR REPLACE FUNCTION queue_pg._check_body(q queue_pg.queues, body jsonb, attributes jsonb,
                                               idx integer DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    at text := CASE WHEN idx IS NULL THEN '' ELSE format('[%s]', idx) END;
    size bigint;
    v jsonb;
    param text;
BEGIN
    IF body IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('body%s = NULL is invalid: allowed any JSON value (use JSON null, not SQL NULL)', at);
    END IF;
    IF attributes IS NOT NULL AND jsonb_typeof(attributes) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('attributes%s is a JSON %s: allowed a JSON object or NULL', at, jsonb_typeof(attributes));
    END IF;
    FOREACH param IN ARRAY ARRAY['body', 'attributes'] LOOP
        v := CASE param WHEN 'body' THEN body ELSE attributes END;
        IF queue_pg._huge_number(v) IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'QP003',
                MESSAGE = format('%s%s holds the number %s: allowed numbers from -1.7976931348623157e308 to 1.7976931348623157e308 (float8)',
                                 param, at, left(queue_pg._huge_number(v)::text, 40)
                                 || CASE WHEN length(queue_pg._huge_number(v)::text) > 40 THEN '...' ELSE '' END);
        END IF;
        IF queue_pg._too_deep(v) THEN
            RAISE EXCEPTION USING ERRCODE = 'QP003',
                MESSAGE = format('%s%s nests arrays and objects more than %s deep: allowed up to %s levels',
                                 param, at, queue_pg._max_depth(), queue_pg._max_depth());
        END IF;
    END LOOP;
    size := queue_pg._message_size(body, attributes);
    IF size > q.max_message_size THEN
        RAISE EXCEPTION USING ERRCODE = 'QP004',
            MESSAGE = format('body%s and attributes%s are %s bytes: allowed up to max_message_size = %s bytes of queue %s',
                             at, at, size, q.max_message_size, quote_literal(q.name));
    END IF;
END $$;

-- A batch argument must be a plain list: one dimension, indexed from 1 (bodies and attributes
-- are matched by position).
CREATE OR REPLACE FUNCTION queue_pg._check_list(param text, a anyarray) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF array_ndims(a) > 1 OR array_lower(a, 1) <> 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('%s has %s dimension(s) and bounds %s: allowed a one-dimensional array indexed from 1',
                             param, array_ndims(a), array_dims(a));
    END IF;
END $$;

-- Holds queue queue_id against a concurrent drop_queue until the caller's transaction ends, so
-- no message is added to a queue being dropped: pg_sequence_last_value takes a weak lock (ROW
-- EXCLUSIVE, a fast-path lock: no row written) on one of the queue's own sequences, which
-- drop_queue drops before it deletes the messages. A send that comes after the drop waits for
-- it, then fails: the sequence is gone. Only the owner may lock these sequences.
CREATE OR REPLACE FUNCTION queue_pg._hold(queue_id integer) RETURNS bigint
LANGUAGE sql VOLATILE AS $$ SELECT pg_sequence_last_value(queue_pg._sequence('notified', queue_id)) $$;

-- delay must end before ttl does: a message invisible until it expires can never be received.
CREATE OR REPLACE FUNCTION queue_pg._delay_past_ttl(delay double precision, ttl double precision)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'QP003',
        MESSAGE = format('delay = %s is out of range: it must be less than the time-to-live, %s seconds (the message would expire unseen)',
                         queue_pg._fmt(delay), queue_pg._fmt(ttl));
END $$;

CREATE OR REPLACE FUNCTION queue_pg._bad_ttl(ttl double precision) RETURNS double precision
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'QP003',
        MESSAGE = format('ttl = %s is out of range: allowed more than 0 up to %s seconds (100 years)',
                         ttl, queue_pg._fmt(queue_pg._max_ttl()));
END $$;

-- The ttl itself; inlined like queue_pg._check.
CREATE OR REPLACE FUNCTION queue_pg._checked_ttl(ttl double precision) RETURNS double precision
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN ttl <= 0 OR ttl = 'NaN' OR ttl > queue_pg._max_ttl() THEN queue_pg._bad_ttl(ttl) ELSE ttl END
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
    key bytea;
BEGIN
    IF debounce THEN
        seq := queue_pg._sequence('notified', queue_id);
        now_us := queue_pg._micros(clock_timestamp());
        last_us := pg_sequence_last_value(seq);
        IF last_us IS NOT NULL AND now_us - last_us BETWEEN 0 AND 2000 THEN
            RETURN;
        END IF;
        PERFORM setval(seq, now_us);
    END IF;
    key := queue_pg._key();  -- a variable: as an argument, _channel would not be inlined
    PERFORM pg_notify(queue_pg._channel(queue_id, key), '');
END $$;

-- What every send starts from (send, send_batch, send_staged), given its queue q (the caller
-- may send to it): the delay (default the queue's; up to the lease cap), the ttl (default the
-- queue's message_ttl), the send's time; a delay must end before the ttl does.
CREATE OR REPLACE FUNCTION queue_pg._sending(q queue_pg.queues, delay double precision, ttl double precision,
                                             OUT d double precision, OUT t double precision,
                                             OUT n timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    d := queue_pg._check('delay', coalesce(delay, q.delay), 0, queue_pg._max_lease_cap());
    t := coalesce(queue_pg._checked_ttl(ttl), q.message_ttl);
    n := queue_pg._now();
    IF d >= t THEN
        PERFORM queue_pg._delay_past_ttl(d, t);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION queue_pg.send(
    queue text,
    body jsonb,
    delay double precision DEFAULT NULL,
    ttl double precision DEFAULT NULL,
    attributes jsonb DEFAULT NULL,
    debounce boolean DEFAULT false,
    "group" text DEFAULT NULL,
    dedup_id text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'send');
    d double precision; t double precision; n timestamptz;  -- delay, ttl, now: _sending
    size bigint;
    new_id bigint;
    old_id bigint;
    dest integer;
    key text;  -- the dedup id, kept on the message (the SQS endpoint's MessageDeduplicationId)
BEGIN
    SELECT * INTO d, t, n FROM queue_pg._sending(q, delay, ttl);
    size := queue_pg._message_size(body, attributes);
    IF queue_pg._unfit(q.max_message_size, body, attributes, size) THEN
        PERFORM queue_pg._check_body(q, body, attributes);
    END IF;
    PERFORM queue_pg._hold(q.id);
    IF q.fifo OR "group" IS NOT NULL THEN  -- groups (sql/api/32_fifo.sql)
        PERFORM queue_pg._check_groups(q, ARRAY["group"], delay, NULL);
    END IF;
    -- deduplication (sql/api/22_dedup.sql): only a send with an id, or to a content_dedup queue
    IF dedup_id IS NOT NULL OR q.content_dedup THEN
        key := queue_pg._dedup_key(dedup_id, body, q.content_dedup);
        new_id := nextval('queue_pg.messages_id_seq'::regclass);
        old_id := queue_pg._dedup_one(q, key, new_id, n);
        IF old_id IS NOT NULL THEN
            RETURN old_id;  -- a duplicate: accepted, not sent again
        END IF;
    END IF;
    IF q.fifo THEN
        new_id := queue_pg._fifo_send(q, ARRAY[body], ARRAY[attributes], ARRAY["group"], n, t, ARRAY[new_id], ARRAY[key]);
    ELSE
    IF q.has_routes THEN  -- a type with a route lands in its target queue (sql/api/56_tuning.sql)
        dest := (queue_pg._route(q.id, ARRAY[attributes]))[1];
    END IF;
    INSERT INTO queue_pg.messages (id, queue_id, visible_at, expires_at, enqueued_at, body, attributes, group_id, dedup_id)
    OVERRIDING SYSTEM VALUE
    VALUES (coalesce(new_id, nextval('queue_pg.messages_id_seq'::regclass)), coalesce(dest, q.id),
            n + queue_pg._seconds(d), n + queue_pg._seconds(t), n, body, attributes, "group", key)
    RETURNING id INTO new_id;
    END IF;
    PERFORM nextval(queue_pg._sequence('sent', coalesce(dest, q.id)));
    IF d = 0 THEN
        PERFORM queue_pg._wake(coalesce(dest, q.id), debounce);
    END IF;
    RETURN new_id;
END $$;

-- The messages of a batch (send_batch) or of a staged chunk (send_staged), after the send's
-- common start (_sending) and the shape of the lists (one entry per body): every rule of a
-- batch, in one place. Each body is checked (_unfit, the first bad one raised with its place),
-- groups (FIFO queues need them), dedup ids, routes; one INSERT. Per message in the order of the
-- bodies: its id, and whether it was sent (false: a duplicate, whose id is the first's).
CREATE OR REPLACE FUNCTION queue_pg._send_rows(q queue_pg.queues, d double precision,
                                               t double precision, n timestamptz,
                                               delay double precision, bodies jsonb[],
                                               attributes jsonb[], "group" text[],
                                               dedup_ids text[], debounce boolean)
RETURNS TABLE (id bigint, sent boolean)
LANGUAGE plpgsql AS $$
DECLARE
    cnt integer := coalesce(cardinality(bodies), 0);
    bad record;
    dests integer[];
    ids bigint[];  -- with dedup ids: per message, its id (fresh) or its first's (a duplicate)
    fresh boolean[];
    keys text[];  -- per message, its dedup id (kept on the message), or NULL
BEGIN
    -- Find the first entry that breaks a bound (_unfit) without a loop on the good path.
    SELECT b.body, attributes[b.i] AS attr, b.i INTO bad
    FROM unnest(bodies) WITH ORDINALITY AS b(body, i)
    CROSS JOIN LATERAL (SELECT queue_pg._message_size(b.body, attributes[b.i]) AS size OFFSET 0) s
    WHERE queue_pg._unfit(q.max_message_size, b.body, attributes[b.i], s.size)
    ORDER BY b.i LIMIT 1;
    IF FOUND THEN
        PERFORM queue_pg._check_body(q, bad.body, bad.attr, (bad.i - 1)::integer);
    END IF;
    PERFORM queue_pg._hold(q.id);
    IF q.fifo OR "group" IS NOT NULL THEN  -- groups (sql/api/32_fifo.sql)
        PERFORM queue_pg._check_groups(q, "group", delay, cnt);
    END IF;
    -- deduplication (sql/api/22_dedup.sql): only a batch with ids, or to a content_dedup queue;
    -- duplicates are left out below, and what is counted and routed is the fresh messages only
    IF dedup_ids IS NOT NULL OR q.content_dedup THEN
        keys := ARRAY(SELECT queue_pg._dedup_key(dedup_ids[b.i], b.body, q.content_dedup, (b.i - 1)::integer)
                      FROM unnest(bodies) WITH ORDINALITY AS b(body, i) ORDER BY b.i);
        SELECT x.sent_ids, x.fresh INTO ids, fresh FROM queue_pg._dedup_ids(q, keys, n) x;
        RETURN QUERY SELECT x.id, x.fresh FROM unnest(ids, fresh) x(id, fresh);
    END IF;
    IF q.fifo AND fresh IS NULL THEN
        RETURN QUERY SELECT x, true FROM queue_pg._fifo_send(q, bodies, attributes, "group", n, t) x;
    ELSIF q.fifo THEN  -- the fresh messages only, with the ids the dedup step gave them
        PERFORM queue_pg._fifo_send(q,
            ARRAY(SELECT bodies[i] FROM generate_series(1, cnt) i WHERE fresh[i] ORDER BY i),
            CASE WHEN attributes IS NOT NULL THEN ARRAY(SELECT attributes[i] FROM generate_series(1, cnt) i WHERE fresh[i] ORDER BY i) END,
            ARRAY(SELECT "group"[i] FROM generate_series(1, cnt) i WHERE fresh[i] ORDER BY i), n, t,
            ARRAY(SELECT ids[i] FROM generate_series(1, cnt) i WHERE fresh[i] ORDER BY i),
            ARRAY(SELECT keys[i] FROM generate_series(1, cnt) i WHERE fresh[i] ORDER BY i));
    ELSE
    IF q.has_routes THEN  -- per message: its type's target queue, or NULL (sql/api/56_tuning.sql)
        dests := queue_pg._route(q.id, attributes);
    END IF;
    -- ids drawn first, in the order of the bodies: the INSERT needs no sort (a staged chunk's
    -- 100,000 bodies would spill a sort to disk)
    IF ids IS NULL THEN
        ids := ARRAY(SELECT nextval('queue_pg.messages_id_seq'::regclass) FROM generate_series(1, cnt) g ORDER BY g);
        RETURN QUERY SELECT x.id, true FROM unnest(ids) x(id);
    END IF;
    INSERT INTO queue_pg.messages (id, queue_id, visible_at, expires_at, enqueued_at, body, attributes, group_id, dedup_id)
    OVERRIDING SYSTEM VALUE
    SELECT ids[b.i], coalesce(dests[b.i], q.id), n + queue_pg._seconds(d), n + queue_pg._seconds(t), n,
           b.body, b.attr, b.grp, b.dedup
    FROM unnest(bodies, attributes, "group", keys) WITH ORDINALITY AS b(body, attr, grp, dedup, i)
    WHERE fresh IS NULL OR fresh[b.i];
    END IF;
    IF fresh IS NOT NULL THEN  -- deduplicated (above): only the fresh messages are counted
        dests := CASE WHEN dests IS NOT NULL THEN ARRAY(SELECT dests[i] FROM generate_series(1, cnt) i WHERE fresh[i] ORDER BY i) END;
        cnt := cardinality(array_positions(fresh, true));
    END IF;
    IF dests IS NULL THEN
        PERFORM queue_pg._count_flow('sent', q.id, cnt);
    ELSE
        PERFORM queue_pg._routed_sends(q.id, dests, cnt, d = 0, debounce);
    END IF;
    IF d = 0 AND cnt > 0 THEN
        PERFORM queue_pg._wake(q.id, debounce);
    END IF;
END $$;

-- A batch is one INSERT (_send_rows); ids come back in the order of the bodies.
CREATE OR REPLACE FUNCTION queue_pg.send_batch(
    queue text,
    bodies jsonb[],
    delay double precision DEFAULT NULL,
    ttl double precision DEFAULT NULL,
    attributes jsonb[] DEFAULT NULL,
    debounce boolean DEFAULT false,
    "group" text[] DEFAULT NULL,
    dedup_ids text[] DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'send');
    d double precision; t double precision; n timestamptz;  -- delay, ttl, now: _sending
    cnt integer := coalesce(cardinality(bodies), 0);
BEGIN
    SELECT * INTO d, t, n FROM queue_pg._sending(q, delay, ttl);
    PERFORM queue_pg._check('len(bodies)', cnt, 1, 10000, 'messages');
    PERFORM queue_pg._check_list('bodies', bodies);
    PERFORM queue_pg._check_list('attributes', attributes) WHERE attributes IS NOT NULL;
    IF attributes IS NOT NULL AND cardinality(attributes) <> cnt THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('len(attributes) = %s is invalid: allowed NULL or len(bodies) = %s',
                             cardinality(attributes), cnt);
    END IF;
    IF dedup_ids IS NOT NULL AND (cardinality(dedup_ids) <> cnt OR array_ndims(dedup_ids) > 1 OR array_lower(dedup_ids, 1) <> 1) THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('len(dedup_ids) = %s is invalid: allowed NULL or a list of len(bodies) = %s ids (NULL: none)',
                             cardinality(dedup_ids), cnt);
    END IF;
    RETURN QUERY SELECT x.id FROM queue_pg._send_rows(q, d, t, n, delay, bodies, attributes, "group",
                                                      dedup_ids, debounce) x;
END $$;
