-- Redrive tasks (revision 0009; SQS StartMessageMoveTask, ListMessageMoveTasks,
-- CancelMessageMoveTask): the messages of a dead-letter queue moved back a batch at a time, at
-- most `rate` a second, by whoever advances the tasks: queue_pg.redrive_step, which sweep calls
-- (the clients sweep every minute on their own), or a loop of redrive_step calls (the CLI's
-- `redrive start --follow`). State lives in queue_pg.redrive_tasks, so a task goes on after any
-- restart; each step commits what it moved, so a cancel keeps the messages moved before it.
--
-- A task moves the messages that were visible in the queue when it started (dead-lettered
-- later, or leased by a consumer of the dead-letter queue then: not its). Progress is `moved`
-- of `to_move`, the movable messages counted at the start. The rate holds from the start: at
-- any moment moved <= rate x (seconds since the start + 1).

-- A task's row as the functions return it.
CREATE OR REPLACE FUNCTION queue_pg._redrive_task(t queue_pg.redrive_tasks) RETURNS queue_pg.redrive_task
LANGUAGE sql STABLE AS $$
    SELECT ROW(t.id, (SELECT q.name FROM queue_pg.queues q WHERE q.id = t.dlq_id), t.target, t.rate,
               t.status, t.moved, t.to_move, t.started_at, t.updated_at, t.finished_at,
               t.error)::queue_pg.redrive_task
$$;

-- One step of a running task, held by the caller (FOR UPDATE): moves what the rate allows, at
-- most max_rows, and marks the task completed when nothing of it is left, or failed (with the
-- error) when the move raised; the number moved.
CREATE OR REPLACE FUNCTION queue_pg._redrive_advance(t queue_pg.redrive_tasks, max_rows bigint,
                                                     at timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    allowed bigint := CASE WHEN t.rate IS NULL THEN max_rows
                           ELSE least(max_rows, floor(t.rate * (extract(epoch FROM at - t.started_at) + 1))::bigint - t.moved) END;
    cnt bigint := 0;
    state text := 'running';
    err text;
    -- the task moves for the role that started it, whoever advances it (tasks from before
    -- revision 0016 know no starter: for the caller)
    mover name := CASE WHEN t.started_by IS NULL THEN queue_pg._caller()
                       ELSE (SELECT a.rolname FROM pg_catalog.pg_roles a WHERE a.oid = t.started_by) END;
    into_ids integer[];
BEGIN
    BEGIN
        IF t.target_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM queue_pg.queues q WHERE q.id = t.target_id) THEN
            RAISE EXCEPTION USING ERRCODE = 'QP001',
                MESSAGE = format('queue %s (to) does not exist any more', quote_literal(t.target));
        END IF;
        IF mover IS NULL OR (t.target_id IS NOT NULL AND queue_pg._denied_to(mover, t.target_id, 'send') IS NOT NULL) THEN
            RAISE EXCEPTION USING ERRCODE = 'QP011',
                MESSAGE = format('permission denied: the role that started the task (%s) may not send to %s any more',
                                 coalesce(quote_literal(mover), 'dropped'), coalesce(quote_literal(t.target), 'the source queues'));
        END IF;
        IF allowed > 0 THEN
            cnt := queue_pg._move_back(t.dlq_id, t.target_id, allowed, t.started_at, at, mover);
        END IF;
        -- done when nothing is left that it may move (messages of queues its starter may not
        -- send to stay in the dead-letter queue)
        into_ids := queue_pg._movable_to(mover);
        IF NOT EXISTS (SELECT 1 FROM queue_pg.messages m
                       WHERE m.queue_id = t.dlq_id AND m.visible_at <= t.started_at
                         AND (m.source_queue_id IS NOT NULL OR t.target_id IS NOT NULL)
                         AND (into_ids IS NULL OR coalesce(t.target_id, m.source_queue_id) = ANY (into_ids))) THEN
            state := 'completed';
        END IF;
    EXCEPTION WHEN OTHERS THEN  -- what it moved in this step is undone with the sub-block
        state := 'failed';
        err := SQLERRM;
        cnt := 0;
    END;
    UPDATE queue_pg.redrive_tasks r SET moved = r.moved + cnt, status = state, updated_at = at,
        finished_at = CASE WHEN state <> 'running' THEN at END, error = err
    WHERE r.id = t.id;
    RETURN cnt;
END $$;

-- Advances the running tasks the caller manages (their dead-letter queue), oldest first, with
-- max_rows moves in all; tasks another step holds are skipped. The number moved.
CREATE OR REPLACE FUNCTION queue_pg._redrive_steps(max_rows bigint, at timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t queue_pg.redrive_tasks;
    total bigint := 0;
BEGIN
    FOR t IN SELECT * FROM queue_pg.redrive_tasks r
             WHERE r.status = 'running' AND queue_pg._denied(r.dlq_id, 'manage') IS NULL
             ORDER BY r.id FOR UPDATE SKIP LOCKED LOOP
        EXIT WHEN total >= max_rows;
        total := total + queue_pg._redrive_advance(t, max_rows - total, at);
    END LOOP;
    RETURN total;
END $$;

-- Advances the redrive tasks now (see the top of this file); sweep does the same. Any group
-- role may call it: it moves only the tasks of queues the caller manages.
CREATE OR REPLACE FUNCTION queue_pg.redrive_step(max_rows integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM queue_pg._check('max_rows', max_rows, 1, 1000000, 'messages');
    RETURN queue_pg._redrive_steps(max_rows, queue_pg._now());
END $$;

-- Starts moving the dead-lettered messages of `dlq` back to the queue each came from (or to
-- `to`), at most `rate` a second (NULL: as fast as the steps go); the task's id. Needs manage on
-- dlq and send on `to`; the task moves only into queues the role that started it may send to,
-- whoever advances it (messages of the others stay). One running task per queue (RedriveInProgress); a queue keeps its last 100
-- tasks (older ended ones are deleted here). The first step runs here.
CREATE OR REPLACE FUNCTION queue_pg.start_redrive(dlq text, "to" text DEFAULT NULL,
                                                  rate double precision DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    d queue_pg.queues := queue_pg._queue(dlq, 'manage');
    target queue_pg.queues;
    at timestamptz := queue_pg._now();
    t queue_pg.redrive_tasks;
    running bigint;
    into_ids integer[] := queue_pg._movable_to(queue_pg._caller());
BEGIN
    IF "to" IS NOT NULL THEN  -- moving messages into a queue is sending to it
        target := queue_pg._queue("to", 'send');
        IF target.id = d.id THEN
            RAISE EXCEPTION USING ERRCODE = 'QP003',
                MESSAGE = format('to = %s is invalid: allowed another queue than dlq, or NULL (each message''s source queue)',
                                 quote_literal(target.name));
        END IF;
    END IF;
    IF rate IS NOT NULL THEN
        PERFORM queue_pg._check('rate', rate, 0.1, 100000, 'messages per second');
    END IF;
    SELECT r.id INTO running FROM queue_pg.redrive_tasks r WHERE r.dlq_id = d.id AND r.status = 'running';
    BEGIN
        IF running IS NULL THEN
            INSERT INTO queue_pg.redrive_tasks AS r (dlq_id, target_id, target, rate, to_move, started_at,
                                                     updated_at, started_by)
            SELECT d.id, target.id, target.name, rate, count(*), at, at, to_regrole(quote_ident(queue_pg._caller()))
            FROM queue_pg.messages m
            WHERE m.queue_id = d.id AND m.visible_at <= at
              AND (m.source_queue_id IS NOT NULL OR target.id IS NOT NULL)
              AND (into_ids IS NULL OR coalesce(target.id, m.source_queue_id) = ANY (into_ids))
            RETURNING r.* INTO t;
        END IF;
    EXCEPTION WHEN unique_violation THEN  -- started concurrently
        SELECT r.id INTO running FROM queue_pg.redrive_tasks r WHERE r.dlq_id = d.id AND r.status = 'running';
    END;
    IF t.id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP036',
            MESSAGE = format('queue %s has a running redrive task already (id %s): allowed one at a time; cancel it or wait for it to end',
                             quote_literal(d.name), coalesce(running::text, '?'));
    END IF;
    DELETE FROM queue_pg.redrive_tasks r
    WHERE r.dlq_id = d.id AND r.status <> 'running'
      AND r.id <= (SELECT x.id FROM queue_pg.redrive_tasks x WHERE x.dlq_id = d.id
                   ORDER BY x.id DESC OFFSET 100 LIMIT 1);
    PERFORM queue_pg._redrive_advance(t, 1000, at);
    RETURN t.id;
END $$;

-- The redrive tasks of `dlq` (NULL: of every queue the caller manages), newest first.
CREATE OR REPLACE FUNCTION queue_pg.list_redrives(dlq text DEFAULT NULL)
RETURNS SETOF queue_pg.redrive_task
LANGUAGE plpgsql STABLE AS $$
DECLARE
    only_id integer;
BEGIN
    IF dlq IS NOT NULL THEN
        only_id := (queue_pg._queue(dlq, 'manage')).id;
    END IF;
    RETURN QUERY
    SELECT (queue_pg._redrive_task(r)).* FROM queue_pg.redrive_tasks r
    WHERE (only_id IS NULL OR r.dlq_id = only_id)
      AND (only_id IS NOT NULL OR queue_pg._denied(r.dlq_id, 'manage') IS NULL)
    ORDER BY r.id DESC;
END $$;

-- Stops a running task; the messages it moved stay moved. The task as it is now (an ended task
-- is returned unchanged). Needs manage on its dead-letter queue; RedriveTaskNotFound if no task
-- has the id.
CREATE OR REPLACE FUNCTION queue_pg.cancel_redrive(task bigint) RETURNS SETOF queue_pg.redrive_task
LANGUAGE plpgsql AS $$
DECLARE
    t queue_pg.redrive_tasks;
    at timestamptz := queue_pg._now();
BEGIN
    SELECT * INTO t FROM queue_pg.redrive_tasks r WHERE r.id = task;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'QP035',
            MESSAGE = format('redrive task %s does not exist (or its queue was dropped)', coalesce(task::text, 'NULL'));
    END IF;
    PERFORM queue_pg._queue((queue_pg._redrive_task(t)).dlq, 'manage');
    UPDATE queue_pg.redrive_tasks r SET status = 'cancelled', updated_at = at, finished_at = at
    WHERE r.id = task AND r.status = 'running'
    RETURNING r.* INTO t;
    IF NOT FOUND THEN
        SELECT * INTO t FROM queue_pg.redrive_tasks r WHERE r.id = task;
    END IF;
    RETURN NEXT queue_pg._redrive_task(t);
END $$;

-- Which queues may name a queue as their dead_letter_queue (SQS's RedriveAllowPolicy): every
-- queue (allow_all, the default), none (deny_all), or up to 10 named ones (by_queue). Kept in
-- the queue's options; checked when a queue is created with, or altered to, a dead-letter queue
-- (queues linked before a change stay linked, as in SQS).
CREATE OR REPLACE FUNCTION queue_pg.set_redrive_allow(queue text, permission text,
                                                      sources text[] DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    policy jsonb;
    bad text;
BEGIN
    PERFORM queue_pg._check_choice('permission', permission, ARRAY['allow_all', 'deny_all', 'by_queue']);
    IF (permission = 'by_queue') <> (sources IS NOT NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('sources = %s is invalid with permission = %s: by_queue takes 1 to 10 queue names, the others none',
                             coalesce(left(sources::text, 200), 'NULL'), permission);
    END IF;
    IF permission = 'by_queue' THEN
        PERFORM queue_pg._check('len(sources)', coalesce(cardinality(sources), 0), 1, 10, 'queues');
        SELECT s INTO bad FROM unnest(sources) s WHERE s IS NULL OR s !~ '^[A-Za-z0-9_-]{1,80}$' LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'QP003',
                MESSAGE = format('sources = %s is invalid: %s is not a queue name (1 to 80 characters of [A-Za-z0-9_-])',
                                 left(sources::text, 200), coalesce(quote_literal(left(bad, 100)), 'NULL'));
        END IF;
        policy := jsonb_build_object('permission', permission,
                                     'sources', to_jsonb(ARRAY(SELECT DISTINCT s FROM unnest(sources) s ORDER BY s)));
    ELSIF permission = 'deny_all' THEN
        policy := jsonb_build_object('permission', permission);
    END IF;
    UPDATE queue_pg.queues x
    SET options = CASE WHEN policy IS NULL THEN x.options - 'redrive_allow'
                       ELSE x.options || jsonb_build_object('redrive_allow', policy) END
    WHERE x.id = q.id;
    RETURN coalesce(policy, jsonb_build_object('permission', 'allow_all'));
END $$;

-- A queue's redrive allow policy, {"permission": ..., "sources": [...]}; whoever may read the
-- queue's settings (get_queue) may read it.
CREATE OR REPLACE FUNCTION queue_pg.redrive_allow(queue text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce((queue_pg._queue_seen(queue)).options -> 'redrive_allow',
                    jsonb_build_object('permission', 'allow_all'))
$$;

-- QP003 when the dead-letter queue's policy does not let `source` dead-letter into it.
CREATE OR REPLACE FUNCTION queue_pg._check_redrive_allow(source text, dlq text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    policy jsonb := (SELECT x.options -> 'redrive_allow' FROM queue_pg.queues x WHERE x.name = dlq);
BEGIN
    IF policy IS NULL OR (policy ->> 'permission' = 'by_queue' AND policy -> 'sources' ? source) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'QP003',
        MESSAGE = format('dead_letter_queue = %s is not allowed for queue %s: its redrive allow policy is %s',
                         quote_literal(dlq), quote_literal(source),
                         CASE WHEN policy ->> 'permission' = 'deny_all' THEN 'deny_all'
                              ELSE format('by_queue %s', policy -> 'sources') END),
        HINT = format('a manager of %s runs queue_pg.set_redrive_allow', quote_literal(dlq));
END $$;
