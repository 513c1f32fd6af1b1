-- Acting on the advice: the tuning settings of a queue, per-type leases, the auto-tuner and its
-- log, and routes that send each type of message to the queue whose timeout fits it.

-- Changes the tuning settings of a queue (NULL leaves one as it is; clear => ['tune_max']
-- removes the upper bound, so max_lease bounds alone). Needs manage on the queue.
--   lease_policy 'fixed' | 'per_type': whether a receive without visibility_timeout gives each
--     message its type's lease (queue_pg.type_leases, refreshed by tune);
--   auto_tune: whether maintenance (sweep) and tune() move visibility_timeout toward the advice;
--   tune_min, tune_max: the bounds the tuner and the per-type leases keep to (seconds;
--     max_lease bounds too);
--   duplicate_budget: the share of deliveries that may be a second lease of a live run (1e-9
--     to 0.01): per-type leases are the processing-time quantile 1 - budget (56_budget.sql).
CREATE OR REPLACE FUNCTION queue_pg.alter_tuning(
    queue text,
    lease_policy text DEFAULT NULL,
    auto_tune boolean DEFAULT NULL,
    tune_min double precision DEFAULT NULL,
    tune_max double precision DEFAULT NULL,
    clear text[] DEFAULT NULL,
    duplicate_budget double precision DEFAULT NULL
) RETURNS SETOF queue_pg.queues
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(alter_tuning.queue, 'manage');
    c text;
BEGIN
    SELECT * INTO q FROM queue_pg.queues t WHERE t.id = q.id FOR NO KEY UPDATE;  -- as it is now, held
    q.lease_policy := coalesce(alter_tuning.lease_policy, q.lease_policy);
    q.auto_tune := coalesce(alter_tuning.auto_tune, q.auto_tune);
    q.tune_min := coalesce(alter_tuning.tune_min, q.tune_min);
    q.tune_max := coalesce(alter_tuning.tune_max, q.tune_max);
    q.duplicate_budget := coalesce(alter_tuning.duplicate_budget, q.duplicate_budget);
    FOREACH c IN ARRAY coalesce(clear, '{}') LOOP
        PERFORM queue_pg._check_choice('clear', c, ARRAY['tune_max']);
        q.tune_max := NULL;
    END LOOP;
    PERFORM queue_pg._check_choice('lease_policy', q.lease_policy, ARRAY['fixed', 'per_type']);
    PERFORM queue_pg._check('tune_min', q.tune_min, 1, q.max_lease);
    IF q.tune_max IS NOT NULL THEN
        PERFORM queue_pg._check('tune_max', q.tune_max, q.tune_min, q.max_lease);
    END IF;
    PERFORM queue_pg._check('duplicate_budget', q.duplicate_budget, 1e-9, 0.01, 'of deliveries');
    UPDATE queue_pg.queues t SET lease_policy = q.lease_policy, auto_tune = q.auto_tune,
        tune_min = q.tune_min, tune_max = q.tune_max, duplicate_budget = q.duplicate_budget
    WHERE t.id = q.id;
    IF q.lease_policy = 'per_type' THEN
        PERFORM queue_pg._refresh_type_leases(q, queue_pg._now());
    END IF;
    RETURN NEXT q;
END $$;

-- Refused stale receipts of a queue since `since`, as far as the samples reach back (2 hours):
-- the sign that consumers outlive their leases. Lapsed leases without any are crashed
-- consumers' (nobody came back to delete), which a longer timeout would only make wait longer.
CREATE OR REPLACE FUNCTION queue_pg._stale_since(queue_id integer, since timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(pg_sequence_last_value(to_regclass(format('queue_pg.stale_receipts_%s', queue_id))), 0)
         - coalesce((SELECT s.stale_receipts FROM queue_pg.queue_samples s
                     WHERE s.queue_id = _stale_since.queue_id
                     ORDER BY s.at <= since DESC, CASE WHEN s.at <= since THEN s.at END DESC, s.at
                     LIMIT 1), 0)
$$;

-- What the tuner and the per-type leases act on: the advice, except that lapsed leases double
-- the timeout only when stale receipts show live consumers outlasting them (see _stale_since);
-- else 6 x p99 alone.
CREATE OR REPLACE FUNCTION queue_pg._target(recommended double precision, p99 double precision,
                                            samples bigint, current_timeout double precision,
                                            max_lease double precision, stale bigint)
RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN stale > 0 THEN recommended
                ELSE least(recommended, queue_pg._advise(p99, samples, 0, current_timeout, max_lease)) END
$$;

-- The per-type leases of a 'per_type' queue, from the last 24 hours: a type with at least 100
-- samples gets the lease of its duplicate budget (_lease_advice), one with 30 to 99 the advice
-- (_target: 6 x p99); the others (and NULL types) the default.
CREATE OR REPLACE FUNCTION queue_pg._refresh_type_leases(q queue_pg.queues, at timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    stale bigint;
BEGIN
    DELETE FROM queue_pg.type_leases l WHERE l.queue_id = q.id;
    IF q.lease_policy <> 'per_type' THEN
        RETURN;
    END IF;
    stale := queue_pg._stale_since(q.id, at - interval '24 hours');
    INSERT INTO queue_pg.type_leases (queue_id, type, lease, samples, refreshed_at)
    SELECT q.id, a.type,
           CASE WHEN b.fit = 'lognormal' THEN b.lease
                ELSE queue_pg._target(a.recommended_timeout, a.p99, a.samples, q.visibility_timeout,
                                      q.max_lease, stale) END,
           a.samples, at
    FROM queue_pg._advice(at - interval '24 hours', at, q.id) a
    JOIN queue_pg._lease_advice(at - interval '24 hours', at, q.id) b
      ON b.scope = 'type' AND b.type = a.type
    WHERE a.scope = 'type' AND a.type IS NOT NULL AND a.samples >= 30 AND a.recommended_timeout IS NOT NULL;
END $$;

-- How often sweep runs a tuning step of the auto_tune queues: the setting queue_pg.tune_interval
-- (an interval from 1 second to 1 day; unset, empty or invalid: 1 minute). Each step reads the
-- advice of a day per auto_tune queue (from the rollups: milliseconds), so a busy database keeps
-- the minute; a queue that must converge fast sets it lower (ALTER DATABASE ... SET).
CREATE OR REPLACE FUNCTION queue_pg._tune_interval() RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT queue_pg._interval_setting('queue_pg.tune_interval', '1 second', '1 day', '1 minute')
$$;

-- One tuning step of a queue. The figures are the last 24 hours' (a day of evidence: a p99 of
-- a mixed queue from a few dozen runs swings from one type to the other); the step acts only
-- when at least 30 runs finished since the timeout last changed (it saw the new timeout at
-- work), moves only when the target (_target) differs by more than 25%, by at most a factor
-- of 2, within [tune_min, least(tune_max, max_lease)]. A step that follows a change the 2x
-- bound cut short, and finds the target still on the same side, completes the move: all the
-- way to the target, however close (a second reading confirms the first; the 25% band is
-- for a timeout the tuner set at its target, else a halving could stop inside it short of the
-- target, 15 s for 12.7, for good). When 6 x p99 of the runs that completed
-- alone already calls for a longer timeout, the step goes up that far at once: stale receipts
-- could only call for more. Else lapses count as a timeout too short only with stale receipts
-- of leases granted since the last change: a consumer leased before it reports back by the
-- time the longest run seen has passed, so the receipts refused since the change count from the
-- first sample (queue_samples, taken by sweep) or tuner mark (tuning_marks) that late; a step
-- that has such receipts and finds neither waits, and takes the mark itself once that time
-- has passed (when apply). Any stale receipt since the change, however old its lease, keeps the
-- timeout from going down: the slow work is still there; nor does it go down before the
-- timeout set has been in force for the longest run seen (a run leased under it could not have
-- shown it too short any sooner).
DROP FUNCTION IF EXISTS queue_pg._tune_step(queue_pg.queues, timestamptz);
CREATE OR REPLACE FUNCTION queue_pg._tune_step(q queue_pg.queues, at timestamptz, apply boolean,
    OUT old_timeout double precision, OUT new_timeout double precision, OUT advice double precision,
    OUT samples bigint, OUT why text)
LANGUAGE plpgsql AS $$
DECLARE
    since timestamptz := at - interval '24 hours';
    a record;
    hi double precision := least(coalesce(q.tune_max, q.max_lease), q.max_lease);
    last record;
    fresh bigint;
    stale bigint;
    settled timestamptz;
    hold boolean := false;
    floor_target double precision;
    rising boolean := false;
    completing boolean;
BEGIN
    old_timeout := q.visibility_timeout;
    new_timeout := q.visibility_timeout;
    SELECT h.at, h.stale_receipts, h.new_timeout, h.advice INTO last FROM queue_pg.tuning_history h
    WHERE h.queue_id = q.id AND h.at <= _tune_step.at ORDER BY h.at DESC, h.id DESC LIMIT 1;
    SELECT count(*) INTO fresh FROM (
        SELECT 1 FROM queue_pg.message_history h
        WHERE h.queue_id = q.id AND h.finished_at >= greatest(since, coalesce(last.at, since))
          AND h.finished_at < at AND h.outcome = 'deleted' AND h.last_received_at IS NOT NULL
        LIMIT 30) f;
    IF fresh < 30 THEN
        why := format('%s runs finished since %s: too few to act on (30 needed)', fresh,
                      greatest(since, coalesce(last.at, since)));
        RETURN;
    END IF;
    SELECT * INTO a FROM queue_pg._advice(since, at, q.id) x WHERE x.scope = 'queue';
    samples := a.samples;
    stale := CASE WHEN last.at IS NULL THEN queue_pg._stale_since(q.id, since)
                  ELSE a.stale_receipts - last.stale_receipts END;
    floor_target := queue_pg._target(a.recommended_timeout, a.p99, a.samples, old_timeout, q.max_lease, 0);
    IF last.at IS NOT NULL AND stale > 0 AND floor_target > 1.25 * old_timeout THEN
        stale := 0;  -- going up on the completed runs alone: the stale receipts can wait
        rising := true;
    ELSIF last.at IS NOT NULL AND stale > 0 THEN
        settled := last.at + make_interval(secs => least(a.max, q.max_lease));
        SELECT a.stale_receipts - b.stale_receipts INTO stale FROM (
            SELECT s.at, s.stale_receipts FROM queue_pg.queue_samples s
            WHERE s.queue_id = q.id AND s.at >= settled AND s.at <= _tune_step.at
            UNION ALL
            SELECT m.at, m.stale_receipts FROM queue_pg.tuning_marks m
            WHERE m.queue_id = q.id AND m.at >= settled AND m.at <= _tune_step.at) b
        ORDER BY b.at LIMIT 1;
        IF NOT FOUND THEN
            IF apply AND at >= settled THEN
                INSERT INTO queue_pg.tuning_marks AS m (queue_id, at, stale_receipts)
                VALUES (q.id, at, a.stale_receipts)
                ON CONFLICT (queue_id) DO UPDATE SET at = excluded.at, stale_receipts = excluded.stale_receipts;
                why := format('%s stale receipts since the last change may be of leases granted before it (runs take up to %s s): counting from now',
                              a.stale_receipts - last.stale_receipts, round(a.max::numeric, 3));
            ELSE
                why := format('%s stale receipts since the last change may be of leases granted before it (runs take up to %s s): waiting for a sample after %s',
                              a.stale_receipts - last.stale_receipts, round(a.max::numeric, 3), settled);
            END IF;
            RETURN;
        END IF;
        hold := true;
    END IF;
    advice := queue_pg._target(a.recommended_timeout, a.p99, a.samples, old_timeout, q.max_lease, stale);
    IF advice < old_timeout AND last.at IS NOT NULL
       AND at < last.at + make_interval(secs => least(a.max, q.max_lease)) THEN
        why := format('advice %s s, but the timeout set at %s has not yet been in force for the longest run (%s s): not lowering %s s yet',
                      queue_pg._fmt(advice), last.at, round(a.max::numeric, 3), queue_pg._fmt(old_timeout));
        RETURN;
    END IF;
    IF hold AND advice < old_timeout THEN
        why := format('advice %s s, but %s stale receipts since the last change: not lowering %s s',
                      queue_pg._fmt(advice), a.stale_receipts - last.stale_receipts, queue_pg._fmt(old_timeout));
        RETURN;
    END IF;
    completing := last.at IS NOT NULL AND last.new_timeout = old_timeout AND last.advice <> last.new_timeout
                  AND sign(advice - old_timeout) = sign(last.advice - last.new_timeout);
    IF NOT completing AND abs(advice - old_timeout) <= 0.25 * old_timeout THEN
        why := format('advice %s s is within 25%% of %s s', queue_pg._fmt(advice), queue_pg._fmt(old_timeout));
        RETURN;
    END IF;
    new_timeout := least(greatest(CASE WHEN completing THEN advice
                                       ELSE least(greatest(advice, old_timeout / 2), old_timeout * 2) END,
                                  q.tune_min), hi);
    why := format('advice %s s (p99 %s s, expiry rate %s, %s samples in 24 hours)%s%s%s',
                  queue_pg._fmt(advice), round(a.p99::numeric, 3), coalesce(round(a.expiry_rate::numeric, 4)::text, 'n/a'),
                  samples,
                  CASE WHEN completing
                       THEN format('; completing the step toward %s s the last change was bounded in', queue_pg._fmt(last.advice))
                       ELSE '' END,
                  CASE WHEN rising
                       THEN '; 6 x p99 of the completed runs alone calls for more (stale receipts since the last change not counted yet)'
                       WHEN advice < a.recommended_timeout
                       THEN format('; leases lapsed but no stale receipt of a lease granted since the last change: crashed consumers, not slow work, so 6 x p99 rather than %s s',
                                   queue_pg._fmt(a.recommended_timeout)) ELSE '' END,
                  CASE WHEN new_timeout <> advice THEN format('; step bounded to %s s (at most 2x per step, within %s..%s s)',
                                                              queue_pg._fmt(new_timeout), queue_pg._fmt(q.tune_min), queue_pg._fmt(hi))
                       ELSE '' END);
END $$;

-- Runs a tuning step on each queue asked (one queue, needing manage; or, queue NULL, every
-- queue with auto_tune on that the caller manages) and, when apply, changes the timeout and
-- logs it; per-type leases are refreshed too. One row per queue looked at.
CREATE OR REPLACE FUNCTION queue_pg._tune(only_id integer, apply boolean, check_access boolean)
RETURNS TABLE (queue text, old_timeout double precision, new_timeout double precision,
               advice double precision, samples bigint, changed boolean, why text)
LANGUAGE plpgsql AS $$
DECLARE
    at timestamptz := queue_pg._now();
    q queue_pg.queues;
    s record;
BEGIN
    FOR q IN
        -- each queue's row before its counters (the lock order, see _queue_sequences): a queue
        -- being dropped or altered is skipped, tuned next time
        SELECT * FROM queue_pg.queues t
        WHERE (CASE WHEN only_id IS NULL THEN t.auto_tune ELSE t.id = only_id END)
          AND (NOT check_access OR queue_pg._denied(t.id, 'manage') IS NULL)
        ORDER BY t.name
        FOR SHARE SKIP LOCKED
    LOOP
        s := queue_pg._tune_step(q, at, apply);
        queue := q.name; old_timeout := s.old_timeout; new_timeout := s.new_timeout;
        advice := s.advice; samples := s.samples; why := s.why;
        changed := apply AND s.new_timeout <> s.old_timeout;
        IF changed THEN
            -- SKIP LOCKED: a queue being altered now is tuned next time, not waited for
            PERFORM 1 FROM queue_pg.queues t WHERE t.id = q.id FOR NO KEY UPDATE SKIP LOCKED;
            IF FOUND THEN
                UPDATE queue_pg.queues t SET visibility_timeout = s.new_timeout WHERE t.id = q.id;
                INSERT INTO queue_pg.tuning_history (at, queue_id, queue, old_timeout, new_timeout, advice,
                                                     samples, why, stale_receipts)
                VALUES (at, q.id, q.name, s.old_timeout, s.new_timeout, s.advice, s.samples, s.why,
                        coalesce(pg_sequence_last_value(to_regclass(format('queue_pg.stale_receipts_%s', q.id))), 0));
            ELSE
                changed := false;
                why := why || '; the queue row is busy: not changed';
            END IF;
        END IF;
        IF apply AND q.lease_policy = 'per_type' THEN
            PERFORM queue_pg._refresh_type_leases(q, at);
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION queue_pg.tune(queue text DEFAULT NULL, apply boolean DEFAULT true)
RETURNS SETOF queue_pg.tuning_step
LANGUAGE plpgsql AS $$
BEGIN
    IF apply IS NULL THEN
        PERFORM queue_pg._raise('QP003', 'apply = NULL is invalid: allowed true or false');
    END IF;
    RETURN QUERY SELECT * FROM queue_pg._tune(
        CASE WHEN tune.queue IS NULL THEN NULL ELSE (queue_pg._queue(tune.queue, 'manage')).id END, apply, true);
END $$;

-- Run by sweep: a sample for queue_stats of each queue in the sweep's scope (at most one every
-- 15 s a queue), whoever sweeps: a limited role samples the queues it may read, so a sweep it
-- leaves open holds the rows of those alone. For a caller who manages every queue (`scope`
-- NULL), also the history's sampling rates, its per-minute rollups (57_rollups.sql: at most
-- 20,000 history rows a call) and a tuning step of the auto_tune queues (at most once per
-- _tune_interval(), default a minute; the mark kept in the samples' clock), which has one
-- holder at a time (a row lock taken with SKIP LOCKED, held to the end of the sweep's
-- transaction).
DROP FUNCTION IF EXISTS queue_pg._maintain(timestamptz, boolean);
CREATE OR REPLACE FUNCTION queue_pg._maintain(at timestamptz, scope integer[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    last timestamptz;
BEGIN
    PERFORM queue_pg._sample(at, scope);
    IF scope IS NOT NULL THEN
        RETURN;
    END IF;
    PERFORM queue_pg._history_sampling(at);  -- 57_rollups.sql
    PERFORM queue_pg._rollup_history(at, 20000);
    PERFORM queue_pg._forget_rollups(clock_timestamp(), 10000);
    -- a row lock no other role can take; a sweep that finds it taken leaves tuning to its holder
    SELECT r.at INTO last FROM queue_pg.tuning_runs r FOR UPDATE SKIP LOCKED;
    IF FOUND AND (last IS NULL OR last <= at - queue_pg._tune_interval() OR last > at) THEN
        UPDATE queue_pg.tuning_runs r SET at = _maintain.at;
        PERFORM queue_pg._tune(NULL, true, false);
        PERFORM queue_pg._refresh_type_leases(q, at) FROM queue_pg.queues q
        WHERE q.id = ANY (ARRAY(SELECT t.id FROM queue_pg.queues t  -- the rows first, as above
                                WHERE t.lease_policy = 'per_type' AND NOT t.auto_tune
                                ORDER BY t.id FOR SHARE SKIP LOCKED));
    END IF;
END $$;

-- The changes the tuner made, of the queues the reader may see.
CREATE OR REPLACE FUNCTION queue_pg._tuning_log()
RETURNS TABLE (at timestamptz, queue text, old_timeout double precision, new_timeout double precision,
               advice double precision, samples bigint, why text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT h.at, h.queue, h.old_timeout, h.new_timeout, h.advice, h.samples, h.why
    FROM queue_pg.tuning_history h
    WHERE queue_pg._sees(h.queue_id)
    ORDER BY h.at, h.id;
END $$;

CREATE OR REPLACE VIEW queue_pg.tuning_log AS SELECT * FROM queue_pg._tuning_log();

-- Routing. The target queue of a message with these attributes sent to queue_id (NULL: no
-- route for its type): the one rule, read by every send path.
CREATE OR REPLACE FUNCTION queue_pg._route_of(queue_id integer, attributes jsonb) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT r.target_id FROM queue_pg.routes r
    WHERE r.queue_id = _route_of.queue_id AND r.type = left(attributes ->> 'type', 100)
$$;

-- The target queue of each message of a send to queue_id (_route_of), the targets held against
-- a concurrent drop_queue like the queue itself (_hold).
CREATE OR REPLACE FUNCTION queue_pg._route(queue_id integer, attributes jsonb[]) RETURNS integer[]
LANGUAGE plpgsql AS $$
DECLARE
    dests integer[];
BEGIN
    SELECT array_agg(queue_pg._route_of(_route.queue_id, a.attr) ORDER BY a.i) INTO dests
    FROM unnest(attributes) WITH ORDINALITY a(attr, i);
    PERFORM queue_pg._hold(x) FROM (SELECT DISTINCT x FROM unnest(dests) x WHERE x IS NOT NULL) t;
    RETURN dests;
END $$;

-- The counting and waking of a routed batch: per target queue, its messages counted as sent
-- and its listeners woken (when the messages are visible at once).
CREATE OR REPLACE FUNCTION queue_pg._routed_sends(queue_id integer, dests integer[], cnt integer,
                                                  visible boolean, debounce boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT coalesce(dests[i], queue_id) AS qid, count(*) AS n
             FROM generate_series(1, cnt) i GROUP BY 1 LOOP
        PERFORM queue_pg._count_flow('sent', t.qid, t.n);
        IF visible AND t.qid <> queue_id THEN
            PERFORM queue_pg._wake(t.qid, debounce);
        END IF;
    END LOOP;
END $$;

-- Sends to `queue` whose attributes' type is `type` land in `target` from now on (one hop: the
-- target's own routes do not apply). Needs manage on both. True when added, false when the
-- same route existed; a route of the type to another target is an error.
CREATE OR REPLACE FUNCTION queue_pg.add_route(queue text, type text, target text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    t queue_pg.queues := queue_pg._queue(target, 'manage');
    old text;
BEGIN
    IF type IS NULL OR length(type) NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('type = %s is invalid: allowed 1 to 100 characters',
                             coalesce(quote_literal(left(type, 100)) || CASE WHEN length(type) > 100 THEN '...' ELSE '' END, 'NULL'));
    END IF;
    IF q.id = t.id THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('target = %s is invalid: a queue cannot route to itself', quote_literal(t.name));
    END IF;
    PERFORM 1 FROM queue_pg.queues x WHERE x.id = q.id FOR NO KEY UPDATE;
    SELECT d.name INTO old FROM queue_pg.routes r JOIN queue_pg.queues d ON d.id = r.target_id
    WHERE r.queue_id = q.id AND r.type = add_route.type;
    IF old = t.name THEN
        RETURN false;
    ELSIF old IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP002',
            MESSAGE = format('type %s of queue %s already routes to %s; drop_route first',
                             quote_literal(type), quote_literal(q.name), quote_literal(old));
    END IF;
    INSERT INTO queue_pg.routes (queue_id, type, target_id) VALUES (q.id, type, t.id);
    UPDATE queue_pg.queues x SET has_routes = true WHERE x.id = q.id;
    RETURN true;
END $$;

-- True when the route existed.
CREATE OR REPLACE FUNCTION queue_pg.drop_route(queue text, type text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    n integer;
BEGIN
    PERFORM 1 FROM queue_pg.queues x WHERE x.id = q.id FOR NO KEY UPDATE;
    DELETE FROM queue_pg.routes r WHERE r.queue_id = q.id AND r.type = drop_route.type;
    GET DIAGNOSTICS n = ROW_COUNT;
    UPDATE queue_pg.queues x SET has_routes = EXISTS (SELECT 1 FROM queue_pg.routes r WHERE r.queue_id = q.id)
    WHERE x.id = q.id;
    RETURN n > 0;
END $$;

-- The routes of a queue (NULL: of every queue the caller may see).
CREATE OR REPLACE FUNCTION queue_pg.list_routes(queue text DEFAULT NULL)
RETURNS SETOF queue_pg.route_info
LANGUAGE plpgsql STABLE AS $$
DECLARE
    only_id integer;
BEGIN
    IF list_routes.queue IS NOT NULL THEN
        only_id := (queue_pg._queue(list_routes.queue)).id;
    END IF;
    RETURN QUERY
    SELECT s.name, r.type, t.name, r.created_at
    FROM queue_pg.routes r
    JOIN queue_pg.queues s ON s.id = r.queue_id
    JOIN queue_pg.queues t ON t.id = r.target_id
    WHERE (only_id IS NULL OR r.queue_id = only_id) AND queue_pg._sees(r.queue_id)
    ORDER BY 1, 2;
END $$;

-- The split the advice calls for (split_advised): each type with at least 30 samples in the
-- last 24 hours gets a queue of its own, named <queue>-<type>, with the source's settings and
-- the type's recommended timeout, and a route to it; types without that evidence stay. apply
-- => true creates the queues (create_queue: needs queue_pg_admin) and routes when the split is
-- advised; an existing queue of that name is used as it is. One row per such type.
CREATE OR REPLACE FUNCTION queue_pg.split(queue text, apply boolean DEFAULT false)
RETURNS TABLE (type text, target text, visibility_timeout double precision, advised boolean,
               routed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(split.queue, 'manage');
    at timestamptz := queue_pg._now();
    a record;
BEGIN
    FOR a IN
        SELECT x.type, x.recommended_timeout, x.split_advised FROM queue_pg._advice(at - interval '24 hours', at, q.id) x
        WHERE x.scope = 'type' AND x.type IS NOT NULL AND x.samples >= 30 AND x.recommended_timeout IS NOT NULL
        ORDER BY x.type
    LOOP
        type := a.type;
        target := left(q.name || '-' || regexp_replace(a.type, '[^A-Za-z0-9_-]', '_', 'g'), 80);
        visibility_timeout := a.recommended_timeout;
        advised := a.split_advised;
        routed := false;
        IF apply AND a.split_advised THEN
            IF NOT EXISTS (SELECT 1 FROM queue_pg.queues t WHERE t.name = target) THEN
                PERFORM queue_pg.create_queue(target, visibility_timeout => a.recommended_timeout,
                    message_ttl => q.message_ttl, delay => q.delay, max_message_size => q.max_message_size,
                    receive_wait => q.receive_wait, max_lease => q.max_lease,
                    dead_letter_queue => q.dead_letter_queue, max_receive_count => q.max_receive_count,
                    in_flight_limit => q.in_flight_limit, history => q.history,
                    history_retention => q.history_retention);
            END IF;
            PERFORM queue_pg.add_route(q.name, a.type, target);
            routed := true;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;
