-- Settling a lease: delete, change visibility, update. Each needs the current receipt.

-- Why a receipt that matched nothing matched nothing: the message is gone (false), was received
-- again (StaleReceipt, counted), or the receipt was never ours (InvalidReceipt).
CREATE OR REPLACE FUNCTION queue_pg._diagnose(q queue_pg.queues, receipt text, id bigint,
                                              lease_no integer) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    cur integer;
BEGIN
    IF id IS NULL THEN
        RETURN 'InvalidReceipt';
    END IF;
    -- a message that moved to another queue (dead-lettered, redriven) is gone from this one
    SELECT m.lease_no INTO cur FROM queue_pg.messages m WHERE m.id = _diagnose.id AND m.queue_id = q.id;
    IF cur IS NULL THEN
        RETURN 'gone';
    ELSIF cur > lease_no THEN
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
    WHERE t.id = r.id AND t.queue_id = q.id AND t.lease_no = r.lease_no
      AND (t.expires_at IS NULL OR t.expires_at > n)
    RETURNING t.* INTO m;
    IF m.id IS NOT NULL THEN
        PERFORM queue_pg._history(q, m, 'deleted', n);
        IF q.in_flight_limit IS NOT NULL AND m.visible_at > n THEN
            UPDATE queue_pg.in_flight f SET n = greatest(f.n - 1, 0) WHERE f.queue_id = q.id;
        END IF;
        RETURN true;
    END IF;
    why := queue_pg._diagnose(q, receipt, r.id, r.lease_no);
    IF why <> 'gone' THEN
        PERFORM queue_pg._refuse(q, receipt, why);
    END IF;
    RETURN false;
END $$;

-- Per-entry results: deleted, or the name of the refusal. Duplicate receipts are refused whole.
-- `param` names the caller's argument in error messages (delete_batch's receipts, receive's delete).
CREATE OR REPLACE FUNCTION queue_pg._delete_batch(q queue_pg.queues, receipts text[], param text)
RETURNS TABLE (receipt text, deleted boolean, error text)
LANGUAGE plpgsql AS $$
DECLARE
    key bytea := queue_pg._key();
    n timestamptz := queue_pg._now();
    cnt integer := coalesce(cardinality(receipts), 0);
    dup text;
    ids bigint[];
    leases integer[];
    gone_ids bigint[];
    gone_leases integer[];
    freed integer := 0;
    why text[];
BEGIN
    PERFORM queue_pg._check(format('len(%s)', param), cnt, 1, 1000, 'receipts');
    SELECT x INTO dup FROM unnest(receipts) x GROUP BY x HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('%s has duplicate entry %s: allowed distinct receipts only',
                             param, coalesce(quote_literal(dup), 'NULL'));
    END IF;
    SELECT array_agg(p.id ORDER BY u.i), array_agg(p.lease_no ORDER BY u.i) INTO ids, leases
    FROM generate_series(1, cnt) u(i)
    LEFT JOIN queue_pg._parse_receipts(q.id, receipts, key) p ON p.i = u.i;
    -- one statement deletes and writes the history rows (no message rows copied into arrays)
    WITH del AS (
        DELETE FROM queue_pg.messages t
        USING unnest(ids, leases) p(id, lease_no)
        WHERE t.id = p.id AND t.queue_id = q.id AND t.lease_no = p.lease_no
          AND (t.expires_at IS NULL OR t.expires_at > n)
        RETURNING t.*
    ), hist AS (
        INSERT INTO queue_pg.message_history
        SELECT (queue_pg._history_row(q, d::queue_pg.messages, 'deleted', n)).* FROM del d WHERE q.history
    )
    SELECT coalesce(array_agg(d.id), '{}'), coalesce(array_agg(d.lease_no), '{}'),
           count(*) FILTER (WHERE d.visible_at > n)
    INTO gone_ids, gone_leases, freed
    FROM del d;
    IF q.in_flight_limit IS NOT NULL AND freed > 0 THEN
        UPDATE queue_pg.in_flight f SET n = greatest(f.n - freed, 0) WHERE f.queue_id = q.id;
    END IF;
    IF cardinality(gone_ids) = cnt THEN  -- the usual case: every entry deleted
        RETURN QUERY SELECT r, true, NULL::text FROM unnest(receipts) r;
        RETURN;
    END IF;
    -- why each entry that deleted nothing deleted nothing (only failures are looked at); the
    -- pair (id, lease_no) tells a deleted entry from a stale twin of the same message
    SELECT array_agg(CASE WHEN EXISTS (SELECT 1 FROM unnest(gone_ids, gone_leases) g(id, lease_no)
                                       WHERE g.id = ids[i] AND g.lease_no = leases[i]) THEN NULL
                          ELSE queue_pg._diagnose(q, receipts[i], ids[i], leases[i]) END ORDER BY i)
    INTO why FROM generate_series(1, cnt) i;
    PERFORM queue_pg._count('stale_receipts', q.id, count(*))
    FROM unnest(why) w WHERE w = 'StaleReceipt' HAVING count(*) > 0;
    RETURN QUERY
    SELECT receipts[i], why[i] IS NULL, nullif(why[i], 'gone')
    FROM generate_series(1, cnt) i ORDER BY i;
END $$;

CREATE OR REPLACE FUNCTION queue_pg.delete_batch(queue text, receipts text[])
RETURNS TABLE (receipt text, deleted boolean, error text)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM queue_pg._delete_batch(queue_pg._queue(queue, 'receive'), receipts, 'receipts');
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
    r record := queue_pg._parse_receipt(q.id, receipt, queue_pg._key());
    n timestamptz := queue_pg._now();
    m queue_pg.messages;
    cap timestamptz;
    was_in boolean;
    is_in boolean;
    result queue_pg.message;
BEGIN
    IF timeout IS NOT NULL OR param = 'timeout' THEN
        PERFORM queue_pg._check(param, timeout, 0, 604800);
    END IF;
    IF release IS NULL THEN
        PERFORM queue_pg._raise('QP003', 'release = NULL is invalid: allowed true or false');
    END IF;
    IF body IS NOT NULL OR attributes IS NOT NULL THEN
        PERFORM queue_pg._check_body(q, coalesce(body, '{}'), attributes);
    END IF;
    SELECT * INTO m FROM queue_pg.messages t
    WHERE t.id = r.id AND t.queue_id = q.id AND t.lease_no = r.lease_no
      AND (t.expires_at IS NULL OR t.expires_at > n)
    FOR UPDATE;
    IF m.id IS NULL THEN
        PERFORM queue_pg._refuse(q, receipt, queue_pg._diagnose(q, receipt, r.id, r.lease_no));
    END IF;
    cap := m.last_received_at + queue_pg._seconds(q.max_lease);
    IF n + queue_pg._seconds(coalesce(timeout, 0)) > cap THEN
        RAISE EXCEPTION USING ERRCODE = 'QP007',
            MESSAGE = format('%s = %s would end the lease at %s, past max_lease = %s seconds after the receive at %s (allowed up to %s seconds from now)',
                             param, queue_pg._fmt(timeout), n + queue_pg._seconds(timeout),
                             queue_pg._fmt(q.max_lease), m.last_received_at,
                             greatest(0, round(extract(epoch FROM cap - n)::numeric, 3)));
    END IF;
    was_in := m.visible_at > n;
    is_in := CASE WHEN timeout IS NULL THEN was_in ELSE timeout > 0 END;
    UPDATE queue_pg.messages t SET
        visible_at = CASE WHEN timeout IS NULL THEN t.visible_at ELSE n + queue_pg._seconds(timeout) END,
        released = CASE WHEN timeout IS NULL THEN t.released ELSE timeout = 0 OR release END,
        body = coalesce(_relet.body, t.body),
        attributes = CASE WHEN _relet.attributes IS NULL THEN t.attributes
                          ELSE coalesce(t.attributes, '{}') || _relet.attributes END
    WHERE t.id = m.id
    RETURNING t.id, q.name, t.body, t.attributes, receipt, t.receive_count, t.enqueued_at,
              t.first_received_at, t.visible_at, t.expires_at
    INTO result;
    IF q.in_flight_limit IS NOT NULL AND was_in <> is_in THEN
        UPDATE queue_pg.in_flight f SET n = greatest(f.n + CASE WHEN was_in THEN -1 ELSE 1 END, 0)
        WHERE f.queue_id = q.id;
    END IF;
    IF timeout = 0 THEN
        PERFORM pg_notify(queue_pg._channel(q.id), '');
    END IF;
    RETURN result;
END $$;

-- SQS ChangeMessageVisibility: returns the new lease end; 0 releases the message at once.
-- release => true: a planned retry (backoff), whose return is not counted as a lease expiry.
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
    IF q.dead_letter_queue IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('queue = %s is invalid: it has no dead_letter_queue (set one with alter_queue)',
                             quote_literal(q.name));
    END IF;
    SELECT t.id INTO found_id FROM queue_pg.messages t
    WHERE t.id = r.id AND t.queue_id = q.id AND t.lease_no = r.lease_no
      AND (t.expires_at IS NULL OR t.expires_at > n)
    FOR UPDATE;
    IF found_id IS NULL THEN
        why := queue_pg._diagnose(q, receipt, r.id, r.lease_no);
        IF why <> 'gone' THEN
            PERFORM queue_pg._refuse(q, receipt, why);
        END IF;
        RETURN false;
    END IF;
    PERFORM queue_pg._dead_letter(q, ARRAY[found_id], n, reason);
    RETURN true;
END $$;
