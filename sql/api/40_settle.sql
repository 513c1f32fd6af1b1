-- Settling a lease: delete, change visibility, update. Each needs the current receipt.

-- Whether message (m_id, m_queue_id, m_lease_no, m_expires_at) is under the lease a receipt of
-- queue q_id names, (id, lease_no, and on a relaxed queue's receipt its lease token), and not
-- expired at `at`: the row a settling call may touch. Inlined into the caller's WHERE (columns
-- in, so the primary key index still serves).
CREATE OR REPLACE FUNCTION queue_pg._current_lease(m_id bigint, m_queue_id integer, m_lease_no integer,
                                                   m_expires_at timestamptz, q_id integer, id bigint,
                                                   lease_no integer, at timestamptz,
                                                   m_received_at timestamptz, token text)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT m_id = id AND m_queue_id = q_id AND m_lease_no = lease_no
           AND (m_expires_at IS NULL OR m_expires_at > at)
           AND (token IS NULL OR token = queue_pg._lease_token(m_received_at))
$$;

-- Why a receipt that matched nothing matched nothing: the message is gone (false), was received
-- again (StaleReceipt, counted), or the receipt was never ours (InvalidReceipt). A relaxed
-- queue's receipt whose lease token does not match is stale: its lease was lost by a crash or
-- is from before the server's restart, and the lease number may have been granted again.
CREATE OR REPLACE FUNCTION queue_pg._diagnose(q queue_pg.queues, id bigint, lease_no integer,
                                              token text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    cur integer;
    received timestamptz;
BEGIN
    IF id IS NULL THEN
        RETURN 'InvalidReceipt';
    END IF;
    -- a message that moved to another queue (dead-lettered, redriven) is gone from this one
    SELECT m.lease_no, m.last_received_at INTO cur, received
    FROM queue_pg.messages m WHERE m.id = _diagnose.id AND m.queue_id = q.id;
    IF cur IS NULL THEN
        RETURN 'gone';
    ELSIF cur > lease_no OR (token IS NOT NULL AND token IS DISTINCT FROM queue_pg._lease_token(received)) THEN
        RETURN 'StaleReceipt';
    ELSIF cur < lease_no THEN
        RETURN 'InvalidReceipt';
    END IF;
    RETURN 'gone';  -- same lease, but expired: expiry wins over the lease
END $$;

CREATE OR REPLACE FUNCTION queue_pg._refuse(q queue_pg.queues, receipt text, why text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    CASE why
        WHEN 'InvalidReceipt' THEN PERFORM queue_pg._invalid_receipt(q.name, receipt);
        WHEN 'StaleReceipt' THEN PERFORM queue_pg._stale_receipt(q, receipt);
        WHEN 'gone' THEN
            RAISE EXCEPTION USING ERRCODE = 'QP009',
                MESSAGE = format('the message of receipt %s is no longer in queue %s (deleted, expired or dead-lettered)',
                                 quote_literal(receipt), quote_literal(q.name));
        ELSE NULL;
    END CASE;
END $$;

-- SQS DeleteMessage. True when deleted now; false when it was already gone, so a retry is safe.
CREATE OR REPLACE FUNCTION queue_pg.delete_message(queue text, receipt text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'receive');
    r record := queue_pg._parse_receipt(q.id, receipt, queue_pg._key());
    n timestamptz := queue_pg._now();
    m queue_pg.messages;
    why text;
BEGIN
    DELETE FROM queue_pg.messages t
    WHERE queue_pg._current_lease(t.id, t.queue_id, t.lease_no, t.expires_at, q.id, r.id, r.lease_no, n,
                                  t.last_received_at, r.token)
    RETURNING t.* INTO m;
    IF m.id IS NOT NULL THEN
        PERFORM queue_pg._history(q, m, 'deleted', n);
        PERFORM nextval(queue_pg._sequence('deleted', q.id));
        IF q.in_flight_limit IS NOT NULL AND m.visible_at > n AND NOT m.released THEN
            PERFORM queue_pg._in_flight_less(q.id, 1);
            PERFORM queue_pg._wake(q.id, false);  -- a slot is free: wake a long poll
        END IF;
        RETURN true;
    END IF;
    why := queue_pg._diagnose(q, r.id, r.lease_no, r.token);
    IF why <> 'gone' THEN
        PERFORM queue_pg._refuse(q, receipt, why);
    END IF;
    RETURN false;
END $$;

-- Deletes the messages of a batch of receipts. NULL when every entry deleted (the usual case),
-- else per entry: NULL (deleted), 'gone' (already gone: not deleted, no error), or the name of
-- the refusal. Duplicate receipts are refused whole. `param` names the caller's argument in
-- error messages (delete_batch's receipts, receive's delete). An array, not rows: the callers
-- call it in an assignment, which runs no statement, and the usual case hands back no rows to
-- copy (a set-returning body cost its callers a statement and a copy of each row).
DROP FUNCTION IF EXISTS queue_pg._delete_batch(queue_pg.queues, text[], text);
CREATE OR REPLACE FUNCTION queue_pg._delete_receipts(q queue_pg.queues, receipts text[], param text)
RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    key bytea;  -- the install's secret (as _key reads it), read with the checks
    n timestamptz := queue_pg._now();
    cnt integer := coalesce(cardinality(receipts), 0);
    dup text;
    has_dup boolean;
    ids bigint[];
    leases integer[];
    tokens text[];
    gone_ids bigint[];
    gone_leases integer[];
    freed integer := 0;
    why text[];
    sampling jsonb;  -- type -> every, of the queue's sampled types (NULL: none)
BEGIN
    -- Few statements on the usual path, each costing its executor start (a receive carries a
    -- delete batch, and a receive's fixed cost is what bounds a worker): the checks
    -- and the duplicate test in one, the parse inside the delete; the receipts are parsed by
    -- position only when an entry deleted nothing, to say why.
    -- The queue's sampled types (_history), read once here: per deleted row, a lookup
    -- in history_sampling was three index probes (the plan repeats the lateral expression).
    -- The duplicate test sorts bytes (COLLATE "C": the same equality as any database's
    -- collation, without its comparison cost: 48 µs for 100 receipts under ICU en-US, 20 in C).
    SELECT (SELECT count(DISTINCT x COLLATE "C") < count(x) OR count(*) FILTER (WHERE x IS NULL) > 1
            FROM unnest(receipts) x),
           (SELECT jsonb_object_agg(s.type, s.every) FROM queue_pg.history_sampling s
            WHERE s.queue_id = q.id AND q.history),
           (SELECT s.key FROM queue_pg.secret s)
    INTO has_dup, sampling, key
    FROM (SELECT queue_pg._check(format('len(%s)', param), cnt, 1, 1000, 'receipts'),
                 queue_pg._check_list(param, receipts) OFFSET 0) checked;
    IF has_dup THEN
        SELECT x INTO dup FROM unnest(receipts) x GROUP BY x HAVING count(*) > 1 LIMIT 1;
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('%s has duplicate entry %s: allowed distinct receipts only',
                             param, coalesce(quote_literal(left(dup, 100)), 'NULL'));
    END IF;
    -- FIFO: the groups' rows locked first, in the order a send locks them (sql/api/32_fifo.sql),
    -- so a batch over several groups and a send_batch into them never wait on each other in a
    -- circle (the delete trigger moves each group on under its row lock)
    IF q.fifo THEN
        PERFORM 1 FROM queue_pg.fifo_groups f
        WHERE f.queue_id = q.id
          AND f.group_id IN (SELECT m.group_id FROM queue_pg.messages m
                             JOIN queue_pg._parse_receipts(q.id, receipts, key) p ON m.id = p.id
                             WHERE m.queue_id = q.id)
        ORDER BY f.group_id
        FOR UPDATE;
    END IF;
    -- one statement parses, deletes and writes the history rows (no message rows copied into
    -- arrays); a malformed, forged or other queue's receipt parses to no row, so deletes nothing
    WITH del AS (
        DELETE FROM queue_pg.messages t
        USING queue_pg._parse_receipts(q.id, receipts, key) p
        WHERE queue_pg._current_lease(t.id, t.queue_id, t.lease_no, t.expires_at, q.id, p.id, p.lease_no, n,
                                      t.last_received_at, p.token)
        RETURNING t.*
    ), hist AS (  -- a sampled queue-type keeps one row in `every` (weight every): _history
        INSERT INTO queue_pg.message_history
        SELECT (queue_pg._history_row(q, d::queue_pg.messages, 'deleted', n, k.every)).*
        FROM del d
        CROSS JOIN LATERAL (SELECT CASE WHEN sampling IS NULL THEN 1
                                        ELSE coalesce((sampling ->> queue_pg._history_key(d.attributes))::integer, 1)
                                   END AS every) k
        WHERE q.history AND (k.every = 1 OR random() * k.every < 1)
    )
    SELECT coalesce(array_agg(d.id), '{}'), coalesce(array_agg(d.lease_no), '{}'),
           count(*) FILTER (WHERE d.visible_at > n AND NOT d.released)
    INTO gone_ids, gone_leases, freed
    FROM del d;
    IF q.in_flight_limit IS NOT NULL AND freed > 0 THEN
        PERFORM queue_pg._in_flight_less(q.id, freed);
        -- slots are free: wake the long polls waiting on a full queue (a max_running
        -- task's next run starts when a run ends, not at the next poll slice)
        PERFORM queue_pg._wake(q.id, false);
    END IF;
    -- counts the deletes in the test (_count_flow returns its n): an expression, no statement
    IF queue_pg._count_flow('deleted', q.id, cardinality(gone_ids)) = cnt THEN  -- the usual case: every entry deleted
        RETURN NULL;
    END IF;
    -- why each entry that deleted nothing deleted nothing (only failures are looked at); the
    -- pair (id, lease_no) tells a deleted entry from a stale twin of the same message
    SELECT array_agg(p.id ORDER BY u.i), array_agg(p.lease_no ORDER BY u.i), array_agg(p.token ORDER BY u.i)
    INTO ids, leases, tokens
    FROM generate_series(1, cnt) u(i)
    LEFT JOIN queue_pg._parse_receipts(q.id, receipts, key) p ON p.i = u.i;
    SELECT array_agg(CASE WHEN EXISTS (SELECT 1 FROM unnest(gone_ids, gone_leases) g(id, lease_no)
                                       WHERE g.id = ids[i] AND g.lease_no = leases[i]) THEN NULL
                          ELSE queue_pg._diagnose(q, ids[i], leases[i], tokens[i]) END ORDER BY i)
    INTO why FROM generate_series(1, cnt) i;
    PERFORM queue_pg._advance('stale_receipts', q.id, count(*))
    FROM unnest(why) w WHERE w = 'StaleReceipt' HAVING count(*) > 0;
    RETURN why;
END $$;

-- Per-entry results, in the order of the receipts: deleted, or the name of the refusal.
CREATE OR REPLACE FUNCTION queue_pg.delete_batch(queue text, receipts text[])
RETURNS TABLE (receipt text, deleted boolean, error text)
LANGUAGE plpgsql AS $$
DECLARE
    why text[] := queue_pg._delete_receipts(queue_pg._queue(queue, 'receive'), receipts, 'receipts');
BEGIN
    RETURN QUERY SELECT u.r, u.w IS NULL, nullif(u.w, 'gone') FROM unnest(receipts, why) u(r, w);
END $$;

-- The shared body of change_visibility and update_message: new lease end counted from now,
-- capped at max_lease after the receive that began the lease. timeout NULL keeps the lease as it
-- is (a checkpoint of the body); release marks a lease ended on purpose (a planned retry), so its
-- return is not counted as a lapse.
CREATE OR REPLACE FUNCTION queue_pg._relet(q queue_pg.queues, receipt text, timeout double precision,
                                           body jsonb, attributes jsonb, release boolean, param text)
RETURNS queue_pg.message
LANGUAGE plpgsql AS $$
DECLARE
    key bytea := queue_pg._key();
    r record := queue_pg._parse_receipt(q.id, receipt, key);
    n timestamptz := queue_pg._now();
    m queue_pg.messages;
    cap timestamptz;
    was_in boolean;
    is_in boolean;
    new_body jsonb;
    new_attributes jsonb;
    size bigint;
    held bigint;
    result queue_pg.message;
BEGIN
    IF timeout IS NOT NULL OR param = 'timeout' THEN
        PERFORM queue_pg._check(param, timeout, 0, queue_pg._max_lease_cap());
    END IF;
    IF release IS NULL THEN
        PERFORM queue_pg._raise('QP003', 'release = NULL is invalid: allowed true or false');
    END IF;
    SELECT * INTO m FROM queue_pg.messages t
    WHERE queue_pg._current_lease(t.id, t.queue_id, t.lease_no, t.expires_at, q.id, r.id, r.lease_no, n,
                                  t.last_received_at, r.token)
    FOR UPDATE;
    IF m.id IS NULL THEN
        PERFORM queue_pg._refuse(q, receipt, queue_pg._diagnose(q, r.id, r.lease_no, r.token));
    END IF;
    -- A message no receive has taken yet (a put's receipt, 59_azure.sql) holds no lease: its
    -- visibility is a delay, bounded per call like a send's (above), and no slot is in flight.
    cap := coalesce(m.last_received_at + queue_pg._seconds(q.max_lease), 'infinity');
    -- a 'per_type' queue's hung work: past its type's limit, no extension (56_budget.sql)
    IF q.lease_policy = 'per_type' AND n + queue_pg._seconds(coalesce(timeout, 0)) > m.visible_at
       AND n > m.last_received_at + queue_pg._seconds(coalesce(queue_pg._hung_limit(q, m.attributes), q.max_lease)) THEN
        RAISE EXCEPTION USING ERRCODE = 'QP007', CONSTRAINT = 'hung_work_limit',
            MESSAGE = format('%s = %s would extend the lease of a run that has lasted %s seconds, past the hung-work limit of type %s (%s seconds after the receive at %s): the message is delivered again when its lease ends',
                             param, queue_pg._fmt(timeout), round(extract(epoch FROM n - m.last_received_at)::numeric, 3),
                             quote_literal(left(m.attributes ->> 'type', 100)),
                             queue_pg._fmt(queue_pg._hung_limit(q, m.attributes)), m.last_received_at);
    END IF;
    IF n + queue_pg._seconds(coalesce(timeout, 0)) > cap THEN
        RAISE EXCEPTION USING ERRCODE = 'QP007',
            MESSAGE = format('%s = %s would end the lease at %s, past max_lease = %s seconds after the receive at %s (allowed up to %s seconds from now)',
                             param, queue_pg._fmt(timeout), n + queue_pg._seconds(timeout),
                             queue_pg._fmt(q.max_lease), m.last_received_at,
                             greatest(0, round(extract(epoch FROM cap - n)::numeric, 3)));
    END IF;
    -- What the caller sends is bounded like a new message; the message as it will be (merged
    -- attributes included) by size only: a body it leaves as it is (one stored before the
    -- readability bounds existed, say) is not the caller's to answer for.
    IF body IS NOT NULL OR attributes IS NOT NULL THEN
        new_body := coalesce(body, 'null');
        IF queue_pg._unfit(q.max_message_size, new_body, attributes,
                           queue_pg._message_size(new_body, attributes)) THEN
            PERFORM queue_pg._check_body(q, new_body, attributes);
        END IF;
        new_attributes := CASE WHEN attributes IS NULL THEN m.attributes
                               ELSE coalesce(m.attributes, '{}') || attributes END;
        new_body := coalesce(body, m.body);
        size := queue_pg._message_size(new_body, new_attributes);
        IF size > q.max_message_size THEN
            RAISE EXCEPTION USING ERRCODE = 'QP004',
                MESSAGE = format('body and attributes would be %s bytes of JSON text after the update: allowed up to max_message_size = %s bytes of queue %s',
                                 size, q.max_message_size, quote_literal(q.name));
        END IF;
    END IF;
    -- in flight: leased and not released (a planned retry's backoff holds no slot, see
    -- _in_flight_exact)
    was_in := m.visible_at > n AND NOT m.released AND m.last_received_at IS NOT NULL;
    is_in := CASE WHEN timeout IS NULL THEN was_in
                  ELSE timeout > 0 AND NOT release AND m.last_received_at IS NOT NULL END;
    -- Back in flight (a released or lapsed lease taken up again): bounded by the limit like a
    -- receive.
    IF q.in_flight_limit IS NOT NULL AND is_in AND NOT was_in THEN
        held := queue_pg._in_flight_held(q, n, 1);
        IF held IS NULL OR held >= q.in_flight_limit THEN
            PERFORM queue_pg._in_flight_full(q, held);
        END IF;
    END IF;
    -- A release with a backoff (timeout > 0) ends the receipt's rights: a new lease number makes
    -- it stale, so a released message, which holds no slot of in_flight_limit (or max_running),
    -- can no longer be settled by its holder while it waits; a receive takes it up again.
    UPDATE queue_pg.messages t SET
        visible_at = CASE WHEN timeout IS NULL THEN t.visible_at ELSE n + queue_pg._seconds(timeout) END,
        released = CASE WHEN timeout IS NULL THEN t.released ELSE timeout = 0 OR release END,
        lease_no = CASE WHEN timeout > 0 AND release THEN t.lease_no + 1 ELSE t.lease_no END,
        body = coalesce(_relet.body, t.body),
        attributes = coalesce(new_attributes, t.attributes)
    WHERE t.id = m.id
    RETURNING t.id, q.name, t.body, t.attributes, receipt, t.receive_count, t.enqueued_at,
              t.first_received_at, t.visible_at, t.expires_at
    INTO result;
    IF q.in_flight_limit IS NOT NULL AND was_in AND NOT is_in THEN
        PERFORM queue_pg._in_flight_less(q.id, 1);
    ELSIF q.in_flight_limit IS NOT NULL AND is_in AND NOT was_in THEN  -- the row is held (above)
        UPDATE queue_pg.in_flight f SET n = f.n + 1 WHERE f.queue_id = q.id;
    END IF;
    IF timeout = 0 OR (q.in_flight_limit IS NOT NULL AND was_in AND NOT is_in) THEN
        PERFORM pg_notify(queue_pg._channel(q.id, key), '');  -- visible now, or a slot is free
    END IF;
    RETURN result;
END $$;

-- SQS ChangeMessageVisibility: returns the new lease end; 0 releases the message at once.
-- release => true: a planned retry (backoff), whose return is not counted as a lease expiry;
-- with a timeout above 0 the receipt is spent (stale from then on).
CREATE OR REPLACE FUNCTION queue_pg.change_visibility(queue text, receipt text, timeout double precision,
                                                      release boolean DEFAULT false)
RETURNS timestamptz
LANGUAGE plpgsql AS $$  -- plpgsql: a SECURITY DEFINER sql function is re-planned every call
BEGIN
    RETURN (queue_pg._relet(queue_pg._queue(queue, 'receive'), receipt, timeout, NULL, NULL, release,
                            'timeout')).visible_until;
END $$;

-- Azure Update Message: new visibility and, optionally, new content; the receipt stays valid.
-- visibility_timeout NULL keeps the lease as it is; attributes are merged into the message's.
CREATE OR REPLACE FUNCTION queue_pg.update_message(queue text, receipt text, body jsonb DEFAULT NULL,
                                                   visibility_timeout double precision DEFAULT 0,
                                                   attributes jsonb DEFAULT NULL)
RETURNS queue_pg.message
LANGUAGE plpgsql AS $$
BEGIN
    RETURN queue_pg._relet(queue_pg._queue(queue, 'receive'), receipt, visibility_timeout, body, attributes,
                           false, 'visibility_timeout');
END $$;

-- `reason` cut to at most `max_bytes` bytes of UTF-8 on a character boundary, saying so at its end
-- ("… [truncated, N bytes]", N the original length); a reason that fits is returned as it is.
CREATE OR REPLACE FUNCTION queue_pg._fit_reason(reason text, max_bytes integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    total integer := octet_length(reason);
    tail text;
    head text;
BEGIN
    IF total IS NULL OR total <= max_bytes THEN
        RETURN reason;
    END IF;
    tail := format('… [truncated, %s bytes]', total);
    head := left(reason, max_bytes - octet_length(tail));  -- characters: at least as many bytes
    WHILE octet_length(head) > max_bytes - octet_length(tail) LOOP
        head := left(head, length(head) - greatest(1, (octet_length(head) - (max_bytes - octet_length(tail))) / 4));
    END LOOP;
    RETURN head || tail;
END $$;

-- Dead-letters a message now, under its current receipt: for work that can never succeed (an
-- unknown task, arguments that do not fit), so it does not go round until max_receive_count.
CREATE OR REPLACE FUNCTION queue_pg.dead_letter(queue text, receipt text, reason text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'receive');
    r record := queue_pg._parse_receipt(q.id, receipt, queue_pg._key());
    n timestamptz := queue_pg._now();
    found_id bigint;
    why text;
BEGIN
    IF q.dead_letter_queue IS NULL THEN  -- its own code: the caller keeps the message another way
        RAISE EXCEPTION USING ERRCODE = 'QP038',
            MESSAGE = format('queue = %s is invalid: it has no dead_letter_queue (set one with alter_queue)',
                             quote_literal(q.name));
    END IF;
    -- The reason is kept in the message's attributes: cut to 1 KiB, never a cause to refuse the move.
    reason := queue_pg._fit_reason(reason, 1024);
    SELECT t.id INTO found_id FROM queue_pg.messages t
    WHERE queue_pg._current_lease(t.id, t.queue_id, t.lease_no, t.expires_at, q.id, r.id, r.lease_no, n,
                                  t.last_received_at, r.token)
    FOR UPDATE;
    IF found_id IS NULL THEN
        why := queue_pg._diagnose(q, r.id, r.lease_no, r.token);
        IF why <> 'gone' THEN
            PERFORM queue_pg._refuse(q, receipt, why);
        END IF;
        RETURN false;
    END IF;
    PERFORM queue_pg._dead_letter(q, ARRAY[found_id], n, reason);
    RETURN true;
END $$;
