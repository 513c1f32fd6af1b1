-- Periodic tasks (revision 0007): cron evaluated here, ticks fired once by whichever worker
-- gets to them first. Cron lives in SQL, not in a Python library, so the next run a view shows,
-- the tick a worker fires and what psql's `set_schedule` stores are computed by one evaluator.

-- One field of a cron expression as the sorted values it allows, or NULL when malformed:
-- `*`, `a`, `a-b`, each with an optional `/step`, comma lists; `names` (jan..dec, sun..sat)
-- are values `base`, `base` + 1, ...
CREATE OR REPLACE FUNCTION queue_pg._cron_field(spec text, lo integer, hi integer,
                                                names text[] DEFAULT NULL, base integer DEFAULT 0)
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    part text;
    m text[];
    a integer;
    b integer;
    step integer;
    vals integer[] := '{}'::integer[];
BEGIN
    IF spec IS NULL OR spec = '' OR length(spec) > 200 THEN
        RETURN NULL;
    END IF;
    FOREACH part IN ARRAY string_to_array(lower(spec), ',') LOOP
        m := regexp_match(part, '^(\*|([0-9]{1,2}|[a-z]{3})(-([0-9]{1,2}|[a-z]{3}))?)(/([0-9]{1,2}))?$');
        IF m IS NULL THEN
            RETURN NULL;
        END IF;
        step := coalesce(m[6]::integer, 1);
        IF m[1] = '*' THEN
            a := lo;
            b := hi;
        ELSE
            a := CASE WHEN m[2] ~ '^[0-9]' THEN m[2]::integer ELSE array_position(names, m[2]) - 1 + base END;
            b := CASE WHEN m[4] IS NOT NULL
                      THEN CASE WHEN m[4] ~ '^[0-9]' THEN m[4]::integer ELSE array_position(names, m[4]) - 1 + base END
                      WHEN m[6] IS NOT NULL THEN hi
                      ELSE a END;
        END IF;
        IF a IS NULL OR b IS NULL OR step < 1 OR a < lo OR b > hi OR a > b THEN
            RETURN NULL;
        END IF;
        vals := vals || ARRAY(SELECT generate_series(a, b, step));
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT v FROM unnest(vals) v ORDER BY 1);
END $$;

-- The six fields of a cron expression (seconds first; five fields mean second 0), with the
-- macros @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly; NULL if malformed.
CREATE OR REPLACE FUNCTION queue_pg._cron_fields(cron text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE cardinality(f) WHEN 5 THEN '0'::text || f WHEN 6 THEN f END
    FROM (SELECT regexp_split_to_array(btrim(CASE lower(btrim(cron))
              WHEN '@yearly' THEN '0 0 1 1 *' WHEN '@annually' THEN '0 0 1 1 *'
              WHEN '@monthly' THEN '0 0 1 * *' WHEN '@weekly' THEN '0 0 * * 0'
              WHEN '@daily' THEN '0 0 * * *' WHEN '@midnight' THEN '0 0 * * *'
              WHEN '@hourly' THEN '0 * * * *' ELSE cron END), '\s+') AS f) s
    WHERE length(cron) <= 400
$$;

-- The first tick of `cron` in time zone `tz` strictly after `after`; NULL when the expression is
-- malformed or names no time in the next few thousand years (30 February).
-- Cron is wall-clock time: the search runs on local times, each converted to an instant in the
-- zone. A local time a DST change skips (02:30 on a spring-forward night) is PostgreSQL's
-- reading of it, an hour later; a local time that occurs twice (autumn) fires once. As in Vixie
-- cron, a day matches when day-of-month and day-of-week both match if either field starts with
-- `*`, else when either matches; day-of-week 0 and 7 are Sunday.
CREATE OR REPLACE FUNCTION queue_pg._cron_next(cron text, tz text, after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    f text[] := queue_pg._cron_fields(cron);
    secs integer[];
    mins integer[];
    hours integer[];
    doms integer[];
    mons integer[];
    dows integer[];
    star boolean;
    l timestamp;
    cand timestamptz;
    day_ok boolean;
BEGIN
    IF f IS NULL OR tz IS NULL OR after IS NULL THEN
        RETURN NULL;
    END IF;
    secs := queue_pg._cron_field(f[1], 0, 59);
    mins := queue_pg._cron_field(f[2], 0, 59);
    hours := queue_pg._cron_field(f[3], 0, 23);
    doms := queue_pg._cron_field(f[4], 1, 31);
    mons := queue_pg._cron_field(f[5], 1, 12, '{jan,feb,mar,apr,may,jun,jul,aug,sep,oct,nov,dec}', 1);
    dows := queue_pg._cron_field(f[6], 0, 7, '{sun,mon,tue,wed,thu,fri,sat}', 0);
    IF secs IS NULL OR mins IS NULL OR hours IS NULL OR doms IS NULL OR mons IS NULL OR dows IS NULL THEN
        RETURN NULL;
    END IF;
    IF 7 = ANY (dows) THEN
        dows := dows || 0;
    END IF;
    star := f[4] LIKE '*%' OR f[6] LIKE '*%';
    l := date_trunc('second', after AT TIME ZONE tz) + interval '1 second';
    FOR i IN 1..100000 LOOP
        IF NOT extract(month FROM l)::integer = ANY (mons) THEN
            l := date_trunc('month', l) + interval '1 month';
            CONTINUE;
        END IF;
        day_ok := CASE WHEN star THEN extract(day FROM l)::integer = ANY (doms) AND extract(dow FROM l)::integer = ANY (dows)
                       ELSE extract(day FROM l)::integer = ANY (doms) OR extract(dow FROM l)::integer = ANY (dows) END;
        IF NOT day_ok THEN
            l := date_trunc('day', l) + interval '1 day';
        ELSIF NOT extract(hour FROM l)::integer = ANY (hours) THEN
            l := date_trunc('hour', l) + interval '1 hour';
        ELSIF NOT extract(minute FROM l)::integer = ANY (mins) THEN
            l := date_trunc('minute', l) + interval '1 minute';
        ELSIF NOT floor(extract(second FROM l))::integer = ANY (secs) THEN
            l := l + interval '1 second';
        ELSE
            cand := l AT TIME ZONE tz;
            IF cand > after THEN
                RETURN cand;
            END IF;
            l := l + interval '1 second';
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- InvalidSchedule (QP025) unless `cron` is a valid expression that fires and `tz` a time zone
-- PostgreSQL knows; returns the first tick after `after`.
CREATE OR REPLACE FUNCTION queue_pg._check_cron(cron text, tz text, after timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t timestamptz;
    known boolean := tz IS NOT NULL;
BEGIN
    BEGIN
        PERFORM after AT TIME ZONE tz;
    EXCEPTION WHEN invalid_parameter_value THEN
        known := false;
    END;
    IF NOT known THEN
        RAISE EXCEPTION USING ERRCODE = 'QP025',
            MESSAGE = format('tz = %s is invalid: allowed a time zone name of pg_timezone_names (e.g. ''Europe/Paris'', ''UTC'')',
                             coalesce(quote_literal(left(_check_cron.tz, 100)), 'NULL'));
    END IF;
    t := queue_pg._cron_next(cron, tz, after);
    IF t IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP025',
            MESSAGE = format('schedule = %s is invalid: allowed a cron expression of 5 fields (minute hour'
                             ' day-of-month month day-of-week) or 6 (second first), each *, a, a-b, with /step,'
                             ' comma lists, or @hourly, @daily, @weekly, @monthly, @yearly; one that fires',
                             coalesce(quote_literal(left(cron, 100)), 'NULL'));
    END IF;
    RETURN t;
END $$;

-- Creates or updates schedule `name` of `queue`: a message `body` (attributes `attributes`)
-- sent to the queue at each tick of `cron` in `tz`. A name is the queue's own: other queues may
-- have schedules of the same name. Changing the cron or tz restarts it from now; otherwise its
-- next_run stays (a restarted worker re-registering its schedules neither skips nor repeats a
-- tick). Needs manage on the queue.
CREATE OR REPLACE FUNCTION queue_pg.set_schedule(
    name text,
    queue text,
    cron text,
    body jsonb,
    tz text DEFAULT 'UTC',
    attributes jsonb DEFAULT NULL,
    missed text DEFAULT 'skip',
    catch_up integer DEFAULT 10,
    grace double precision DEFAULT 60
) RETURNS TABLE (schedule text, next_run timestamptz, created boolean)
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    n timestamptz := queue_pg._now();
    first timestamptz;
    existed boolean;
BEGIN
    IF name IS NULL OR name !~ '^[A-Za-z0-9_.:-]{1,200}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'QP025',
            MESSAGE = format('name = %s is invalid: allowed 1 to 200 of A-Z a-z 0-9 _ . : -',
                             coalesce(quote_literal(left(set_schedule.name, 100)), 'NULL'));
    END IF;
    PERFORM queue_pg._check_choice('missed', missed, ARRAY['skip', 'catch_up'], 'QP025');
    PERFORM queue_pg._check('catch_up', catch_up, 0, 1000, 'ticks');
    PERFORM queue_pg._check('grace', grace, 0, 3600);
    IF body IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003', MESSAGE = 'body = NULL is invalid: allowed a JSON value';
    END IF;
    PERFORM queue_pg._check_body(q, body, attributes);
    first := queue_pg._check_cron(cron, tz, n);
    PERFORM FROM queue_pg.periodic p WHERE p.queue_id = q.id AND p.name = set_schedule.name FOR UPDATE;
    existed := FOUND;
    RETURN QUERY
    INSERT INTO queue_pg.periodic AS p (name, queue_id, cron, tz, body, attributes, missed, catch_up, grace, next_run)
    VALUES (set_schedule.name, q.id, set_schedule.cron, set_schedule.tz, set_schedule.body, set_schedule.attributes,
            set_schedule.missed, set_schedule.catch_up, set_schedule.grace, first)
    ON CONFLICT ON CONSTRAINT periodic_pkey DO UPDATE SET
        cron = excluded.cron, tz = excluded.tz, body = excluded.body,
        attributes = excluded.attributes, missed = excluded.missed, catch_up = excluded.catch_up,
        grace = excluded.grace, updated_at = statement_timestamp(),
        next_run = CASE WHEN (p.cron, p.tz) = (excluded.cron, excluded.tz)
                        THEN p.next_run ELSE excluded.next_run END
    RETURNING p.name, p.next_run, NOT existed;
END $$;

-- Removes schedule `name` of `queue`; true when it existed. Needs manage on the queue.
CREATE OR REPLACE FUNCTION queue_pg.drop_schedule(name text, queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
BEGIN
    DELETE FROM queue_pg.periodic p WHERE p.queue_id = q.id AND p.name = drop_schedule.name;
    RETURN FOUND;
END $$;

-- Sends the message of every due tick of the schedules of `queues` (NULL: every queue) that the
-- caller may send to, and moves each schedule's next_run past now, in one transaction: a due row
-- is locked with SKIP LOCKED, so of the workers that race for a tick one sends it and the others
-- pass (a row they reach after its commit is no longer due). Ticks more than `grace` seconds late
-- were missed: 'skip' drops them, 'catch_up' sends the latest `catch_up` of them. Each message
-- has the schedule's attributes plus type (the task), schedule and tick. Returns what it sent.
CREATE OR REPLACE FUNCTION queue_pg.fire_schedules(queues text[] DEFAULT NULL)
RETURNS TABLE (schedule text, queue text, tick timestamptz, message_id bigint)
LANGUAGE plpgsql AS $$
DECLARE
    s record;
    n timestamptz := queue_pg._now();
    t timestamptz;
    ticks timestamptz[];
    late integer;
    dropped integer;
    keep integer;
    id bigint;
BEGIN
    FOR s IN
        SELECT p.*, q.name AS queue_name
        FROM queue_pg.periodic p JOIN queue_pg.queues q ON q.id = p.queue_id
        WHERE p.next_run <= n AND (fire_schedules.queues IS NULL OR q.name = ANY (fire_schedules.queues))
          AND queue_pg._denied(q.id, 'send') IS NULL
        ORDER BY p.next_run
        FOR UPDATE OF p SKIP LOCKED
    LOOP
        -- every tick due, oldest first (at most 10,000: past those, jump to the grace period)
        t := s.next_run;
        ticks := '{}';
        FOR i IN 1..10000 LOOP
            EXIT WHEN t IS NULL OR t > n;
            ticks := ticks || t;
            t := queue_pg._cron_next(s.cron, s.tz, t);
        END LOOP;
        IF t IS NOT NULL AND t <= n THEN
            t := queue_pg._cron_next(s.cron, s.tz, n - queue_pg._seconds(s.grace) - interval '1 microsecond');
            FOR i IN 1..10000 LOOP
                EXIT WHEN t IS NULL OR t > n;
                ticks := ticks || t;
                t := queue_pg._cron_next(s.cron, s.tz, t);
            END LOOP;
            IF t IS NOT NULL AND t <= n THEN  -- still more: at most 20,000 ticks looked at a firing
                t := queue_pg._cron_next(s.cron, s.tz, n);
            END IF;
        END IF;
        -- keep the ticks within the grace period and the latest `catch_up` late ones
        late := (SELECT count(*) FROM unnest(ticks) x WHERE x < n - queue_pg._seconds(s.grace));
        keep := CASE s.missed WHEN 'catch_up' THEN least(late, s.catch_up) ELSE 0 END;
        dropped := late - keep;
        ticks := ticks[dropped + 1:];
        FOREACH tick IN ARRAY ticks LOOP
            id := queue_pg.send(s.queue_name, s.body, attributes => coalesce(s.attributes, '{}')
                || jsonb_build_object('schedule', s.name, 'tick', tick));
            schedule := s.name;
            queue := s.queue_name;
            message_id := id;
            RETURN NEXT;
        END LOOP;
        UPDATE queue_pg.periodic p SET
            next_run = coalesce(t, 'infinity'),
            last_run = CASE WHEN cardinality(ticks) > 0 THEN n ELSE p.last_run END,
            last_tick = coalesce(ticks[cardinality(ticks)], p.last_tick),
            last_message_id = coalesce(id, p.last_message_id),
            skipped = p.skipped + dropped
        WHERE p.queue_id = s.queue_id AND p.name = s.name;
        id := NULL;
    END LOOP;
END $$;

-- The schedules of the queues the caller may see: no bodies.
CREATE OR REPLACE FUNCTION queue_pg._schedules()
RETURNS TABLE (schedule text, queue text, cron text, tz text, next_run timestamptz, last_run timestamptz,
               last_tick timestamptz, last_message_id bigint, missed text, catch_up integer,
               grace double precision, skipped bigint, type text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT p.name, q.name, p.cron, p.tz, p.next_run, p.last_run, p.last_tick, p.last_message_id,
           p.missed, p.catch_up, p.grace, p.skipped, left(p.attributes ->> 'type', 100)
    FROM queue_pg.periodic p JOIN queue_pg.queues q ON q.id = p.queue_id
    WHERE queue_pg._sees(q.id)
    ORDER BY p.name, q.name;
END $$;

CREATE OR REPLACE VIEW queue_pg.schedules AS SELECT * FROM queue_pg._schedules();
