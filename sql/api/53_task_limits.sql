-- Start rates per queue (revision 0007): at most per_second claims a second, over any t seconds
-- at most per_second * (t + 1). A queue with a rate has options.rate_limit set, which _claim reads
-- from the queue row it already holds: queues without one pay nothing. A concurrency limit per
-- task (max_running) is a route (add_route) of the task's messages to a queue of their own whose
-- in_flight_limit is the limit (limit_task below), so they never stand in front of other tasks'
-- messages.

-- Takes up to `want` starts from the queue's bucket; how many it got (want when the queue has no
-- bucket). The row lock orders the claims of one rate-limited queue.
CREATE OR REPLACE FUNCTION queue_pg._rate_take(queue_id integer, want integer, n timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    r queue_pg.rate_limits;
    level double precision;
    took integer;
BEGIN
    SELECT * INTO r FROM queue_pg.rate_limits b WHERE b.queue_id = _rate_take.queue_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN want;
    END IF;
    level := least(greatest(r.per_second, 1),
                   r.tokens + r.per_second * greatest(0, extract(epoch FROM n - r.at)));
    took := least(want, floor(level))::integer;
    UPDATE queue_pg.rate_limits b SET tokens = level - took, at = greatest(r.at, n)
    WHERE b.queue_id = _rate_take.queue_id;
    RETURN took;
END $$;

-- Sets the queue's start rate (starts per second, > 0 and <= 100,000), or removes it (NULL).
-- Returns the rate now in force. Needs manage on the queue.
CREATE OR REPLACE FUNCTION queue_pg.set_rate_limit(queue text, per_second double precision)
RETURNS double precision
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
BEGIN
    PERFORM 1 FROM queue_pg.queues x WHERE x.id = q.id FOR NO KEY UPDATE;
    IF per_second IS NULL THEN
        DELETE FROM queue_pg.rate_limits b WHERE b.queue_id = q.id;
        UPDATE queue_pg.queues x SET options = x.options - 'rate_limit' WHERE x.id = q.id;
        RETURN NULL;
    END IF;
    IF NOT (per_second > 0 AND per_second <= 100000) THEN  -- NaN too
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('per_second = %s is out of range: allowed more than 0 up to 100000 starts per second',
                             per_second);
    END IF;
    INSERT INTO queue_pg.rate_limits AS b (queue_id, per_second, tokens, at)
    VALUES (q.id, per_second, greatest(per_second, 1), queue_pg._now())
    ON CONFLICT (queue_id) DO UPDATE SET per_second = excluded.per_second,
        tokens = least(b.tokens, greatest(excluded.per_second, 1));
    UPDATE queue_pg.queues x SET options = x.options || jsonb_build_object('rate_limit', per_second)
    WHERE x.id = q.id;
    RETURN per_second;
END $$;

-- A task's concurrency limit, set up by the first enqueue of the task (in the
-- sender's transaction, before its message is sent) and by each worker at its start, so the limit
-- holds from the first message on: messages of type `task` sent to `queue` are routed to `target`,
-- a queue of their own (made with `queue`'s settings if missing) whose in_flight_limit is
-- max_running. A role with send on `queue` may call it once the limit is in place (a producer's
-- enqueue: false, nothing to do); setting it up or changing it needs what create_queue,
-- alter_queue and add_route need. True when something changed.
CREATE OR REPLACE FUNCTION queue_pg.limit_task(queue text, task text, target text, max_running integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'send');
    t queue_pg.queues;
BEGIN
    PERFORM queue_pg._check('max_running', max_running, 1, 10000000, 'runs');
    SELECT * INTO t FROM queue_pg.queues x WHERE x.name = limit_task.target;
    IF t.in_flight_limit = max_running AND EXISTS (
            SELECT 1 FROM queue_pg.routes r
            WHERE r.queue_id = q.id AND r.type = limit_task.task AND r.target_id = t.id) THEN
        RETURN false;
    END IF;
    q := queue_pg._queue(queue, 'manage');
    PERFORM 1 FROM queue_pg.queues x WHERE x.id = q.id FOR NO KEY UPDATE;  -- one set-up at a time
    SELECT * INTO t FROM queue_pg.queues x WHERE x.name = limit_task.target;
    IF t.id IS NULL THEN
        PERFORM queue_pg.create_queue(target, visibility_timeout => q.visibility_timeout,
            message_ttl => q.message_ttl, max_message_size => q.max_message_size,
            max_lease => q.max_lease, dead_letter_queue => q.dead_letter_queue,
            max_receive_count => q.max_receive_count, history => q.history,
            history_retention => q.history_retention, in_flight_limit => max_running);
    ELSIF t.in_flight_limit IS DISTINCT FROM max_running THEN
        PERFORM queue_pg.alter_queue(target, in_flight_limit => max_running);
    END IF;
    PERFORM queue_pg.add_route(queue, task, target);
    RETURN true;
END $$;
