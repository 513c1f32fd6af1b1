-- Chains and chords (docs/jobs.md, "Chains, groups and chords"), kept in the database so that
-- no worker holds their state. A chain's steps still to run travel in its message body (the
-- envelope's `then`: [{queue, task, args, kwargs}, ...]); a chord's callback and the results of
-- its members in queue_pg.chords / queue_pg.chord_members (revision 0027). Both move on in
-- queue_pg.complete_step, in the transaction that deletes the finished job's message: the next
-- step, or the callback, is sent exactly when the job is settled as succeeded, and by the role
-- that settles it (its `send` grant decides, as for any send).

-- The envelope of a step: the signature's task and arguments, `extra` appended to its args
-- (the previous step's result, or a chord's list of results), and its own `then`.
CREATE OR REPLACE FUNCTION queue_pg._next_step(sig jsonb, extra jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT jsonb_build_object('task', sig->>'task',
                              'args', coalesce(sig->'args', '[]'::jsonb) || extra,
                              'kwargs', coalesce(sig->'kwargs', '{}'::jsonb))
           || CASE WHEN jsonb_typeof(sig->'then') = 'array' AND jsonb_array_length(sig->'then') > 0
                   THEN jsonb_build_object('then', sig->'then') ELSE '{}'::jsonb END
$$;

-- A job of a chain or a chord succeeded with `result`: deletes its message under its receipt
-- (with its result kept for `ttl` seconds when ttl is given, as queue_pg.complete_task), then
-- sends the chain's next step with the result appended to its arguments, and counts a chord's
-- member done, sending the callback with the list of results (in the members' order) when it
-- was the last. False, and nothing else done, when the message was gone already.
CREATE OR REPLACE FUNCTION queue_pg.complete_step(queue text, receipt text, result jsonb,
                                                  ttl double precision DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'receive');
    r record := queue_pg._parse_receipt(q.id, receipt, queue_pg._key());
    b jsonb;
    nxt jsonb;
    cid bigint;
    c queue_pg.chords;
    results jsonb;
BEGIN
    SELECT m.body INTO b FROM queue_pg.messages m WHERE m.id = r.id AND m.queue_id = q.id;
    IF ttl IS NULL THEN
        IF NOT queue_pg.delete_message(queue, receipt) THEN
            RETURN false;
        END IF;
    ELSIF NOT queue_pg.complete_task(queue, receipt, result, ttl) THEN
        RETURN false;
    END IF;
    IF jsonb_typeof(b->'then') = 'array' AND jsonb_array_length(b->'then') > 0 THEN
        nxt := b->'then'->0;
        PERFORM queue_pg.send(nxt->>'queue',
                              queue_pg._next_step(nxt || jsonb_build_object('then', (b->'then') - 0),
                                                  jsonb_build_array(result)),
                              attributes => jsonb_build_object('type', nxt->>'task'));
    END IF;
    -- a chord's member: known by its message, not by what its body says
    UPDATE queue_pg.chord_members x SET result = complete_step.result, done_at = queue_pg._now()
    WHERE x.queue_id = q.id AND x.message_id = r.id AND x.done_at IS NULL
    RETURNING x.chord_id INTO cid;
    IF cid IS NOT NULL THEN
        -- the chord's row lock orders members finishing together: one of them sees 0
        UPDATE queue_pg.chords x SET pending = x.pending - 1 WHERE x.id = cid RETURNING x.* INTO c;
        IF c.pending = 0 THEN
            SELECT jsonb_agg(x.result ORDER BY x.idx) INTO results
            FROM queue_pg.chord_members x WHERE x.chord_id = c.id;
            -- a callback queue dropped meanwhile takes the callback with it, as it takes its
            -- messages: the member is settled all the same, not held (and run again) for it
            IF EXISTS (SELECT 1 FROM queue_pg.queues y WHERE y.name = c.callback_queue) THEN
                PERFORM queue_pg.send(c.callback_queue,
                                      queue_pg._next_step(c.callback, jsonb_build_array(results)),
                                      attributes => jsonb_build_object('type', c.callback->>'task',
                                                                       'chord', c.id));
            ELSE
                RAISE WARNING USING
                    MESSAGE = format('chord %s: its callback %s was not sent: its queue %s was dropped',
                                     c.id, quote_literal(c.callback->>'task'), quote_literal(c.callback_queue));
            END IF;
            DELETE FROM queue_pg.chords x WHERE x.id = c.id;
        END IF;
    END IF;
    RETURN true;
END $$;

-- Starts a chord: sends each of `members` ([{"queue", "body", "attributes"}, ...], bodies task
-- envelopes) and records them with `callback` ({"task", "args", "kwargs"}, sent to
-- `callback_queue` once all succeeded), in the caller's transaction. The caller needs `send` on
-- every queue, the callback's included. Returns the chord's id and the members' message ids.
CREATE OR REPLACE FUNCTION queue_pg.send_chord(members jsonb, callback_queue text, callback jsonb)
RETURNS TABLE (chord_id bigint, message_ids bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    cq queue_pg.queues := queue_pg._queue(callback_queue, 'send');
    cid bigint;
    m jsonb;
    i integer := 0;
    mid bigint;
    ids bigint[] := '{}'::bigint[];
BEGIN
    IF jsonb_typeof(members) IS DISTINCT FROM 'array' OR jsonb_array_length(members) = 0
       OR jsonb_array_length(members) > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('members = %s is invalid: need an array of 1 to 10000 {"queue", "body"} objects',
                             left(coalesce(members::text, 'NULL'), 200));
    END IF;
    IF jsonb_typeof(callback) IS DISTINCT FROM 'object' OR jsonb_typeof(callback->'task') IS DISTINCT FROM 'string' THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('callback = %s is invalid: need {"task": name, "args": [...], "kwargs": {...}}',
                             left(coalesce(callback::text, 'NULL'), 200));
    END IF;
    INSERT INTO queue_pg.chords (callback_queue, callback, size, pending, created_at)
    VALUES (cq.name, callback, jsonb_array_length(members), jsonb_array_length(members), queue_pg._now())
    RETURNING id INTO cid;
    FOR m IN SELECT e FROM jsonb_array_elements(members) e LOOP
        IF jsonb_typeof(m->'queue') IS DISTINCT FROM 'string' OR jsonb_typeof(m->'body') IS DISTINCT FROM 'object' THEN
            RAISE EXCEPTION USING ERRCODE = 'QP003',
                MESSAGE = format('members[%s] = %s is invalid: need {"queue": name, "body": {...}}',
                                 i, left(m::text, 200));
        END IF;
        mid := queue_pg.send(m->>'queue', (m->'body') || jsonb_build_object('chord', cid),
                             attributes => m->'attributes');
        -- where it is: a route (a max_running task's) may have sent it to another queue
        INSERT INTO queue_pg.chord_members (chord_id, idx, queue_id, message_id)
        SELECT cid, i, x.queue_id, x.id FROM queue_pg.messages x WHERE x.id = mid;
        ids := ids || mid;
        i := i + 1;
    END LOOP;
    RETURN QUERY SELECT cid, ids;
END $$;

-- Chords whose callback can never be sent, deleted by sweep with their member rows. The rule: a
-- member is counted done only by complete_step on its own message, in its own queue, so a member
-- not done whose message is gone (purged, expired, deleted by hand, settled in another queue,
-- its queue dropped: that takes its member row too) never will be, and its chord's `pending`
-- never reaches 0. Such a chord is dead from that moment on (a message never comes back), and
-- one that can still complete is never taken: each of its members not done still has its message
-- somewhere (its queue, a dead-letter queue it can be redriven from). One statement reads the
-- members and the messages, so a member settling meanwhile is seen wholly before (its message
-- there) or wholly after (done): never as gone.
-- Locks: the member rows, then the chord's (complete_step's order), both SKIP LOCKED: a chord
-- with a member being settled now is left to a later sweep; nothing waits, nothing deadlocks.
-- Scope (NULL: all): a limited role's sweep takes only chords of its own queues (every queue of
-- the chord that still exists, members' and callback's, one it sees; at least one).
-- Returns how many; a NOTICE names the first ten (the client logs it).
CREATE OR REPLACE FUNCTION queue_pg._forget_chords(max_rows integer, scope integer[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    dead bigint[];
    free bigint[];
    shown text;
    cnt integer;
BEGIN
    SELECT array_agg(c.id) INTO dead FROM (
        SELECT c.id FROM queue_pg.chords c
        WHERE c.pending > (SELECT count(*) FROM queue_pg.chord_members x
                           WHERE x.chord_id = c.id AND x.done_at IS NULL
                             AND EXISTS (SELECT 1 FROM queue_pg.messages m WHERE m.id = x.message_id))
          AND (scope IS NULL OR (
               NOT EXISTS (SELECT 1 FROM queue_pg.chord_members x
                           WHERE x.chord_id = c.id AND x.queue_id <> ALL (scope))
               AND NOT EXISTS (SELECT 1 FROM queue_pg.queues q
                               WHERE q.name = c.callback_queue AND q.id <> ALL (scope))
               AND (EXISTS (SELECT 1 FROM queue_pg.chord_members x WHERE x.chord_id = c.id)
                    OR EXISTS (SELECT 1 FROM queue_pg.queues q WHERE q.name = c.callback_queue))))
        ORDER BY c.id
        LIMIT max_rows) c;
    IF dead IS NULL THEN
        RETURN 0;
    END IF;
    -- chords whose every member row this sweep could lock (none being settled now)
    SELECT array_agg(c.id) INTO free
    FROM unnest(dead) c(id)
    WHERE (SELECT count(*) FROM queue_pg.chord_members x WHERE x.chord_id = c.id)
        = (SELECT count(*) FROM (SELECT 1 FROM queue_pg.chord_members x WHERE x.chord_id = c.id
                                 FOR UPDATE SKIP LOCKED) l);
    WITH d AS (
        DELETE FROM queue_pg.chords c
        WHERE c.id = ANY (ARRAY(SELECT y.id FROM queue_pg.chords y WHERE y.id = ANY (free)
                                FOR UPDATE SKIP LOCKED))
        RETURNING c.id, c.callback_queue, c.callback->>'task' AS task, c.size, c.pending
    )
    SELECT (SELECT count(*) FROM d),
           (SELECT string_agg(format('chord %s (callback %s on queue %s, %s of %s members left)',
                                     f.id, quote_literal(f.task), quote_literal(f.callback_queue),
                                     f.pending, f.size), '; ' ORDER BY f.id)
            FROM (SELECT * FROM d ORDER BY d.id LIMIT 10) f)
    INTO cnt, shown;
    IF cnt > 0 THEN
        RAISE NOTICE USING
            MESSAGE = format('queue_pg sweep: removed %s chord(s) whose callback can never run: %s%s',
                             cnt, shown, CASE WHEN cnt > 10 THEN '; ...' ELSE '' END),
            DETAIL = 'a member''s message was gone before it succeeded (purged, expired, deleted, or its queue dropped)';
    END IF;
    RETURN cnt;
END $$;
