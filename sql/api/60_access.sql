-- Access control: who may do what on which queue, grants, and (last, on every apply) the
-- SECURITY DEFINER / search_path / EXECUTE settings of every function. Must stay the last api
-- file: CREATE OR REPLACE in the files before it resets those settings.

-- The caller: the role the session is SET ROLE to, else the session user. Inside a SECURITY
-- DEFINER function current_user is the owner, but the `role` setting and session_user still name
-- whoever called (a caller's own SECURITY DEFINER function is seen as its session, not its owner).
CREATE OR REPLACE FUNCTION queue_pg._caller() RETURNS name
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('role'), 'none'), session_user)::name
$$;

-- Why role `who` may not do `need` on a queue, or NULL when it may. The whole rule, in one place:
--   superusers, the owner (and roles with its privileges) and queue_pg_admin: everything;
--   'create' (a queue): nobody else;
--   'send' / 'receive' / 'manage': a grant of that privilege on the queue (queue_pg.grant) to
--   the role or a role whose privileges it has, and for send membership of queue_pg_producer,
--   for receive of queue_pg_consumer.
-- Cheap on purpose (it runs at the start of most calls): it uses the role caches (to_regrole,
-- pg_has_role), not the pg_roles view. A role that no longer exists (NULL) may do nothing.
CREATE OR REPLACE FUNCTION queue_pg._denied_to(who name, queue_id integer, need text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    grp text;
    why text;
BEGIN
    IF who IS NULL THEN
        RETURN 'the role no longer exists';
    END IF;
    -- a superuser has every role's privileges, the owner's included
    IF pg_has_role(who, current_user, 'USAGE') OR coalesce(pg_has_role(who, to_regrole('queue_pg_admin'), 'USAGE'), false) THEN
        RETURN NULL;
    END IF;
    IF need = 'create' THEN
        RETURN 'only members of queue_pg_admin (or the owner, or a superuser) create queues';
    END IF;
    grp := CASE need WHEN 'send' THEN 'queue_pg_producer' WHEN 'receive' THEN 'queue_pg_consumer' END;
    IF NOT EXISTS (SELECT 1 FROM queue_pg.grants g
                   WHERE g.queue_id = _denied_to.queue_id AND g.privilege = need
                     AND pg_has_role(who, g.role, 'USAGE')) THEN
        why := format('no %s grant on the queue for the role or a role it belongs to', need);
    END IF;
    IF grp IS NOT NULL AND NOT coalesce(pg_has_role(who, to_regrole(grp), 'USAGE'), false) THEN
        why := concat_ws('; ', why, format('not a member of %s', grp));
    END IF;
    RETURN why;
END $$;

-- Why the caller may not do `need` on a queue, or NULL when it may (_denied_to). A session that
-- is a superuser skips the look-up; inlined where it is called.
CREATE OR REPLACE FUNCTION queue_pg._denied(queue_id integer, need text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN current_setting('is_superuser') = 'on' THEN NULL
                ELSE queue_pg._denied_to(queue_pg._caller(), queue_id, need) END
$$;

-- AccessDenied (QP011) naming the role, the queue and the privilege it lacks, and why.
CREATE OR REPLACE FUNCTION queue_pg._authorize(queue_id integer, queue text, need text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    why text := queue_pg._denied(queue_id, need);
BEGIN
    IF why IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP011',
            MESSAGE = format('permission denied: role %s needs privilege %s on queue %s',
                             quote_literal(queue_pg._caller()), need, coalesce(quote_literal(left(queue, 100)), 'NULL')),
            DETAIL = why,
            HINT = CASE WHEN need = 'create' THEN 'GRANT queue_pg_admin TO the role'
                        ELSE format('a manager of the queue runs queue_pg.grant(%s, %s, %s)',
                                    quote_literal(left(queue, 100)), quote_literal(queue_pg._caller()),
                                    quote_literal(need)) END;
    END IF;
END $$;

-- The body of grant and revoke: checks the privilege, the role, the queue and that the caller
-- manages it; true when something changed.
CREATE OR REPLACE FUNCTION queue_pg._grant(queue text, role text, privilege text, add boolean)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues;
    r oid;
    n integer;
BEGIN
    PERFORM queue_pg._check_choice('privilege', privilege, ARRAY['send', 'receive', 'manage']);
    SELECT a.oid INTO r FROM pg_catalog.pg_roles a WHERE a.rolname = _grant.role;
    IF r IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('role = %s is invalid: allowed the name of an existing role (see pg_roles)',
                             coalesce(quote_literal(left(role, 100)), 'NULL'));
    END IF;
    q := queue_pg._queue(queue, 'manage');
    IF add THEN
        INSERT INTO queue_pg.grants AS g (queue_id, role, privilege)
        VALUES (q.id, r, _grant.privilege)
        ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM queue_pg.grants g
        WHERE g.queue_id = q.id AND g.role = r AND g.privilege = _grant.privilege;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n > 0;
END $$;

-- Lets `role` (and every role that has its privileges) send to, receive from or manage `queue`.
-- True when granted now, false when it already was. Needs manage on the queue (or admin).
CREATE OR REPLACE FUNCTION queue_pg.grant(queue text, role text, privilege text) RETURNS boolean
LANGUAGE plpgsql AS $$ BEGIN RETURN queue_pg._grant(queue, role, privilege, true); END $$;

-- Takes a grant back; true when it existed. Grants of other roles the role belongs to stay.
CREATE OR REPLACE FUNCTION queue_pg.revoke(queue text, role text, privilege text) RETURNS boolean
LANGUAGE plpgsql AS $$ BEGIN RETURN queue_pg._grant(queue, role, privilege, false); END $$;

-- The grants of a queue (NULL: of every queue) the caller manages, by queue, role, privilege.
CREATE OR REPLACE FUNCTION queue_pg.list_grants(queue text DEFAULT NULL)
RETURNS SETOF queue_pg.grant_info
LANGUAGE plpgsql STABLE AS $$
DECLARE
    only_id integer;
BEGIN
    IF queue IS NOT NULL THEN
        only_id := (queue_pg._queue(queue, 'manage')).id;
    END IF;
    RETURN QUERY
    SELECT q.name, coalesce(a.rolname::text, g.role::text), g.privilege, g.granted_at
    FROM queue_pg.grants g
    JOIN queue_pg.queues q ON q.id = g.queue_id
    LEFT JOIN pg_catalog.pg_roles a ON a.oid = g.role
    WHERE (only_id IS NULL OR g.queue_id = only_id)
      AND (only_id IS NOT NULL OR queue_pg._denied(q.id, 'manage') IS NULL)
    ORDER BY 1, 2, 3;
END $$;

-- Monitoring: counts only, never bodies; a filter on it cannot reach into the tables below.
ALTER VIEW queue_pg.queue_stats SET (security_barrier = true);
ALTER VIEW queue_pg.in_flight_messages SET (security_barrier = true);
ALTER VIEW queue_pg.dead_letters SET (security_barrier = true);
ALTER VIEW queue_pg.processing_times SET (security_barrier = true);
ALTER VIEW queue_pg.timeout_advice SET (security_barrier = true);
ALTER VIEW queue_pg.tuning_log SET (security_barrier = true);
ALTER VIEW queue_pg.schedules SET (security_barrier = true);

-- Every function, on every apply. Entry points (what other roles may call, and what a view calls
-- as its reader) run as the owner (SECURITY DEFINER) with search_path pinned to pg_catalog, so a
-- function or operator planted earlier on the caller's search_path is never what ours call; the
-- internal helpers run only inside them (no one else may EXECUTE them), under that pinned path,
-- and stay inlinable. EXECUTE: nobody by default; each group role gets the entry points its
-- members need (queue_pg_admin all of them). A new entry point missing from the list below is
-- the admin's only, until it is added.
DO $$
DECLARE
    f record;
    groups text[] := ARRAY['queue_pg_admin', 'queue_pg_producer', 'queue_pg_consumer'];
    have text[];
    g text;
BEGIN
    SELECT coalesce(array_agg(rolname::text), '{}') INTO have
    FROM pg_catalog.pg_roles WHERE rolname = ANY (groups);
    FOR f IN
        SELECT p.oid::regprocedure AS sig, p.proname::text AS name,
               (p.proname !~ '^_' OR p.proname IN ('_receive', '_stat_counter', '_sees', '_queue_stats',
                                                    '_in_flight_messages', '_dead_letters', '_tuning_log',
                                                    '_schedules', '_stuck_jobs')) AS entry,
               CASE
                   WHEN p.proname IN ('send', 'send_batch', 'stage', 'send_staged', 'azure_put', 'send_chord') THEN ARRAY['queue_pg_producer']
                   WHEN p.proname IN ('receive', '_receive', 'delete_message', 'delete_batch',
                                      'change_visibility', 'update_message', 'dead_letter', 'peek',
                                      'azure_update', 'complete_task', 'fail_task', 'complete_step',
                                      'message_groups', 'message_details',
                                      -- consumers that can be seen to die (34_consumers.sql)
                                      'register_consumer', 'reap_consumers', 'consumer_heartbeat')
                       THEN ARRAY['queue_pg_consumer']
                   -- per-queue 'manage' grants decide; any member of a group may try
                   WHEN p.proname IN ('alter_queue', 'drop_queue', 'purge', 'redrive', 'grant',
                                      'revoke', 'list_grants', 'list_queues', 'get_queue', 'stats',
                                      'channel', 'sweep', 'now', '_stat_counter', '_sees', '_queue_stats',
                                      '_in_flight_messages', '_dead_letters', '_tuning_log',
                                      'processing_times', 'timeout_advice', 'tune', 'alter_tuning',
                                      'add_route', 'drop_route', 'list_routes', 'split',
                                      'queue_overview', 'replica_status',
                                      -- periodic tasks (52_periodic.sql)
                                      'set_schedule', 'drop_schedule', 'fire_schedules', '_schedules',
                                      'set_rate_limit',
                                      -- a task's max_running (53_task_limits.sql)
                                      'limit_task',
                                      -- redrive tasks (57_redrive.sql)
                                      'start_redrive', 'list_redrives', 'cancel_redrive', 'redrive_step',
                                      'redrive_message', 'cancel_message',
                                      'set_redrive_allow', 'redrive_allow',
                                      -- task results: send or receive decides (54_task_results.sql)
                                      'task_result', 'task_result_channel',
                                      -- the dashboard (59_dashboard.sql)
                                      'queue_history', 'queue_throughput', 'workers',
                                      -- hung work (56_budget.sql)
                                      'hung_limits', '_stuck_jobs',
                                      -- SQS queue tags (59_sqs.sql)
                                      'sqs_tag_queue', 'sqs_untag_queue', 'sqs_queue_tags',
                                      'sqs_set_queue_attributes', 'sqs_queue_attributes',
                                      'sqs_add_permission', 'sqs_remove_permission',
                                      -- Azure queue metadata (59_azure.sql)
                                      'azure_set_metadata', 'azure_metadata', 'azure_list_queues',
                                      'azure_set_acl', 'azure_acl',
                                      -- the account's own (its key's role): 59_azure.sql
                                      'azure_service_properties', 'azure_set_service_properties')
                       THEN ARRAY['queue_pg_producer', 'queue_pg_consumer']
                   ELSE '{}'::text[]
               END AS execute_to
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'queue_pg'::regnamespace AND p.prokind = 'f'
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.sig);
        FOREACH g IN ARRAY have LOOP
            EXECUTE format('REVOKE ALL ON FUNCTION %s FROM %I', f.sig, g);
        END LOOP;
        CONTINUE WHEN NOT f.entry;
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pg_temp', f.sig);
        -- Generic plans for every statement inside: a custom plan re-plans the statement, and
        -- re-parses each inlined sql helper, on every call (measured: 0.7 of the 1.3 ms of a
        -- receive of one message). The hot paths' plans are checked in tests/test_plans.py.
        EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan', f.sig);
        FOREACH g IN ARRAY (ARRAY['queue_pg_admin'] || f.execute_to) LOOP
            IF g = ANY (have) THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f.sig, g);
            END IF;
        END LOOP;
    END LOOP;
    FOREACH g IN ARRAY have LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA queue_pg TO %I', g);
        -- the views show each reader only the queues it has a grant on (_sees), and no bodies
        EXECUTE format('GRANT SELECT ON queue_pg.queue_stats, queue_pg.in_flight_messages, queue_pg.dead_letters,'
                       ' queue_pg.processing_times, queue_pg.timeout_advice, queue_pg.tuning_log,'
                       ' queue_pg.schedules, queue_pg.stuck_jobs TO %I', g);
    END LOOP;
    IF 'queue_pg_admin' = ANY (have) THEN
        GRANT SELECT ON queue_pg.message_history TO queue_pg_admin;
    END IF;
END $$;
