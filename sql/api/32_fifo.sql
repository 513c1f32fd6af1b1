-- FIFO queues (groups delivered in send order, never to two consumers at once) and fair queues
-- (tenants with few messages in flight first). Tables: sql/schema/0008_fifo.sql; docs/fifo.md.
--
-- A FIFO group's messages, in id (send) order: the head (fifo_groups.head, the lowest id), then
-- the messages out with it (`visible_at` finite: delivered in the same receive as the head), then
-- the rest waiting with visible_at = 'infinity', which no claim walk reaches. A receive walks the
-- claim index from its floor as on a standard queue and takes a group only at its head, and only
-- while no message of the group is in flight (_fifo_claim); with the head it takes the group's
-- next messages in order, up to the batch (SQS: several messages of a group in one receive). So
-- a receive costs O(batch) whatever the number of groups. Only the head's removal moves the
-- group on (_fifo_advance): a delete or an expiry or a purge (the trigger below, one rule for
-- every path that deletes), a dead letter (_dead_letter calls it). A lapsed lease needs nothing:
-- the head's visible_at passes, and the next receive takes it (and those after it) again.

-- The groups of a send: on a FIFO queue every message needs one (QP030), and only the queue's
-- delay applies (SQS: no per-message delay on FIFO queues); anywhere, 1 to 128 characters.
-- cnt: the number of bodies of a send_batch (whose groups are a list), NULL for a send.
CREATE OR REPLACE FUNCTION queue_pg._check_groups(q queue_pg.queues, groups text[],
                                                  delay double precision, cnt integer)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    batch boolean := cnt IS NOT NULL;
    bad integer;
    param text;
BEGIN
    IF batch AND groups IS NULL THEN
        groups := array_fill(NULL::text, ARRAY[cnt]);
    ELSIF batch THEN
        PERFORM queue_pg._check_list('group', groups);
        IF cardinality(groups) <> cnt THEN
            RAISE EXCEPTION USING ERRCODE = 'QP003',
                MESSAGE = format('len(group) = %s is invalid: allowed NULL or len(bodies) = %s',
                                 cardinality(groups), cnt);
        END IF;
    END IF;
    SELECT g.i INTO bad FROM unnest(groups) WITH ORDINALITY g(v, i)
    WHERE (g.v IS NULL AND q.fifo) OR length(g.v) NOT BETWEEN 1 AND 128
    ORDER BY g.i LIMIT 1;
    param := CASE WHEN batch THEN format('group[%s]', bad - 1) ELSE 'group' END;
    IF bad IS NOT NULL AND groups[bad] IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP030',
            MESSAGE = format('%s = NULL is invalid: queue %s is a FIFO queue, every message needs a group of 1 to 128 characters',
                             param, quote_literal(q.name));
    ELSIF bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('%s = %s is invalid: allowed 1 to 128 characters', param,
                             quote_literal(left(groups[bad], 140)) || CASE WHEN length(groups[bad]) > 140 THEN '...' ELSE '' END);
    END IF;
    IF q.fifo AND delay IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('delay = %s is invalid: queue %s is a FIFO queue, whose messages wait its own delay (%s seconds) only; leave delay out',
                             queue_pg._fmt(delay), quote_literal(q.name), queue_pg._fmt(q.delay));
    END IF;
END $$;

-- Sends to a FIFO queue; ids in the order of the bodies. The groups' rows are locked first, in
-- sorted order (two batches never wait on each other in a circle), and held to commit: a group's
-- sends are ordered by that lock, so send order is id order within a group. A group without a
-- head (new, or emptied) gets its first message here as the head; every other message waits.
CREATE OR REPLACE FUNCTION queue_pg._fifo_send(q queue_pg.queues, bodies jsonb[], attributes jsonb[],
                                               groups text[], n timestamptz, t double precision,
                                               ids bigint[] DEFAULT NULL, dedups text[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    open text[];
BEGIN
    WITH g AS (
        INSERT INTO queue_pg.fifo_groups AS f (queue_id, group_id)
        SELECT q.id, s.x FROM (SELECT DISTINCT x FROM unnest(groups) x) s ORDER BY s.x
        ON CONFLICT (queue_id, group_id) DO UPDATE SET head = f.head
        RETURNING f.group_id, f.head
    )
    SELECT coalesce(array_agg(g.group_id) FILTER (WHERE g.head IS NULL), '{}') INTO open FROM g;
    RETURN QUERY
    WITH ins AS (
        INSERT INTO queue_pg.messages (id, queue_id, visible_at, expires_at, enqueued_at, body, attributes, group_id, dedup_id)
        OVERRIDING SYSTEM VALUE  -- ids, dedups: a deduplicated send's reserved ids and its keys (sql/api/22_dedup.sql)
        SELECT coalesce(ids[b.i], nextval('queue_pg.messages_id_seq'::regclass)), q.id,
               CASE WHEN b.first AND groups[b.i] = ANY (open) THEN n + queue_pg._seconds(q.delay)
                    ELSE 'infinity' END,
               n + queue_pg._seconds(t), n, b.body, attributes[b.i], groups[b.i], dedups[b.i]
        FROM (SELECT u.body, u.i, row_number() OVER (PARTITION BY groups[u.i] ORDER BY u.i) = 1 AS first
              FROM unnest(bodies) WITH ORDINALITY AS u(body, i)) b
        ORDER BY b.i
        RETURNING id, group_id, visible_at
    ), heads AS (
        UPDATE queue_pg.fifo_groups f SET head = ins.id
        FROM ins
        WHERE ins.visible_at < 'infinity' AND f.queue_id = q.id AND f.group_id = ins.group_id
    )
    SELECT ins.id FROM ins ORDER BY ins.id;
END $$;

-- Message `gone` of a FIFO group left the queue: if it was the group's head, the group's next
-- message (lowest id, not expired) becomes the head. One delivered with it and still out keeps
-- its lease (its consumer holds the group on); one whose lease lapsed is visible from `n`, above
-- the claim floor; a waiting one becomes visible at `n` (a claim's own now, so a claim that
-- dead-letters a head may take the next; default now), or after the queue's delay from its send.
-- Waits for the group's row lock, i.e. for a send into the group still in its transaction.
CREATE OR REPLACE FUNCTION queue_pg._fifo_advance(queue_id integer, group_id text, gone bigint,
                                                  n timestamptz DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    nxt bigint;
    out_id bigint;
BEGIN
    PERFORM 1 FROM queue_pg.fifo_groups f
    WHERE f.queue_id = _fifo_advance.queue_id AND f.group_id = _fifo_advance.group_id AND f.head = gone
    FOR UPDATE;
    IF NOT FOUND THEN  -- not a head (a fair queue's tenant, or the group moved on already)
        RETURN;
    END IF;
    n := coalesce(n, queue_pg._now());
    -- the lowest of those out (a few: what the last receive took): their ids as an array, so no
    -- plan walks the primary key in id order for it
    SELECT min(x) INTO out_id FROM unnest(ARRAY(
        SELECT m.id FROM queue_pg.messages m
        WHERE m.queue_id = _fifo_advance.queue_id AND m.group_id = _fifo_advance.group_id
          AND m.visible_at < 'infinity' AND (m.expires_at IS NULL OR m.expires_at > n))) x;
    LOOP  -- again when the chosen one went meanwhile (a purge or sweep committing)
        SELECT m.id INTO nxt FROM queue_pg.messages m
        WHERE m.queue_id = _fifo_advance.queue_id AND m.group_id = _fifo_advance.group_id
          AND m.visible_at = 'infinity' AND (m.expires_at IS NULL OR m.expires_at > n)
          AND (out_id IS NULL OR m.id < out_id)
        ORDER BY m.id LIMIT 1;
        IF nxt IS NULL AND out_id IS NOT NULL THEN  -- out with the head: it heads the group now
            nxt := out_id;
            UPDATE queue_pg.messages m SET visible_at = n
            WHERE m.id = nxt AND m.visible_at < n;
            EXIT;
        END IF;
        IF nxt IS NULL THEN
            DELETE FROM queue_pg.fifo_groups f
            WHERE f.queue_id = _fifo_advance.queue_id AND f.group_id = _fifo_advance.group_id;
            RETURN;
        END IF;
        UPDATE queue_pg.messages m SET visible_at = greatest(n, m.enqueued_at + queue_pg._seconds(q.delay))
        FROM queue_pg.queues q
        WHERE m.id = nxt AND q.id = _fifo_advance.queue_id AND m.visible_at = 'infinity';
        EXIT WHEN FOUND;
    END LOOP;
    UPDATE queue_pg.fifo_groups f SET head = nxt
    WHERE f.queue_id = _fifo_advance.queue_id AND f.group_id = _fifo_advance.group_id;
END $$;

-- FIFO queues: the claim of up to `want` messages, locked, for _claim, in the order to deliver
-- them. The walk of the claim index (from `floor_at`, as _claim's) meets a group's messages that
-- are visible, and takes a group only at its head and only while none of its messages is out (in
-- flight, or released with a delay): so no two consumers ever hold one group. Behind each head
-- taken come the group's next messages in id order (those that were out with it and lapsed,
-- then the waiting ones whose queue delay is over), up to the batch, stopping at the first one
-- locked by someone else. The walk is a cursor read one row at a time: only the heads used are
-- locked. Followers come back with visible_at NULL (_claim's floor counts only what it walked).
CREATE OR REPLACE FUNCTION queue_pg._fifo_claim(q queue_pg.queues, want integer, n timestamptz,
                                                floor_at timestamptz)
RETURNS TABLE (id bigint, receive_count integer, released boolean, visible_at timestamptz)
-- The sort of a head's few followers has no alternative; its penalty cost must not make the
-- planner JIT-compile (see _fair_claim). The walk keeps _claim's index order.
LANGUAGE plpgsql SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $$
DECLARE
    walk CURSOR FOR
        SELECT m.id, m.group_id, m.receive_count, m.released, m.visible_at
        FROM queue_pg.messages m
        WHERE m.queue_id = q.id AND m.visible_at <= n
          AND m.visible_at >= coalesce(floor_at, '-infinity')
          AND (m.expires_at IS NULL OR m.expires_at > n)
          AND (m.group_id IS NULL OR (
                   EXISTS (SELECT 1 FROM queue_pg.fifo_groups f
                           WHERE f.queue_id = q.id AND f.group_id = m.group_id AND f.head = m.id)
                   AND NOT EXISTS (SELECT 1 FROM queue_pg.messages o
                                   WHERE o.queue_id = q.id AND o.group_id = m.group_id
                                     AND o.visible_at > n AND o.visible_at < 'infinity')))
        ORDER BY m.visible_at
        FOR UPDATE SKIP LOCKED;
    h record;
    got integer := 0;
    lapsed bigint[];
    waiting bigint[];
    w record;
    cand bigint[];
    lk_id bigint[];
    lk_count integer[];
    lk_released boolean[];
    c bigint;
    i integer;
BEGIN
    OPEN walk;
    WHILE got < want LOOP
        FETCH walk INTO h;
        EXIT WHEN NOT FOUND;
        id := h.id; receive_count := h.receive_count; released := h.released;
        visible_at := h.visible_at;
        RETURN NEXT;
        got := got + 1;
        CONTINUE WHEN h.group_id IS NULL OR got >= want;
        -- out with the head before, lapsed now (the walk's NOT EXISTS: none is still out)
        lapsed := ARRAY(SELECT m.id FROM queue_pg.messages m
                        WHERE m.queue_id = q.id AND m.group_id = h.group_id AND m.visible_at <= n
                          AND m.id <> h.id AND (m.expires_at IS NULL OR m.expires_at > n));
        waiting := '{}';
        FOR w IN
            SELECT m.id, m.enqueued_at + queue_pg._seconds(q.delay) <= n AS due
            FROM queue_pg.messages m
            WHERE m.queue_id = q.id AND m.group_id = h.group_id AND m.visible_at = 'infinity'
              AND m.id <> h.id AND (m.expires_at IS NULL OR m.expires_at > n)
            ORDER BY m.id LIMIT want - got
        LOOP
            EXIT WHEN NOT w.due;  -- the group's order: nothing after one still in its delay
            waiting := waiting || w.id;
        END LOOP;
        cand := ARRAY(SELECT x FROM unnest(lapsed || waiting) x ORDER BY x LIMIT want - got);
        CONTINUE WHEN cardinality(cand) = 0;
        SELECT array_agg(m.id), array_agg(m.receive_count), array_agg(m.released)
        INTO lk_id, lk_count, lk_released
        FROM (SELECT t.id, t.receive_count, t.released FROM queue_pg.messages t
              WHERE t.id = ANY (cand) AND t.queue_id = q.id AND t.group_id = h.group_id
                AND (t.visible_at <= n OR t.visible_at = 'infinity')
              FOR UPDATE SKIP LOCKED) m;
        FOREACH c IN ARRAY cand LOOP  -- in order, up to the first one another call holds
            i := array_position(lk_id, c);
            EXIT WHEN i IS NULL;
            id := c; receive_count := lk_count[i]; released := lk_released[i]; visible_at := NULL;
            RETURN NEXT;
            got := got + 1;
        END LOOP;
    END LOOP;
    CLOSE walk;
END $$;

-- Every delete of a message that may be a head (grouped, not waiting): delete_message,
-- delete_batch, receive's delete, sweep's expiry, purge. Ungrouped messages (plain queues) only
-- meet the WHEN clause, evaluated without a function call.
CREATE OR REPLACE FUNCTION queue_pg._fifo_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM queue_pg._fifo_advance(OLD.queue_id, OLD.group_id, OLD.id);
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER messages_fifo_gone AFTER DELETE ON queue_pg.messages
FOR EACH ROW WHEN (OLD.group_id IS NOT NULL AND OLD.visible_at < 'infinity')
EXECUTE FUNCTION queue_pg._fifo_gone();

-- Messages `ids` just moved (same ids, UPDATE of queue_id) from queue `src` to queue `dst`: the
-- groups they headed in `src` move on, and in `dst` they join their groups. Whatever moves
-- messages between queues calls it when either queue is FIFO (dead letters do; redrive must).
CREATE OR REPLACE FUNCTION queue_pg._fifo_moved(src integer, dst integer, ids bigint[],
                                                n timestamptz DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM queue_pg._fifo_advance(src, m.group_id, m.id, n)
    FROM queue_pg.messages m
    WHERE m.id = ANY (ids) AND m.queue_id = dst AND m.group_id IS NOT NULL
    ORDER BY m.group_id;
    IF (SELECT q.fifo FROM queue_pg.queues q WHERE q.id = dst) THEN
        PERFORM queue_pg._fifo_enter(dst, ids);
    END IF;
END $$;

-- Messages `ids` just moved into FIFO queue `queue_id` (a dead letter into a FIFO dead-letter
-- queue; a redrive into a FIFO queue): each joins its group behind the messages there. A group
-- without a head gets the lowest of them as head; the rest wait. Ungrouped ones are left as they
-- are (delivered without order).
CREATE OR REPLACE FUNCTION queue_pg._fifo_enter(queue_id integer, ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    heads bigint[];
BEGIN
    WITH g AS (
        INSERT INTO queue_pg.fifo_groups AS f (queue_id, group_id)
        SELECT DISTINCT _fifo_enter.queue_id, m.group_id FROM queue_pg.messages m
        WHERE m.id = ANY (ids) AND m.queue_id = _fifo_enter.queue_id AND m.group_id IS NOT NULL
        ORDER BY 2
        ON CONFLICT ON CONSTRAINT fifo_groups_pkey DO UPDATE SET head = f.head
        RETURNING f.group_id, f.head
    ), first AS (
        SELECT min(m.id) AS id FROM queue_pg.messages m JOIN g ON g.group_id = m.group_id
        WHERE m.id = ANY (ids) AND m.queue_id = _fifo_enter.queue_id AND g.head IS NULL
        GROUP BY m.group_id
    ), parked AS (
        UPDATE queue_pg.messages m SET visible_at = 'infinity'
        WHERE m.id = ANY (ids) AND m.queue_id = _fifo_enter.queue_id AND m.group_id IS NOT NULL
          AND m.id NOT IN (SELECT id FROM first)
    )
    SELECT array_agg(first.id) INTO heads FROM first;
    -- a statement of its own: the rows g inserted are not visible to g's sibling statements
    UPDATE queue_pg.fifo_groups f SET head = m.id
    FROM queue_pg.messages m
    WHERE m.id = ANY (heads) AND f.queue_id = _fifo_enter.queue_id AND f.group_id = m.group_id;
END $$;

-- Fair queues: the claim of up to `want` visible messages, locked, for _claim. The tenants
-- (groups) with messages are found by a skip scan of messages_group (one probe per tenant), each
-- with its count in flight (leased or delayed, counted up to 1000) and its `want` oldest visible
-- messages. The batch takes the best `want` by (count in flight + rank within the tenant), oldest
-- first on ties: a tenant holding many messages gets more only when the others have none
-- waiting. Cost grows with the number of tenants with messages (not O(batch) as FIFO is), and
-- fair queues walk from the start, without the claim floor. Candidates another claim locked
-- meanwhile are skipped and the choice made again (3 rounds); then ungrouped messages and the
-- rest fill the batch oldest first.
CREATE OR REPLACE FUNCTION queue_pg._fair_claim(q queue_pg.queues, want integer, n timestamptz)
RETURNS TABLE (id bigint, receive_count integer, released boolean, visible_at timestamptz)
-- Its sort of a few candidates is wanted (_claim turns sorts off); their penalty cost would
-- make the planner JIT-compile this query on every call (0.3 s).
LANGUAGE plpgsql SET enable_sort = on SET jit = off AS $$
DECLARE
    tried bigint[] := '{}'::bigint[];
    got bigint[] := '{}'::bigint[];
    pick bigint[];
BEGIN
    FOR round IN 1..3 LOOP
        WITH RECURSIVE tenants(g) AS (
            (SELECT m.group_id FROM queue_pg.messages m
             WHERE m.queue_id = q.id AND m.group_id IS NOT NULL ORDER BY m.group_id LIMIT 1)
            UNION ALL
            SELECT (SELECT m.group_id FROM queue_pg.messages m
                    WHERE m.queue_id = q.id AND m.group_id > t.g ORDER BY m.group_id LIMIT 1)
            FROM tenants t WHERE t.g IS NOT NULL
        )
        SELECT array_agg(c.id ORDER BY c.score, c.visible_at) INTO pick
        FROM (
            SELECT c.id, c.visible_at, b.busy + c.rank AS score
            FROM tenants t
            CROSS JOIN LATERAL (
                SELECT count(*) AS busy FROM (
                    SELECT 1 FROM queue_pg.messages m
                    WHERE m.queue_id = q.id AND m.group_id = t.g AND m.visible_at > n LIMIT 1000) x
            ) b
            CROSS JOIN LATERAL (
                SELECT m.id, m.visible_at, row_number() OVER (ORDER BY m.visible_at, m.id) AS rank
                FROM queue_pg.messages m
                WHERE m.queue_id = q.id AND m.group_id = t.g AND m.visible_at <= n
                  AND (m.expires_at IS NULL OR m.expires_at > n) AND m.id <> ALL (tried)
                ORDER BY m.visible_at, m.id
                LIMIT want - cardinality(got)
            ) c
            WHERE t.g IS NOT NULL
            ORDER BY 3, 2
            LIMIT want - cardinality(got)
        ) c;
        EXIT WHEN pick IS NULL;
        tried := tried || pick;
        got := got || ARRAY(SELECT m.id FROM queue_pg.messages m
                            WHERE m.id = ANY (pick) AND m.queue_id = q.id AND m.visible_at <= n
                            FOR UPDATE SKIP LOCKED);
        EXIT WHEN cardinality(got) >= want;
    END LOOP;
    IF cardinality(got) < want THEN
        got := got || ARRAY(SELECT m.id FROM queue_pg.messages m
                            WHERE m.queue_id = q.id AND m.visible_at <= n
                              AND (m.expires_at IS NULL OR m.expires_at > n) AND m.id <> ALL (got)
                            ORDER BY m.visible_at
                            LIMIT want - cardinality(got)
                            FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN QUERY SELECT m.id, m.receive_count, m.released, m.visible_at
    FROM queue_pg.messages m WHERE m.id = ANY (got);
END $$;
