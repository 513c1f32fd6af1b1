-- Deduplication (revision 0009): a send that carries a dedup id (or goes to a content_dedup
-- queue) claims the id in queue_pg.dedup for the queue's dedup_window; a later send of the same
-- id inside the window is accepted, sends nothing and returns the first message's id, even if
-- that message is gone. Sends without an id never touch the table.
--
-- Claims are INSERT ... ON CONFLICT on the key (queue_id, dedup_id): sends of different ids
-- never wait for each other. A send of an id that an uncommitted send claimed waits on that key
-- until the other transaction ends, then returns the other's id (committed) or claims the id
-- itself (rolled back): an id is never answered with a message that may yet roll back.

-- The dedup id of a message: `given` (1 to 128 characters), else with content_dedup the hex
-- SHA-256 of the body's JSON text (as PostgreSQL prints jsonb: key order and spacing fixed, so
-- equal JSON values have one id), else NULL. idx names the place in a batch.
CREATE OR REPLACE FUNCTION queue_pg._dedup_key(given text, body jsonb, content boolean,
                                               idx integer DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF given IS NULL THEN
        RETURN CASE WHEN content THEN encode(sha256(convert_to(queue_pg._body_text(body), 'UTF8')), 'hex') END;
    END IF;
    IF length(given) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('dedup_id%s = %s is invalid: allowed 1 to 128 characters, or NULL',
                             CASE WHEN idx IS NULL THEN '' ELSE format('[%s]', idx) END,
                             quote_literal(left(given, 140)) || CASE WHEN length(given) > 140 THEN '...' ELSE '' END);
    END IF;
    RETURN given;
END $$;

-- One send's claim of `key` for the message id `id` it drew: NULL when the send may go ahead
-- (the id was free, or its entry had expired), else the id of the message that holds it.
CREATE OR REPLACE FUNCTION queue_pg._dedup_one(q queue_pg.queues, key text, id bigint, n timestamptz)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    held bigint;
BEGIN
    LOOP
        INSERT INTO queue_pg.dedup AS x (queue_id, dedup_id, message_id, expires_at)
        VALUES (q.id, key, id, n + queue_pg._seconds(q.dedup_window))
        ON CONFLICT (queue_id, dedup_id) DO NOTHING;
        IF FOUND THEN
            RETURN NULL;
        END IF;
        -- taken: renew it if its window is over (re-checked after any concurrent renewal) ...
        UPDATE queue_pg.dedup x SET message_id = id, expires_at = n + queue_pg._seconds(q.dedup_window)
        WHERE x.queue_id = q.id AND x.dedup_id = key AND x.expires_at <= n;
        IF FOUND THEN
            RETURN NULL;
        END IF;
        -- ... else it is a duplicate (a new statement: it sees the claim that made it one)
        SELECT x.message_id INTO held FROM queue_pg.dedup x WHERE x.queue_id = q.id AND x.dedup_id = key;
        EXIT WHEN held IS NOT NULL;
        -- the sweep deleted the expired entry in between: claim again
    END LOOP;
    RETURN held;
END $$;

-- A batch's claims: per message in input order, the id it is to be sent under (fresh) or the id
-- of the message that already holds its key (not fresh), as two arrays (no set to aggregate). Messages without a key are fresh; of
-- several with one key in the batch the first is sent, the rest get its id. Keys are claimed in
-- key order, so two batches that share keys wait for each other instead of deadlocking.
CREATE OR REPLACE FUNCTION queue_pg._dedup_ids(q queue_pg.queues, keys text[], n timestamptz,
                                               OUT sent_ids bigint[], OUT fresh boolean[])
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[] := ARRAY(SELECT nextval('queue_pg.messages_id_seq'::regclass)
                          FROM generate_series(1, cardinality(keys)));
    expires timestamptz := n + queue_pg._seconds(q.dedup_window);
    mine jsonb := '{}'::jsonb;  -- the keys this batch claimed: key -> its first message's place
    held jsonb := '{}'::jsonb;  -- the keys held before: key -> the holding message's id
    open text[];
    claimed bigint;
BEGIN
    -- the common case first: every message has a key of its own that nobody holds. A key
    -- twice in the batch, or held, is skipped by DO NOTHING (the first of a key in the batch
    -- is inserted first); the claims made stay this batch's, found as its own below.
    IF array_position(keys, NULL) IS NULL THEN
        WITH ins AS (
            INSERT INTO queue_pg.dedup AS x (queue_id, dedup_id, message_id, expires_at)
            SELECT q.id, k.key, ids[k.i], expires FROM unnest(keys) WITH ORDINALITY k(key, i)
            ORDER BY k.key, k.i
            ON CONFLICT (queue_id, dedup_id) DO NOTHING
            RETURNING 1
        )
        SELECT count(*) INTO claimed FROM ins;
        IF claimed = cardinality(keys) THEN
            sent_ids := ids;
            fresh := array_fill(true, ARRAY[cardinality(keys)]);
            RETURN;
        END IF;
    END IF;
    SELECT coalesce(array_agg(DISTINCT k), '{}') INTO open FROM unnest(keys) k WHERE k IS NOT NULL;
    WHILE cardinality(open) > 0 LOOP
        WITH firsts AS (
            SELECT u.key, min(u.i) AS i FROM unnest(keys) WITH ORDINALITY u(key, i)
            JOIN unnest(open) o(key) ON o.key = u.key GROUP BY u.key
        ),
        ins AS (
            INSERT INTO queue_pg.dedup AS x (queue_id, dedup_id, message_id, expires_at)
            SELECT q.id, f.key, ids[f.i], expires FROM firsts f ORDER BY f.key
            ON CONFLICT (queue_id, dedup_id) DO NOTHING
            RETURNING x.dedup_id, x.message_id
        ),
        -- taken: renewed when its window is over (re-checked after a concurrent renewal)
        upd AS (
            UPDATE queue_pg.dedup x SET message_id = ids[f.i], expires_at = expires
            FROM firsts f
            WHERE x.queue_id = q.id AND x.dedup_id = f.key AND x.expires_at <= n
              AND NOT EXISTS (SELECT 1 FROM ins WHERE ins.dedup_id = f.key)
            RETURNING x.dedup_id, x.message_id
        )
        SELECT mine || coalesce(jsonb_object_agg(c.dedup_id, f.i), '{}') INTO mine
        FROM (SELECT * FROM ins UNION ALL SELECT * FROM upd) c JOIN firsts f ON f.key = c.dedup_id;
        -- the rest are duplicates (a new statement: it sees the claims that made them so),
        -- but for this batch's own claims of the first pass (their ids are drawn here)
        WITH firsts AS (
            SELECT u.key, min(u.i) AS i FROM unnest(keys) WITH ORDINALITY u(key, i)
            JOIN unnest(open) o(key) ON o.key = u.key GROUP BY u.key
        )
        SELECT mine || coalesce(jsonb_object_agg(x.dedup_id, f.i) FILTER (WHERE x.message_id = ids[f.i]), '{}'),
               held || coalesce(jsonb_object_agg(x.dedup_id, x.message_id) FILTER (WHERE x.message_id <> ids[f.i]), '{}')
        INTO mine, held
        FROM firsts f
        JOIN queue_pg.dedup x ON x.queue_id = q.id AND x.dedup_id = f.key
        WHERE NOT mine ? f.key;
        SELECT coalesce(array_agg(k), '{}') INTO open FROM unnest(open) k
        WHERE NOT mine ? k AND NOT held ? k;  -- deleted by a sweep in between: claimed again
    END LOOP;
    SELECT array_agg(CASE WHEN k.key IS NULL THEN ids[k.i]
                          WHEN mine ? k.key THEN ids[(mine ->> k.key)::integer]
                          ELSE (held ->> k.key)::bigint END ORDER BY k.i),
           array_agg(k.key IS NULL OR (mine ->> k.key)::integer = k.i ORDER BY k.i)
    INTO sent_ids, fresh
    FROM unnest(keys) WITH ORDINALITY k(key, i);
END $$;

-- Forgets dedup ids whose window is over (a bounded batch, oldest first by dedup_expiry;
-- concurrent sweeps and renewing sends are skipped). Called by queue_pg.sweep.
CREATE OR REPLACE FUNCTION queue_pg._forget_dedup(at timestamptz, max_rows integer,
                                                  scope integer[] DEFAULT NULL) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM queue_pg.dedup x
    WHERE x.ctid = ANY (ARRAY(
        SELECT y.ctid FROM queue_pg.dedup y
        WHERE y.expires_at <= at AND (scope IS NULL OR y.queue_id = ANY (scope))
        ORDER BY y.expires_at
        LIMIT max_rows FOR UPDATE SKIP LOCKED))
$$;
