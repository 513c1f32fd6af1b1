-- Consumers that can be seen to die (sql/schema/0013_consumers.sql). A worker registers on a
-- connection it keeps for its life; the session advisory lock it holds there is its pulse. Its
-- receives name it (receive's `consumer`), so each lease records whose it is. A reap, run every
-- second or so by every registered worker, ends the leases of consumers whose lock has been free
-- for _consumer_grace(): a crashed consumer's messages come back in seconds, whatever their
-- visibility timeout, and a slow job on a live consumer keeps its long lease.

-- The advisory lock class of consumers (the first key of pg_advisory_lock(int4, int4)).
CREATE OR REPLACE FUNCTION queue_pg._consumer_space() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1903587664 $$;

-- How long a consumer's lock must have been free before its leases end: a worker whose
-- registration connection dropped but which lives re-registers under its id (adopt) within it
-- and keeps its leases. Setting queue_pg.consumer_grace (an interval), 1 second to 1 hour,
-- default 2 seconds; a value out of range counts as the default, so no session can make a reap
-- end leases of a consumer that was gone for less than a second.
CREATE OR REPLACE FUNCTION queue_pg._consumer_grace() RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT queue_pg._interval_setting('queue_pg.consumer_grace', '1 second', '1 hour', '2 seconds')
$$;

-- The most lost consumers one reap handles (each holds its row, and may take a lock from the
-- lock table the whole server shares, until the reap's transaction ends); the rest go to the
-- next reap.
CREATE OR REPLACE FUNCTION queue_pg._reap_batch() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 32 $$;

-- Registers the calling session as a consumer and returns its id; the session holds the
-- consumer's advisory lock until it ends. A session is one consumer: a second call returns the
-- id it holds. `adopt`: the id this worker had on a connection it lost; it is kept (with the
-- leases recorded under it) when the caller's role registered it and no reap has ended it yet.
-- NULL when no id could be locked (another session holds the locks of every id tried): the
-- caller works on without crash detection, its leases lapse as usual.
CREATE OR REPLACE FUNCTION queue_pg.register_consumer(name text DEFAULT NULL, adopt integer DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    space integer := queue_pg._consumer_space();
    caller name := queue_pg._caller();
    me integer;
    started timestamptz;
    held boolean;
BEGIN
    IF length(name) > 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('name is %s characters long: allowed 0 to 200 characters', length(name));
    END IF;
    -- The session's own registration, if any: the row this backend wrote (or adopted), as this
    -- role: its pid and start time. Not read from the lock table: a session that let its lock
    -- go could register again and again (a row each), and one that took a lost consumer's lock
    -- would be handed that consumer's id. Where the function's owner may not read this session's start
    -- (no pg_read_all_stats: it is the owner that reads it here), the latest row of this pid and
    -- role: at worst a dead earlier backend's of the same pid and role, which that role could
    -- adopt anyway.
    started := (SELECT a.backend_start FROM pg_catalog.pg_stat_activity a WHERE a.pid = pg_backend_pid());
    SELECT c.id INTO me FROM queue_pg.consumers c
    WHERE c.pid = pg_backend_pid() AND c.role = caller
      AND (started IS NULL OR c.backend_start = started)
    ORDER BY c.id DESC LIMIT 1;
    IF me IS NOT NULL THEN
        held := EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                        WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid()
                          AND l.classid::integer = space AND l.objid::integer = me
                          AND l.objsubid = 2 AND l.granted);
        -- let go: taken again (held: not stacked); held by another session: no id, rather than
        -- an id whose lock this session does not hold (nor a row more)
        IF NOT held AND NOT pg_try_advisory_lock(space, me) THEN
            RETURN NULL;
        END IF;
        IF started IS NULL THEN
            -- maybe an earlier backend's: taken over as by an adoption (a reap that read it
            -- before finds it changed); while another transaction holds it, no id
            UPDATE queue_pg.consumers c SET lost_at = NULL, registered_at = clock_timestamp()
            WHERE c.id = (SELECT k.id FROM queue_pg.consumers k WHERE k.id = me FOR UPDATE SKIP LOCKED);
            IF NOT FOUND AND NOT held THEN
                PERFORM pg_advisory_unlock(space, me);
                RETURN NULL;
            END IF;
        END IF;
        RETURN me;
    END IF;
    IF adopt IS NOT NULL AND pg_try_advisory_lock(space, adopt) THEN
        -- a row another transaction holds (a reap under way, or one kept open) is not waited
        -- for: the caller gets an id of its own
        UPDATE queue_pg.consumers c SET pid = pg_backend_pid(), lost_at = NULL,
                                        registered_at = clock_timestamp(), backend_start = started,
                                        name = coalesce(register_consumer.name, c.name)
        WHERE c.id = (SELECT k.id FROM queue_pg.consumers k WHERE k.id = adopt AND k.role = caller
                      FOR UPDATE SKIP LOCKED)
        RETURNING c.id INTO me;
        IF me IS NOT NULL THEN
            RETURN me;
        END IF;
        PERFORM pg_advisory_unlock(space, adopt);
    END IF;
    FOR attempt IN 1..20 LOOP
        INSERT INTO queue_pg.consumers (role, pid, name, registered_at, backend_start)
        VALUES (caller, pg_backend_pid(), register_consumer.name, clock_timestamp(), started)
        RETURNING id INTO me;
        IF pg_try_advisory_lock(space, me) THEN
            RETURN me;
        END IF;
        DELETE FROM queue_pg.consumers c WHERE c.id = me;
    END LOOP;
    RETURN NULL;
END $$;

-- Unknown consumer ids are refused (QP050): a receive that names one would record leases no
-- reap could ever end early, and nothing would say so. So is another role's consumer: its row
-- is no business of the caller's (a receive that names a consumer may update its row, and an
-- open transaction would then hold that row against its owner's receives and every reap).
CREATE OR REPLACE FUNCTION queue_pg._consumer_unknown(consumer integer) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'QP050',
        MESSAGE = format('consumer = %s is not registered by role %s (or was reaped): register_consumer() gives an id',
                         consumer, quote_literal(queue_pg._caller()));
END $$;

-- Whether the consumer has received from queue_id before (NULL consumer: true). plpgsql, so its
-- plan is kept for the session: a sql function with a subquery is never inlined, and one that
-- is not inlined is planned again at every call (96 µs a receive, measured with track_functions).
CREATE OR REPLACE FUNCTION queue_pg._consumer_on(consumer integer, queue_id integer) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    seen boolean;
BEGIN
    IF consumer IS NULL THEN
        RETURN true;
    END IF;
    SELECT _consumer_on.queue_id = ANY (c.queue_ids) INTO seen FROM queue_pg.consumers c
    WHERE c.id = consumer AND c.role = queue_pg._caller();
    IF NOT FOUND THEN
        RETURN queue_pg._consumer_unknown(consumer);
    END IF;
    RETURN coalesce(seen, false);
END $$;

-- The first receive of a consumer on a queue records the queue (see consumers.queue_ids).
CREATE OR REPLACE FUNCTION queue_pg._consumer_add_queue(consumer integer, queue_id integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE queue_pg.consumers c SET queue_ids = c.queue_ids || _consumer_add_queue.queue_id
    WHERE c.id = consumer AND NOT (_consumer_add_queue.queue_id = ANY (c.queue_ids));
END $$;

-- Ends the leases a lost consumer holds on the queues it received from: visible at once, as if they had lapsed now (the next
-- receive counts each as a lease expiry). Messages released with a delay (a retry's backoff)
-- keep it; rows another transaction holds (a delete or claim under way) are left for the next
-- reap. The number of leases ended.
CREATE OR REPLACE FUNCTION queue_pg._end_leases(consumer integer, queue_ids integer[], n timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    qids integer[];
    key bytea;
    cnt integer;
BEGIN
    WITH held AS (
        SELECT m.id FROM queue_pg.messages m
        WHERE m.queue_id = ANY (queue_ids)
          AND m.visible_at > n AND m.visible_at < 'infinity'
          AND m.consumer_id = consumer AND NOT m.released
        FOR UPDATE SKIP LOCKED
    ), ended AS (
        UPDATE queue_pg.messages m SET visible_at = n, consumer_id = NULL
        FROM held WHERE m.id = held.id
        RETURNING m.queue_id
    )
    SELECT count(*), array_agg(DISTINCT e.queue_id) INTO cnt, qids FROM ended e;
    IF cnt > 0 THEN
        key := queue_pg._key();
        PERFORM pg_notify(queue_pg._channel(q, key), '') FROM unnest(qids) q;
    END IF;
    RETURN cnt;
END $$;

-- Ends the leases of consumers whose session has been gone for _consumer_grace() and forgets
-- them; marks those just found gone. A consumer's session is its registering backend (pid and
-- start time, recorded at registration): gone when no backend has that pid or the one that has
-- it started at another time, running when it is that backend. The sessions are read afresh
-- at each call (pg_stat_clear_snapshot: a transaction otherwise keeps its first read, where a
-- consumer that registered since looks gone). Where the function's owner may not read other roles'
-- backend_start (no pg_read_all_stats), or did not when the consumer registered, a backend with
-- the pid may be the session or a later one; the consumer's lock is tried then
-- (pg_try_advisory_xact_lock): free, its session ended.
-- The caller's own backend is never looked at (its lock is its own).
-- The owner, admins and superusers reap every consumer (their sweeps too); another role the
-- consumers it registered and those that received only from queues it may receive from, so a
-- reap it keeps open holds no row (nor lease) of a consumer of other queues.
-- A known-gone consumer's row is locked (SKIP LOCKED, as it still was when read) before
-- anything else: a reap or adoption under way holds it, and a row another transaction keeps
-- locked is left for a later reap at no cost to this one. A reap handles at most _reap_batch()
-- consumers (those marked within the grace are not looked at) and takes at most twice as many
-- locks. The number of leases ended.
CREATE OR REPLACE FUNCTION queue_pg.reap_consumers() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    space integer := queue_pg._consumer_space();
    grace interval := queue_pg._consumer_grace();
    batch integer := queue_pg._reap_batch();
    real timestamptz := clock_timestamp();
    n timestamptz := queue_pg._now();
    caller name := queue_pg._caller();
    everyone boolean := queue_pg._denied(NULL, 'manage') IS NULL;
    mine integer[];
    c record;
    lost timestamptz;
    qids integer[];
    ended integer := 0;
    taken integer := 0;
    locked integer := 0;
BEGIN
    PERFORM pg_catalog.pg_stat_clear_snapshot();
    IF NOT everyone THEN
        SELECT coalesce(array_agg(DISTINCT g.queue_id), '{}') INTO mine FROM queue_pg.grants g
        WHERE g.privilege = 'receive' AND queue_pg._denied(g.queue_id, 'receive') IS NULL;
    END IF;
    FOR c IN SELECT k.id, k.pid, k.registered_at,
                    a.pid IS NOT NULL AND (a.backend_start IS NULL OR k.backend_start IS NULL) AS unsure
             FROM queue_pg.consumers k
             LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = k.pid
             WHERE k.pid <> pg_backend_pid()
               AND (a.pid IS NULL OR a.backend_start IS NULL OR k.backend_start IS NULL
                    OR a.backend_start <> k.backend_start)
               AND (everyone OR k.role = caller OR k.queue_ids <@ mine)
               -- marked lost within the grace: nothing to do yet
               AND (k.lost_at IS NULL OR k.lost_at <= real - grace OR k.lost_at > real)
             -- the marked first, oldest first; then each role's first unmarked, then each
             -- role's second, ...: a role that leaves lost consumers faster than reaps handle
             -- them delays no other role's
             ORDER BY k.lost_at NULLS LAST, row_number() OVER (PARTITION BY k.role ORDER BY k.id), k.id LOOP
        EXIT WHEN taken >= batch OR locked >= 2 * batch;
        IF c.unsure THEN
            -- pid taken by a backend whose start this owner cannot read: its lock says (tried
            -- before the row, so the rows of live consumers are never locked by a reap)
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(space, c.id);
            locked := locked + 1;
        END IF;
        SELECT k.lost_at, k.queue_ids INTO lost, qids FROM queue_pg.consumers k
        WHERE k.id = c.id AND k.pid = c.pid AND k.registered_at = c.registered_at
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        taken := taken + 1;
        IF lost IS NULL OR lost > real THEN
            UPDATE queue_pg.consumers k SET lost_at = real WHERE k.id = c.id;
        ELSIF lost <= real - grace THEN
            ended := ended + queue_pg._end_leases(c.id, qids, n);
            DELETE FROM queue_pg.consumers k WHERE k.id = c.id;
        END IF;
    END LOOP;
    RETURN ended;
END $$;
