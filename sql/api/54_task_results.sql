-- Task results (docs/jobs.md, "Results"): what a task declared with store_result returned, or
-- its last error, kept in queue_pg.task_results for its result_ttl. Written only by the worker
-- (a role with `receive` on the queue) in the same transaction as the delete or dead-letter of
-- the job's message, so a result exists exactly when the job finished; readable by roles with
-- `receive` or `send` on the queue (a producer reads what it enqueued); woken on a channel of
-- the queue that only they learn (a MAC, as queue_pg.channel's).

-- The result channel of a queue (the send channel's rule, another label).
CREATE OR REPLACE FUNCTION queue_pg._result_channel(queue_id integer, key bytea) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT 'queue_pg_result_' || queue_id || '_'
           || left(encode(sha256(key || textsend('result.' || queue_id::text) || key), 'hex'), 16)
$$;

-- The queue row for a reader of its results: QueueNotFound, else AccessDenied unless the caller
-- may receive from it or send to it.
CREATE OR REPLACE FUNCTION queue_pg._result_reader(queue text) RETURNS queue_pg.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue);
BEGIN
    IF current_setting('is_superuser') <> 'on' AND queue_pg._denied(q.id, 'send') IS NOT NULL THEN
        PERFORM queue_pg._authorize(q.id, q.name, 'receive');
    END IF;
    RETURN q;
END $$;

CREATE OR REPLACE FUNCTION queue_pg.task_result_channel(queue text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    key bytea;
BEGIN
    key := queue_pg._key();
    RETURN queue_pg._result_channel((queue_pg._result_reader(queue)).id, key);
END $$;

-- The result of message `id` of the queue: status SUCCESS (result: the return value), FAILURE
-- (error: why), RETRY (no result; the message failed and waits for its next attempt: read
-- from the message, nothing written for it) or PENDING (none of these: not finished, running,
-- unknown, or its result expired).
CREATE OR REPLACE FUNCTION queue_pg.task_result(queue text, id bigint)
RETURNS TABLE (status text, result jsonb, error text, done_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q queue_pg.queues := queue_pg._result_reader(queue);
BEGIN
    RETURN QUERY
    SELECT coalesce(t.status, CASE WHEN m.id IS NOT NULL THEN 'RETRY' ELSE 'PENDING' END),
           t.result, t.error, t.done_at, t.expires_at
    FROM (SELECT 1) one
    LEFT JOIN queue_pg.task_results t
      ON t.queue_id = q.id AND t.message_id = task_result.id AND t.expires_at > queue_pg._now()
    LEFT JOIN queue_pg.messages m
      ON m.id = task_result.id AND m.queue_id = q.id AND m.released AND m.receive_count > 0;
END $$;

-- Keeps a result (the caller checked the lease and settled the message) and wakes its waiters.
CREATE OR REPLACE FUNCTION queue_pg._keep_result(q queue_pg.queues, msg bigint, st text,
                                                 val jsonb, err text, ttl double precision)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    n timestamptz := queue_pg._now();
    key bytea := queue_pg._key();
BEGIN
    INSERT INTO queue_pg.task_results AS t VALUES
        (q.id, msg, st, val, err, n, n + make_interval(secs => ttl))
    ON CONFLICT (queue_id, message_id) DO UPDATE
        SET status = excluded.status, result = excluded.result, error = excluded.error,
            done_at = excluded.done_at, expires_at = excluded.expires_at;
    PERFORM pg_notify(queue_pg._result_channel(q.id, key), msg::text);
END $$;

-- A task's success: deletes the message under its receipt (queue_pg.delete_message) and keeps
-- `result` for `ttl` seconds, in one transaction; false (and nothing kept) when the message was
-- gone already. A result larger than the queue's max_message_size is refused (MessageTooLarge)
-- and nothing changes: the worker then fails the job with that reason.
CREATE OR REPLACE FUNCTION queue_pg.complete_task(queue text, receipt text, result jsonb,
                                                  ttl double precision DEFAULT 86400)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'receive');
    r record := queue_pg._parse_receipt(q.id, receipt, queue_pg._key());
    size bigint := octet_length(result::text);
BEGIN
    PERFORM queue_pg._check('ttl', ttl, 1, 31536000);
    IF size > q.max_message_size THEN
        RAISE EXCEPTION USING ERRCODE = 'QP004',
            MESSAGE = format('result is %s bytes: allowed up to max_message_size = %s bytes of queue %s',
                             size, q.max_message_size, quote_literal(q.name));
    END IF;
    IF NOT queue_pg.delete_message(queue, receipt) THEN
        RETURN false;
    END IF;
    PERFORM queue_pg._keep_result(q, r.id, 'SUCCESS', result, NULL, ttl);
    RETURN true;
END $$;

-- A task's failure for good: dead-letters the message (queue_pg.dead_letter: NoDeadLetterQueue
-- without one, and then nothing is kept either) and keeps `reason`, cut to 1 KiB, as its error.
CREATE OR REPLACE FUNCTION queue_pg.fail_task(queue text, receipt text, reason text,
                                              ttl double precision DEFAULT 86400)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'receive');
    r record := queue_pg._parse_receipt(q.id, receipt, queue_pg._key());
BEGIN
    PERFORM queue_pg._check('ttl', ttl, 1, 31536000);
    IF NOT queue_pg.dead_letter(queue, receipt, reason) THEN
        RETURN false;
    END IF;
    PERFORM queue_pg._keep_result(q, r.id, 'FAILURE', NULL, queue_pg._fit_reason(reason, 1024), ttl);
    RETURN true;
END $$;

-- Expired results of the queues in `scope` (NULL: all), a bounded batch (called by sweep).
CREATE OR REPLACE FUNCTION queue_pg._forget_results(at timestamptz, max_rows integer,
                                                    scope integer[] DEFAULT NULL) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM queue_pg.task_results x
    WHERE x.ctid = ANY (ARRAY(
        SELECT y.ctid FROM queue_pg.task_results y
        WHERE y.expires_at <= at AND (scope IS NULL OR y.queue_id = ANY (scope))
        ORDER BY y.expires_at
        LIMIT max_rows FOR UPDATE SKIP LOCKED))
$$;
