-- Consumers that can be seen to die (sql/schema/0013_consumers.sql, 0020). A worker registers
-- and then, every second, writes a heartbeat and reaps. Its receives name it (receive's
-- `consumer`), so each lease records whose it is. A reap ends the leases of consumers found dead
-- for _consumer_grace(): a crashed consumer's messages come back in seconds, whatever their
-- visibility timeout, and a slow job on a live consumer keeps its long lease.
-- Dead is decided in one of two ways (see reap_consumers). A consumer registered on a session of
-- its own (`session`: a direct connection, or a session pooler's) on this very server is dead as
-- soon as its backend is gone or no longer holds the consumer's advisory lock (a session pooler's
-- DISCARD ALL lets it go): the fast path. Every other consumer (registered behind a transaction
-- pooler, on another server before a failover or restart, or one whose lock another session
-- took first) is dead when its heartbeat is older than the grace: no backend identity a pooler
-- shares or recycles, and no pid of a server that is gone, decides.

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

-- How long a consumer last seen on another server (before a failover, switchover or restart:
-- its rows came over with the pids of a server that is gone) has to come back (adopt its id, or
-- beat) once a reap here found it: its worker must reconnect first. At least the grace, and 15 s.
CREATE OR REPLACE FUNCTION queue_pg._consumer_rejoin() RETURNS interval
LANGUAGE sql STABLE AS $$ SELECT greatest(queue_pg._consumer_grace(), interval '15 seconds') $$;

-- The server's identity: its system identifier and its postmaster's start, neither of which a
-- replica promoted in its place, nor the same server restarted, shares. Rows whose seen_on is
-- another name were written on another server: their pids mean nothing here. (The start as epoch
-- seconds: a timestamp's text would follow each session's DateStyle and TimeZone.)
CREATE OR REPLACE FUNCTION queue_pg._consumer_server() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT (SELECT s.system_identifier FROM pg_catalog.pg_control_system() s)::text || '/'
           || extract(epoch FROM pg_catalog.pg_postmaster_start_time())::text
$$;

-- Registers a consumer and returns its id; its worker then calls consumer_heartbeat(id) every
-- second or so. `session` (the default): the caller's connection is a session of its own, kept
-- for the consumer's life (a direct connection, or a session pooler's); the session then holds
-- the consumer's advisory lock until it ends, which lets a reap see it die at once, and a second
-- call in the session returns the id it holds. The session's own registration is the one its
-- setting queue_pg.consumer names that this backend wrote as this role: a pooler's DISCARD ALL
-- clears the setting (and the lock), so a later client of the same backend gets an id of its
-- own. `session => false` (behind a transaction pooler, where a backend is anyone's): no lock,
-- no setting, no lookup by backend; the heartbeat alone says the consumer lives.
-- `adopt`: the id this worker had on a connection it lost; it is kept (with the leases recorded
-- under it) when the caller's role registered it and no reap has ended it yet.
-- Nobody can keep a registration from succeeding: a consumer whose advisory lock another
-- session holds already (pg_advisory_lock is open to every role) is registered all the same,
-- known alive by its heartbeat only, with a WARNING saying so. NULL only for a session that let
-- its own consumer's lock go while another session took it.
CREATE OR REPLACE FUNCTION queue_pg.register_consumer(name text DEFAULT NULL, adopt integer DEFAULT NULL,
                                                      session boolean DEFAULT true)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    space integer := queue_pg._consumer_space();
    caller name := queue_pg._caller();
    server text := queue_pg._consumer_server();
    real timestamptz := clock_timestamp();
    me integer;
    started timestamptz;
    held boolean;
    named text;
BEGIN
    IF length(name) > 200 THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('name is %s characters long: allowed 0 to 200 characters', length(name));
    END IF;
    session := coalesce(session, true);
    -- NULL where the function's owner may not read this session's start (no pg_read_all_stats:
    -- it is the owner that reads it here)
    started := (SELECT a.backend_start FROM pg_catalog.pg_stat_get_activity(pg_backend_pid()) a);
    IF session THEN
        named := current_setting('queue_pg.consumer', true);
        IF named ~ '^[0-9]{1,9}$' THEN
            SELECT c.id INTO me FROM queue_pg.consumers c
            WHERE c.id = named::integer AND c.pid = pg_backend_pid() AND c.role = caller
              AND c.session AND c.seen_on = server
              AND (started IS NULL OR c.backend_start IS NULL OR c.backend_start = started);
        END IF;
        IF me IS NOT NULL THEN
            held := EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                            WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid()
                              AND l.classid::integer = space AND l.objid::integer = me
                              AND l.objsubid = 2 AND l.granted);
            -- let go: taken again (held: not stacked); held by another session: no id, rather
            -- than an id whose lock this session does not hold (nor a row more)
            IF NOT held AND NOT pg_try_advisory_lock(space, me) THEN
                RETURN NULL;
            END IF;
            RETURN me;
        END IF;
    END IF;
    IF adopt IS NOT NULL THEN
        held := session AND pg_try_advisory_lock(space, adopt);
        -- a row another transaction holds (a reap under way, or one kept open) is not waited
        -- for: the caller gets an id of its own
        UPDATE queue_pg.consumers c SET pid = pg_backend_pid(), lost_at = NULL, lost_on = NULL,
                                        registered_at = real, backend_start = started,
                                        last_seen = real, seen_on = server, session = held,
                                        name = coalesce(register_consumer.name, c.name)
        WHERE c.id = (SELECT k.id FROM queue_pg.consumers k WHERE k.id = adopt AND k.role = caller
                      FOR UPDATE SKIP LOCKED)
        RETURNING c.id INTO me;
        IF me IS NULL AND held THEN
            PERFORM pg_advisory_unlock(space, adopt);
        END IF;
    END IF;
    IF me IS NULL THEN
        INSERT INTO queue_pg.consumers (role, pid, name, registered_at, backend_start, last_seen,
                                        seen_on, session)
        VALUES (caller, pg_backend_pid(), register_consumer.name, real, started, real, server, false)
        RETURNING id INTO me;
        held := session AND pg_try_advisory_lock(space, me);
        IF held THEN
            UPDATE queue_pg.consumers c SET session = true WHERE c.id = me;
        END IF;
    END IF;
    IF session THEN
        PERFORM set_config('queue_pg.consumer', me::text, false);
        IF NOT held THEN
            RAISE WARNING USING
                MESSAGE = format('consumer %s: its advisory lock (%s, %s) is held by another session;'
                                 ' it is known alive by its heartbeats only (consumer_heartbeat)',
                                 me, space, me),
                HINT = 'a session other than the consumer''s took that lock: this consumer''s end is seen a grace period later';
        END IF;
    END IF;
    RETURN me;
END $$;

-- A consumer's sign of life, written by its worker every second or so (not per message): its
-- heartbeat, on the real clock, and the server that saw it; a mark of lost is cleared. Only the
-- role that registered the consumer beats for it (another role's call changes nothing and holds
-- no row). A beat from another backend than the registering session's (a transaction pooler's,
-- or a new connection) makes the consumer a heartbeat one: its registering backend no longer
-- speaks for it. False when no such consumer is registered (reaped): register again.
CREATE OR REPLACE FUNCTION queue_pg.consumer_heartbeat(consumer integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    server text := queue_pg._consumer_server();
    started timestamptz := (SELECT a.backend_start
                            FROM pg_catalog.pg_stat_get_activity(pg_backend_pid()) a);
BEGIN
    UPDATE queue_pg.consumers c
    SET last_seen = clock_timestamp(), seen_on = server, lost_at = NULL, lost_on = NULL,
        session = c.session AND c.pid = pg_backend_pid() AND c.seen_on = server
                  AND (started IS NULL OR c.backend_start IS NULL OR c.backend_start = started)
    WHERE c.id = consumer AND c.role = queue_pg._caller();
    RETURN FOUND;
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

-- Ends the leases of consumers dead for _consumer_grace() and forgets them; marks those just
-- found dead. Dead: for a session consumer seen last on this server, no backend with the
-- registering backend's pid and start time (recorded at registration), or one that has neither
-- beaten within the grace nor holds the consumer's advisory lock (pg_locks: a lock another
-- session holds says nothing; a session pooler's DISCARD ALL let it go); for any other
-- consumer, no heartbeat for the grace. A consumer seen last on another server (the rows came over in a
-- failover, or the server restarted) has _consumer_rejoin() from the mark to come back. The
-- sessions are read afresh at each call (pg_stat_clear_snapshot: a transaction otherwise keeps
-- its first read, where a consumer that registered since looks gone). Where the function's owner
-- may not read other roles' backend_start (no pg_read_all_stats), a backend with the pid that
-- holds the lock is taken for the session. The caller's own backend's session consumer is never
-- looked at (its lock is its own).
-- The owner, admins and superusers reap every consumer (their sweeps too); another role the
-- consumers it registered and those that received only from queues it may receive from, so a
-- reap it keeps open holds no row (nor lease) of a consumer of other queues.
-- A dead consumer's row is locked (SKIP LOCKED, and only while it still is: a beat or adoption
-- since counts) before anything else: a reap or adoption under way holds it, and a row another
-- transaction keeps locked is left for a later reap at no cost to this one. A reap handles at
-- most _reap_batch() consumers (those marked within their allowance are not looked at). The
-- number of leases ended.
CREATE OR REPLACE FUNCTION queue_pg.reap_consumers() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    space integer := queue_pg._consumer_space();
    grace interval := queue_pg._consumer_grace();
    rejoin interval := queue_pg._consumer_rejoin();
    batch integer := queue_pg._reap_batch();
    server text := queue_pg._consumer_server();
    real timestamptz := clock_timestamp();
    n timestamptz := queue_pg._now();
    caller name := queue_pg._caller();
    everyone boolean := queue_pg._denied(NULL, 'manage') IS NULL;
    mine integer[];
    c record;
    now_ record;
    ended integer := 0;
    taken integer := 0;
BEGIN
    PERFORM pg_catalog.pg_stat_clear_snapshot();
    IF NOT everyone THEN
        SELECT coalesce(array_agg(DISTINCT g.queue_id), '{}') INTO mine FROM queue_pg.grants g
        WHERE g.privilege = 'receive' AND queue_pg._denied(g.queue_id, 'receive') IS NULL;
    END IF;
    FOR c IN
        WITH locks AS MATERIALIZED (
            SELECT l.pid, l.objid::integer AS id FROM pg_catalog.pg_locks l
            WHERE l.locktype = 'advisory' AND l.classid::integer = space AND l.objsubid = 2
              AND l.granted
        )
        SELECT k.id, k.registered_at, k.seen_on = server AS here
        FROM queue_pg.consumers k
        WHERE (everyone OR k.role = caller OR k.queue_ids <@ mine)
          AND NOT CASE
              WHEN k.seen_on IS DISTINCT FROM server THEN false
              WHEN k.session THEN
                  k.pid = pg_backend_pid()
                  OR (EXISTS (SELECT 1 FROM pg_catalog.pg_stat_get_activity(k.pid) a
                              WHERE a.pid = k.pid
                                AND (a.backend_start IS NULL OR k.backend_start IS NULL
                                     OR a.backend_start = k.backend_start))
                      -- a worker beats every second: pg_locks (whose read takes every lock
                      -- manager partition's lock) is read only when one did not, and only once
                      AND (coalesce(k.last_seen >= real - grace, false)
                           OR EXISTS (SELECT 1 FROM locks l WHERE l.pid = k.pid AND l.id = k.id)))
              ELSE coalesce(k.last_seen >= real - grace, false)
          END
          -- marked (on this server) within its allowance: nothing to do yet
          AND (k.lost_at IS NULL OR k.lost_on IS DISTINCT FROM server OR k.lost_at > real
               OR k.lost_at <= real - CASE WHEN k.seen_on = server THEN grace ELSE rejoin END)
        -- the marked first, oldest first; then each role's first unmarked, then each role's
        -- second, ...: a role that leaves lost consumers faster than reaps handle them delays
        -- no other role's
        ORDER BY k.lost_at NULLS LAST, row_number() OVER (PARTITION BY k.role ORDER BY k.id), k.id
    LOOP
        EXIT WHEN taken >= batch;
        -- as it is now: a beat or an adoption since the read above makes it live
        SELECT x.lost_at, x.lost_on, x.queue_ids INTO now_ FROM queue_pg.consumers x
        WHERE x.id = c.id AND x.registered_at = c.registered_at
          AND NOT (x.seen_on = server AND NOT x.session AND x.last_seen >= real - grace)
        FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        taken := taken + 1;
        IF now_.lost_at IS NULL OR now_.lost_on IS DISTINCT FROM server OR now_.lost_at > real THEN
            UPDATE queue_pg.consumers x SET lost_at = real, lost_on = server WHERE x.id = c.id;
        ELSIF now_.lost_at <= real - (CASE WHEN c.here THEN grace ELSE rejoin END) THEN
            ended := ended + queue_pg._end_leases(c.id, now_.queue_ids, n);
            DELETE FROM queue_pg.consumers x WHERE x.id = c.id;
        END IF;
    END LOOP;
    RETURN ended;
END $$;
