-- Start rates per queue (revision 0007): at most per_second claims a second, over any t seconds
-- at most per_second * (t + 1). A queue with a rate has options.rate_limit set, which _claim reads
-- from the queue row it already holds: queues without one pay nothing. Concurrency limits per task
-- need no SQL of their own: a limited task's messages are routed (add_route) to a queue of its
-- own whose in_flight_limit is the limit (queue_pg/declare.py), so they never stand in front of
-- other tasks' messages.

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
    PERFORM 1 FROM queue_pg.queues x WHERE x.id = q.id FOR UPDATE;
    IF per_second IS NULL THEN
        DELETE FROM queue_pg.rate_limits b WHERE b.queue_id = q.id;
        UPDATE queue_pg.queues x SET options = x.options - 'rate_limit' WHERE x.id = q.id;
        RETURN NULL;
    END IF;
    IF NOT (per_second > 0 AND per_second <= 100000) THEN  -- NaN too
        PERFORM queue_pg._out_of_range('per_second', per_second, 0.001, 100000, 'starts per second');
    END IF;
    INSERT INTO queue_pg.rate_limits AS b (queue_id, per_second, tokens, at)
    VALUES (q.id, per_second, greatest(per_second, 1), queue_pg._now())
    ON CONFLICT (queue_id) DO UPDATE SET per_second = excluded.per_second,
        tokens = least(b.tokens, greatest(excluded.per_second, 1));
    UPDATE queue_pg.queues x SET options = x.options || jsonb_build_object('rate_limit', per_second)
    WHERE x.id = q.id;
    RETURN per_second;
END $$;
