-- Monitoring: flow counters, samples, queue_stats, the messages in flight, dead letters, and the
-- figures of finished work (processing and waiting times) with the timeout advice drawn from them.
-- Every view reads through a SECURITY DEFINER function that shows a role only the queues it has
-- some grant on (_sees), and none of them shows a body.

-- Flow counters (sends, receives, deletes) are sequences, which cost no row version and no lock
-- a sender or receiver could wait on. A sequence does not roll back: a send or receive that is
-- rolled back stays counted, so the flow figures are approximate, like SQS's Approximate* ones.
-- A count of n takes a nextval per decimal digit unit (1, 10 and 100 sequences), so a batch of
-- 100 costs one nextval, not a hundred; the figure is the sum of the three.

-- Counts n events of a kind for queue_id: plpgsql simple expressions only (assignments, no
-- statement), which skip the executor. Every send and receive counts; as a statement
-- (`PERFORM nextval(...) FROM ...`) the count cost 5-10 µs to set up and run, here 1-3 µs.
CREATE OR REPLACE FUNCTION queue_pg._count_flow(kind text, queue_id integer, n bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
-- v is never read: it takes nextval's value so the call is an assignment, not a statement
-- @plpgsql_check_options: extra_warnings = false
DECLARE
    seq regclass;
    v bigint;
BEGIN
    IF n % 10 > 0 THEN
        seq := queue_pg._sequence(kind, queue_id);
        FOR i IN 1..n % 10 LOOP
            v := nextval(seq);
        END LOOP;
    END IF;
    IF n / 10 % 10 > 0 THEN
        seq := queue_pg._sequence(kind || '_x10', queue_id);
        FOR i IN 1..n / 10 % 10 LOOP
            v := nextval(seq);
        END LOOP;
    END IF;
    IF n >= 100 THEN
        seq := queue_pg._sequence(kind || '_x100', queue_id);
        FOR i IN 1..n / 100 LOOP
            v := nextval(seq);
        END LOOP;
    END IF;
    RETURN n;
END $$;

-- The value of a flow counter (see _count_flow): NULL-safe for a queue whose sequences are gone.
CREATE OR REPLACE FUNCTION queue_pg._flow(kind text, queue_id integer) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT sum(coalesce(pg_sequence_last_value(to_regclass(format('queue_pg.%s%s_%s', kind, u.suffix, queue_id))), 0))::bigint
    FROM unnest(ARRAY['', '_x10', '_x100']) u(suffix)
$$;

-- Whether the caller may see the figures of a queue: it has some grant on it (or manages all).
-- An entry point: the views call it as their reader.
CREATE OR REPLACE FUNCTION queue_pg._sees(queue_id integer) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN current_setting('is_superuser') = 'on'
        OR queue_pg._denied(queue_id, 'manage') IS NULL
        OR EXISTS (SELECT 1 FROM queue_pg.grants g
                   WHERE g.queue_id = _sees.queue_id AND pg_has_role(queue_pg._caller(), g.role, 'USAGE'));
END $$;

-- Up to how many messages queue_stats counts a queue's states on every read; past it, the
-- figure is the latest sample's (approximate = true): reading stays O(queues), not O(messages).
CREATE OR REPLACE FUNCTION queue_pg._exact_up_to() RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 1000 $$;

-- A sample of the counters and exact counts of each queue in `scope` (NULL: every queue; a
-- limited role's sweep: the queues it may read) that has none from the last 15 seconds (run by
-- sweep; one pass over those queues' messages, no lock beyond a plain read and their rows'
-- below). Samples older than 2 hours go.
DROP FUNCTION IF EXISTS queue_pg._sample(timestamptz);
CREATE OR REPLACE FUNCTION queue_pg._sample(at timestamptz, scope integer[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    live integer[];
BEGIN
    -- the queues' rows before their counters and samples (the lock order, see _queue_sequences):
    -- a queue being dropped (or altered, for this one sample) is skipped. The rows are held to
    -- the end of the sweep's transaction: a role's only, of the queues it may read.
    live := ARRAY(SELECT q.id FROM queue_pg.queues q
                  WHERE (scope IS NULL OR q.id = ANY (scope))
                    AND NOT EXISTS (SELECT 1 FROM queue_pg.queue_samples s
                                    WHERE s.queue_id = q.id AND s.at > _sample.at - interval '15 seconds'
                                      AND s.at <= _sample.at)
                  ORDER BY q.id FOR SHARE SKIP LOCKED);
    IF cardinality(live) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO queue_pg.queue_samples AS s
    SELECT q.id, at, queue_pg._flow('sent', q.id), queue_pg._flow('received', q.id),
           queue_pg._flow('deleted', q.id),
           coalesce((SELECT c.lease_expiries FROM queue_pg.queue_counters c WHERE c.queue_id = q.id), 0),
           coalesce(pg_sequence_last_value(to_regclass(format('queue_pg.stale_receipts_%s', q.id))), 0),
           coalesce(m.visible, 0), coalesce(m.in_flight, 0), coalesce(m.delayed, 0), coalesce(d.n, 0)
    FROM queue_pg.queues q
    LEFT JOIN (
        SELECT m.queue_id,
               count(*) FILTER (WHERE m.visible_at <= at) AS visible,
               count(*) FILTER (WHERE m.visible_at > at AND m.last_received_at IS NOT NULL) AS in_flight,
               count(*) FILTER (WHERE m.visible_at > at AND m.last_received_at IS NULL) AS delayed
        FROM queue_pg.messages m
        WHERE m.queue_id = ANY (live) AND (m.expires_at IS NULL OR m.expires_at > at)
        GROUP BY m.queue_id
    ) m ON m.queue_id = q.id
    LEFT JOIN (
        SELECT m.source_queue_id, count(*) AS n FROM queue_pg.messages m
        WHERE m.source_queue_id = ANY (live) GROUP BY m.source_queue_id
    ) d ON d.source_queue_id = q.id
    WHERE q.id = ANY (live)
    ON CONFLICT DO NOTHING;
    -- rows another sweep is deleting are skipped (its transaction may stay open): none waits
    DELETE FROM queue_pg.queue_samples s
    WHERE s.ctid = ANY (ARRAY(SELECT x.ctid FROM queue_pg.queue_samples x
                              WHERE x.at < _sample.at - interval '2 hours' AND x.queue_id = ANY (live)
                              FOR UPDATE SKIP LOCKED));
END $$;

-- queue_stats's reader (estimates past the cap: the function below).
CREATE OR REPLACE FUNCTION queue_pg._queue_stats(only_id integer DEFAULT NULL)
RETURNS TABLE (
    queue text, visible bigint, in_flight bigint, delayed bigint, dead_lettered bigint,
    oldest_visible_age double precision, stale_receipts bigint, lease_expiries bigint,
    sent bigint, received bigint, deleted bigint,
    sent_1m bigint, received_1m bigint, deleted_1m bigint, lease_expiries_1m bigint, stale_receipts_1m bigint,
    sent_1h bigint, received_1h bigint, deleted_1h bigint, lease_expiries_1h bigint, stale_receipts_1h bigint,
    approximate boolean, sampled_at timestamptz
)
LANGUAGE plpgsql VOLATILE AS $$  -- VOLATILE: the function below locks rows
BEGIN
    RETURN QUERY SELECT * FROM queue_pg._queue_stats(only_id, false);
END $$;

-- One row per queue the reader may see. The first eight columns are exact up to 1,000
-- messages per state (see approximate); sent, received and deleted are flow counters that a
-- rolled-back operation does not undo; *_1m and *_1h are the flows over the last minute and
-- hour, measured from the samples that sweep takes (NULL until a sample that old exists).
CREATE OR REPLACE VIEW queue_pg.queue_stats AS SELECT * FROM queue_pg._queue_stats();

-- The rows of queue_stats (of one queue: only_id). Counts up to _exact_up_to() are exact and
-- live. Past it (approximate = true) a count is an estimate that costs no scan: the newest
-- sample's figures moved on by the flow counters since (visible: messages then + sent - deleted
-- since, less those in flight and delayed; in flight: then + received - lapsed - deleted since),
-- never below the part counted live. A message that expired, was dead-lettered, moved or purged
-- since the sample stays in the estimate until the next sample (sweep, at most every 15 s);
-- without any sample the queue's creation is the base. exact => true counts everything (a scan
-- of the queue's index range: O(messages)). Flows over the last minute and hour are the counters
-- now minus the newest sample at least that old (NULL until such a sample exists). A queue whose
-- row is busy at that moment (an alter or a drop in progress) has its flows from its newest
-- sample, approximate = true.
CREATE OR REPLACE FUNCTION queue_pg._queue_stats(only_id integer, exact boolean)
RETURNS SETOF queue_pg.queue_stats
LANGUAGE plpgsql VOLATILE AS $$  -- VOLATILE: it locks rows
DECLARE
    t_at timestamptz := queue_pg._now();
    cap bigint := CASE WHEN exact THEN NULL ELSE queue_pg._exact_up_to() END;  -- NULL: no limit
    live integer[];  -- NULL: every queue (a read-only transaction takes no row lock)
BEGIN
  -- in a subtransaction rolled back at the end (QP901, caught below): the rows are returned and
  -- the row locks taken to read them go, so a reader that leaves its transaction open holds no
  -- row an alter_queue waits for (a sequence's lock stays to the end of the transaction, as
  -- PostgreSQL keeps it: drop_queue waits for such a reader, which never waits for the drop)
  BEGIN
    -- each queue's row before its counters (FOR SHARE SKIP LOCKED): a queue whose row is
    -- busy (being dropped, or altered just now) is reported from its newest sample
    -- (approximate) and its counters are not read, so they are never read while or after they
    -- are dropped. Not FOR KEY SHARE: that mode ignores SKIP LOCKED on a row version newer than
    -- the statement's snapshot and waits for its locker, so a reader holding rows a drop needs
    -- would wait for the drop while the drop waits for it.
    IF current_setting('transaction_read_only') <> 'on' THEN
        live := ARRAY(SELECT q.id FROM queue_pg.queues q
                      WHERE (only_id IS NULL OR q.id = only_id) AND queue_pg._sees(q.id)
                      ORDER BY q.id FOR SHARE SKIP LOCKED);
    END IF;
    RETURN QUERY
    WITH qs AS MATERIALIZED (
        SELECT q.id, q.name, (live IS NULL OR q.id = ANY (live)) AS held FROM queue_pg.queues q
        WHERE (only_id IS NULL OR q.id = only_id) AND queue_pg._sees(q.id)
    ), c AS MATERIALIZED (
        SELECT qs.id, qs.name, qs.held,
               CASE WHEN qs.held THEN queue_pg._flow('sent', qs.id) ELSE coalesce(b.sent, 0) END AS sent,
               CASE WHEN qs.held THEN queue_pg._flow('received', qs.id) ELSE coalesce(b.received, 0) END AS received,
               CASE WHEN qs.held THEN queue_pg._flow('deleted', qs.id) ELSE coalesce(b.deleted, 0) END AS deleted,
               coalesce((SELECT k.lease_expiries FROM queue_pg.queue_counters k WHERE k.queue_id = qs.id), 0) AS lease_expiries,
               CASE WHEN qs.held
                    THEN coalesce(pg_sequence_last_value(to_regclass(format('queue_pg.stale_receipts_%s', qs.id))), 0)
                    ELSE coalesce(b.stale_receipts, 0) END AS stale_receipts
        FROM qs
        LEFT JOIN LATERAL (
            SELECT * FROM queue_pg.queue_samples s WHERE NOT qs.held AND s.queue_id = qs.id AND s.at <= t_at
            ORDER BY s.at DESC LIMIT 1
        ) b ON true
    )
    SELECT c.name,
           CASE WHEN exact OR v.n <= cap THEN v.n
                ELSE greatest(v.n, e.total - e.in_flight - e.delayed) END,
           CASE WHEN exact OR f.n <= cap THEN f.in_flight ELSE e.in_flight END,
           CASE WHEN exact OR f.n <= cap THEN f.delayed ELSE e.delayed END,
           CASE WHEN exact OR dl.n <= cap THEN dl.n ELSE greatest(s.dead_lettered, dl.n) END,
           extract(epoch FROM t_at - v.oldest)::float8,
           c.stale_receipts, c.lease_expiries, c.sent, c.received, c.deleted,
           c.sent - m1.sent, c.received - m1.received, c.deleted - m1.deleted,
           c.lease_expiries - m1.lease_expiries, c.stale_receipts - m1.stale_receipts,
           c.sent - h1.sent, c.received - h1.received, c.deleted - h1.deleted,
           c.lease_expiries - h1.lease_expiries, c.stale_receipts - h1.stale_receipts,
           NOT c.held OR (NOT exact AND (v.n > cap OR f.n > cap OR dl.n > cap)), s.at
    FROM c
    -- Each count walks the claim index in order (ORDER BY) and stops at the cap; unordered,
    -- the planner picks a bitmap scan (the whole range first) or a sequential one.
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(x.enqueued_at) AS oldest FROM (
            SELECT m.enqueued_at FROM queue_pg.messages m
            WHERE m.queue_id = c.id AND m.visible_at <= t_at AND (m.expires_at IS NULL OR m.expires_at > t_at)
            ORDER BY m.visible_at LIMIT cap + 1) x
    ) v
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, count(*) FILTER (WHERE x.last_received_at IS NOT NULL) AS in_flight,
               count(*) FILTER (WHERE x.last_received_at IS NULL) AS delayed FROM (
            SELECT m.last_received_at FROM queue_pg.messages m
            WHERE m.queue_id = c.id AND m.visible_at > t_at AND (m.expires_at IS NULL OR m.expires_at > t_at)
            ORDER BY m.visible_at LIMIT cap + 1) x
    ) f
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM (
            SELECT 1 FROM queue_pg.messages m WHERE m.source_queue_id = c.id LIMIT cap + 1) x
    ) dl
    LEFT JOIN LATERAL (
        SELECT * FROM queue_pg.queue_samples s WHERE s.queue_id = c.id AND s.at <= t_at
        ORDER BY s.at DESC LIMIT 1
    ) s ON true
    -- the estimates (used past the cap only): in flight and delayed first, then visible from them
    CROSS JOIN LATERAL (
        SELECT coalesce(s.visible + s.in_flight + s.delayed, 0)
                   + c.sent - coalesce(s.sent, 0) - (c.deleted - coalesce(s.deleted, 0)) AS total,
               greatest(f.in_flight, coalesce(s.in_flight, 0) + c.received - coalesce(s.received, 0)
                   - (c.lease_expiries - coalesce(s.lease_expiries, 0))
                   - (c.deleted - coalesce(s.deleted, 0))) AS in_flight,
               greatest(f.delayed, coalesce(s.delayed, 0)) AS delayed
    ) e
    LEFT JOIN LATERAL (
        SELECT * FROM queue_pg.queue_samples s WHERE s.queue_id = c.id AND s.at <= t_at - interval '1 minute'
        ORDER BY s.at DESC LIMIT 1
    ) m1 ON true
    LEFT JOIN LATERAL (
        SELECT * FROM queue_pg.queue_samples s WHERE s.queue_id = c.id AND s.at <= t_at - interval '1 hour'
        ORDER BY s.at DESC LIMIT 1
    ) h1 ON true
    ORDER BY c.name;
    RAISE EXCEPTION USING ERRCODE = 'QP901', MESSAGE = 'queue_stats: the locks of its read let go';
  EXCEPTION WHEN SQLSTATE 'QP901' THEN
    NULL;
  END;
END $$;


-- An older view read its counters through this; the view above reads them itself.
DROP FUNCTION IF EXISTS queue_pg._counted(text, integer);

-- The queue row by name for a caller who asks to read its settings or figures: QueueNotFound,
-- or AccessDenied when the caller has no grant on it (_sees). Asked for by name, "no row" would
-- read as a broken install; the name alone is no secret (a send to it says the same).
CREATE OR REPLACE FUNCTION queue_pg._queue_seen(name text) RETURNS queue_pg.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(name);
BEGIN
    IF NOT queue_pg._sees(q.id) THEN
        RAISE EXCEPTION USING ERRCODE = 'QP011',
            MESSAGE = format('permission denied: role %s needs a grant on queue %s to read its figures',
                             quote_literal(queue_pg._caller()), quote_literal(left(q.name, 100))),
            HINT = format('a manager of the queue runs queue_pg.grant(%s, %s, ''send'' or ''receive'')',
                          quote_literal(left(q.name, 100)), quote_literal(queue_pg._caller()));
    END IF;
    RETURN q;
END $$;

-- One queue's row of queue_stats (see _queue_seen); exact => true counts every message.
CREATE OR REPLACE FUNCTION queue_pg.stats(queue text, exact boolean DEFAULT false)
RETURNS SETOF queue_pg.queue_stats
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM queue_pg._queue_stats((queue_pg._queue_seen(queue)).id, coalesce(exact, false));
END $$;

-- The messages now leased: no bodies. A message released with a backoff (a planned retry) is not
-- leased any more: its receipt is spent, and it holds no slot of in_flight_limit.
CREATE OR REPLACE FUNCTION queue_pg._in_flight_messages()
RETURNS TABLE (queue text, id bigint, type text, receive_count integer, leased_at timestamptz,
               visible_until timestamptz, lease_expiries integer, enqueued_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    at timestamptz := queue_pg._now();
BEGIN
    RETURN QUERY
    SELECT q.name, m.id, left(m.attributes ->> 'type', 100), m.receive_count, m.last_received_at,
           m.visible_at, m.lease_expiries, m.enqueued_at
    FROM queue_pg.queues q
    JOIN queue_pg.messages m ON m.queue_id = q.id AND m.visible_at > at
    WHERE queue_pg._sees(q.id) AND m.last_received_at IS NOT NULL AND NOT m.released
      AND (m.expires_at IS NULL OR m.expires_at > at)
    ORDER BY q.name, m.visible_at;
END $$;

CREATE OR REPLACE VIEW queue_pg.in_flight_messages AS SELECT * FROM queue_pg._in_flight_messages();

-- Each message of each dead-letter queue, with where it came from and why it died (the reason
-- given to dead_letter, and the worker's last error record): no bodies.
CREATE OR REPLACE FUNCTION queue_pg._dead_letters()
RETURNS TABLE (dead_letter_queue text, id bigint, source_queue text, type text, receive_count integer,
               lease_expiries integer, reason text, last_error text, enqueued_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT d.name, m.id, s.name, left(m.attributes ->> 'type', 100), m.receive_count, m.lease_expiries,
           m.attributes ->> 'dead_letter_reason',
           nullif(concat_ws(': ', m.attributes -> 'error' ->> 'type', m.attributes -> 'error' ->> 'message'), ''),
           m.enqueued_at
    FROM queue_pg.queues d
    JOIN queue_pg.messages m ON m.queue_id = d.id AND m.source_queue_id IS NOT NULL
    LEFT JOIN queue_pg.queues s ON s.id = m.source_queue_id
    WHERE queue_pg._sees(d.id)
    ORDER BY d.name, m.id;
END $$;

CREATE OR REPLACE VIEW queue_pg.dead_letters AS SELECT * FROM queue_pg._dead_letters();

-- A window [since, until): both given, since before until.
CREATE OR REPLACE FUNCTION queue_pg._check_window(since timestamptz, until timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF since IS NULL OR until IS NULL OR since >= until OR since = '-infinity' OR until = 'infinity' THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('window since = %s, until = %s is invalid: allowed two finite timestamps, since before until',
                             coalesce(since::text, 'NULL'), coalesce(until::text, 'NULL'));
    END IF;
END $$;

-- What one history row says about the work: processing time (final receive to delete; NULL
-- unless deleted after a receive) and waiting time (send to first receive; NULL if never
-- received). The one definition, read by the exact figures and by the rollups (57_rollups.sql) alike.
CREATE OR REPLACE FUNCTION queue_pg._work_time(outcome text, last_received_at timestamptz,
                                               finished_at timestamptz) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN outcome = 'deleted' AND last_received_at IS NOT NULL
                THEN extract(epoch FROM finished_at - last_received_at)::float8 END
$$;

CREATE OR REPLACE FUNCTION queue_pg._wait_time(first_received_at timestamptz, enqueued_at timestamptz)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT extract(epoch FROM first_received_at - enqueued_at)::float8
$$;

-- The figures of the history rows finished in [since, until), per queue (scope 'queue', type
-- NULL) and per queue and type (scope 'type'; a NULL type is a group of its own). The whole
-- minutes of the window that sweep has rolled up (57_rollups.sql) are read from the rollups,
-- with percentiles within 1% (_rolled_figures); a window with none is read row by row, exactly
-- (_history_figures_exact). The definition is the one in docs/timeouts.md ("The advice, exactly").
CREATE OR REPLACE FUNCTION queue_pg._history_figures(since timestamptz, until timestamptz, only_id integer)
RETURNS TABLE (queue_id integer, queue text, scope text, type text, messages bigint,
               samples bigint, p50 double precision, p95 double precision, p99 double precision, max double precision,
               wait_samples bigint, wait_p50 double precision, wait_p95 double precision,
               wait_p99 double precision, wait_max double precision,
               expiry_rate double precision, dead_letter_rate double precision, redeliveries bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    a timestamptz;  -- [a, b): the window's minutes rolled up; [ha, hb): its hours rolled up
    b timestamptz;
    ha timestamptz;
    hb timestamptz;
BEGIN
    SELECT greatest(queue_pg._ceil_to(since, 60), s.lo), least(queue_pg._floor_to(until, 60), s.hi),
           least(queue_pg._floor_to(until, 3600), s.hours_hi)
    INTO a, b, hb
    FROM queue_pg.history_rollup_state s WHERE s.hi IS NOT NULL;
    IF a < b THEN
        ha := queue_pg._ceil_to(a, 3600);
        IF NOT ha < hb THEN
            ha := b;
            hb := b;
        END IF;
        -- planned for these bounds (a generic plan of the inlined body may scan every rollup)
        RETURN QUERY EXECUTE 'SELECT * FROM queue_pg._rolled_figures($1, $2, $3, $4, $5, $6, $7)'
            USING since, until, only_id, a, b, ha, hb;
    ELSE
        RETURN QUERY SELECT * FROM queue_pg._history_figures_exact(since, until, only_id);
    END IF;
END $$;

-- The figures of _history_figures from every history row of the window: exact percentiles.
-- Reads each queue's rows through the index (queue_id, finished_at) in the day partitions of
-- the window: the cost is the window's rows, whatever the history's size. A row counts as
-- `weight` messages (a sampled queue-type, revision 0022): each percentile is percentile_cont's
-- over the rows repeated `weight` times (the value at rank p x (total - 1), interpolated between
-- the ranks around it), so with every weight 1 it is percentile_cont itself.
CREATE OR REPLACE FUNCTION queue_pg._history_figures_exact(since timestamptz, until timestamptz, only_id integer)
RETURNS TABLE (queue_id integer, queue text, scope text, type text, messages bigint,
               samples bigint, p50 double precision, p95 double precision, p99 double precision, max double precision,
               wait_samples bigint, wait_p50 double precision, wait_p95 double precision,
               wait_p99 double precision, wait_max double precision,
               expiry_rate double precision, dead_letter_rate double precision, redeliveries bigint)
LANGUAGE sql STABLE AS $$
    WITH x AS MATERIALIZED (  -- each row twice: in its queue's group (whole) and its type's
        SELECT q.id, q.name, g.whole, CASE WHEN g.whole THEN NULL ELSE h.type END AS type, h.outcome,
               h.receive_count, h.lease_expiries, h.weight AS w,
               queue_pg._work_time(h.outcome, h.last_received_at, h.finished_at) AS work,
               queue_pg._wait_time(h.first_received_at, h.enqueued_at) AS wait
        FROM queue_pg.queues q
        JOIN queue_pg.message_history h
          ON h.queue_id = q.id AND h.finished_at >= since AND h.finished_at < until
        CROSS JOIN (VALUES (true), (false)) g(whole)
        -- only_id NULL: the queues the caller may see, chosen before any history is read
        WHERE CASE WHEN only_id IS NULL THEN queue_pg._sees(q.id) ELSE q.id = only_id END
    ), ranked AS (  -- each time's cumulative weight in its group, for each kind
        SELECT x.id, x.whole, x.type, k.kind, k.t,
               sum(x.w) OVER (PARTITION BY x.id, x.whole, x.type, k.kind ORDER BY k.t
                              ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS upto,
               sum(x.w) OVER (PARTITION BY x.id, x.whole, x.type, k.kind) AS total
        FROM x CROSS JOIN LATERAL (VALUES ('work', x.work), ('wait', x.wait)) k(kind, t)
        WHERE k.t IS NOT NULL
    ), pct AS (  -- per group and kind, the values at the ranks around p x (total - 1)
        SELECT r.id, r.whole, r.type, r.kind, r.total,
               min(r.t) FILTER (WHERE r.upto > floor(0.5 * (r.total - 1))) AS lo50,
               min(r.t) FILTER (WHERE r.upto > least(floor(0.5 * (r.total - 1)) + 1, r.total - 1)) AS hi50,
               min(r.t) FILTER (WHERE r.upto > floor(0.95 * (r.total - 1))) AS lo95,
               min(r.t) FILTER (WHERE r.upto > least(floor(0.95 * (r.total - 1)) + 1, r.total - 1)) AS hi95,
               min(r.t) FILTER (WHERE r.upto > floor(0.99 * (r.total - 1))) AS lo99,
               min(r.t) FILTER (WHERE r.upto > least(floor(0.99 * (r.total - 1)) + 1, r.total - 1)) AS hi99,
               max(r.t) AS hi
        FROM ranked r GROUP BY r.id, r.whole, r.type, r.kind, r.total
    ), sums AS (
        SELECT x.id, x.name, x.whole, x.type, sum(x.w)::bigint AS messages,
               sum(x.lease_expiries * x.w)::float8 / nullif(sum(x.receive_count * x.w), 0) AS expiry_rate,
               coalesce(sum(x.w) FILTER (WHERE x.outcome = 'dead_lettered'), 0)::float8 / sum(x.w) AS dead_letter_rate,
               sum(greatest(x.receive_count - 1, 0) * x.w)::bigint AS redeliveries
        FROM x GROUP BY x.id, x.name, x.whole, x.type
    )
    SELECT s.id, s.name, CASE WHEN s.whole THEN 'queue' ELSE 'type' END, s.type, s.messages,
           coalesce(w.total, 0)::bigint,
           w.lo50 + (0.5 * (w.total - 1) - floor(0.5 * (w.total - 1))) * (w.hi50 - w.lo50),
           w.lo95 + (0.95 * (w.total - 1) - floor(0.95 * (w.total - 1))) * (w.hi95 - w.lo95),
           w.lo99 + (0.99 * (w.total - 1) - floor(0.99 * (w.total - 1))) * (w.hi99 - w.lo99),
           w.hi, coalesce(t.total, 0)::bigint,
           t.lo50 + (0.5 * (t.total - 1) - floor(0.5 * (t.total - 1))) * (t.hi50 - t.lo50),
           t.lo95 + (0.95 * (t.total - 1) - floor(0.95 * (t.total - 1))) * (t.hi95 - t.lo95),
           t.lo99 + (0.99 * (t.total - 1) - floor(0.99 * (t.total - 1))) * (t.hi99 - t.lo99),
           t.hi, s.expiry_rate, s.dead_letter_rate, s.redeliveries
    FROM sums s
    LEFT JOIN pct w ON (w.id, w.whole, w.kind) = (s.id, s.whole, 'work') AND w.type IS NOT DISTINCT FROM s.type
    LEFT JOIN pct t ON (t.id, t.whole, t.kind) = (s.id, s.whole, 'wait') AND t.type IS NOT DISTINCT FROM s.type
$$;

CREATE OR REPLACE FUNCTION queue_pg.processing_times(since timestamptz, until timestamptz)
RETURNS TABLE (queue text, scope text, type text, messages bigint,
               samples bigint, p50 double precision, p95 double precision, p99 double precision, max double precision,
               wait_samples bigint, wait_p50 double precision, wait_p95 double precision,
               wait_p99 double precision, wait_max double precision)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM queue_pg._check_window(since, until);
    RETURN QUERY
    SELECT f.queue, f.scope, f.type, f.messages, f.samples, f.p50, f.p95, f.p99, f.max,
           f.wait_samples, f.wait_p50, f.wait_p95, f.wait_p99, f.wait_max
    FROM queue_pg._history_figures(since, until, NULL) f
    ORDER BY f.queue, f.scope, f.type NULLS FIRST;
END $$;

-- The advice of one queue's figures (see docs/timeouts.md): recommended timeout from 6 x p99
-- within [1, max_lease], or twice the current one when leases lapse (> 1%) although the current
-- one already covers 6 x p99 of the runs that completed.
CREATE OR REPLACE FUNCTION queue_pg._advise(p99 double precision, samples bigint, expiry_rate double precision,
                                            current_timeout double precision, max_lease double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN samples = 0 OR p99 IS NULL THEN NULL
        WHEN expiry_rate > 0.01 AND current_timeout >= least(max_lease, greatest(1, ceil(6 * p99)))
            THEN least(max_lease, ceil(2 * current_timeout))
        ELSE least(max_lease, greatest(1, ceil(6 * p99)))
    END
$$;

CREATE OR REPLACE FUNCTION queue_pg._advice(since timestamptz, until timestamptz, only_id integer)
RETURNS TABLE (queue_id integer, queue text, scope text, type text, current_timeout double precision,
               recommended_timeout double precision, heartbeat_interval double precision,
               samples bigint, p50 double precision, p95 double precision, p99 double precision,
               max double precision, expiry_rate double precision, dead_letter_rate double precision,
               redeliveries bigint, stale_receipts bigint, confidence text,
               split_advised boolean, p99_spread double precision, max_lease double precision)
LANGUAGE sql STABLE AS $$
    WITH f AS MATERIALIZED (SELECT * FROM queue_pg._history_figures(since, until, only_id)),
    spread AS (
        SELECT f.queue_id, count(*) AS n, max(f.p99) AS hi, min(f.p99) AS lo
        FROM f WHERE f.scope = 'type' AND f.samples >= 30 GROUP BY f.queue_id
    )
    SELECT f.queue_id, f.queue, f.scope, f.type, q.visibility_timeout, a.rec, a.rec / 3,
           f.samples, f.p50, f.p95, f.p99, f.max, f.expiry_rate, f.dead_letter_rate, f.redeliveries,
           coalesce(pg_sequence_last_value(to_regclass(format('queue_pg.stale_receipts_%s', f.queue_id))), 0),
           CASE WHEN f.samples = 0 THEN 'none' WHEN f.samples < 30 THEN 'low'
                WHEN f.samples < 300 THEN 'medium' ELSE 'high' END,
           coalesce(s.n >= 2 AND s.hi > 0 AND s.hi >= 10 * s.lo, false),
           CASE WHEN s.n >= 2 THEN s.hi / nullif(s.lo, 0) END,
           q.max_lease
    FROM f
    JOIN queue_pg.queues q ON q.id = f.queue_id
    LEFT JOIN spread s ON s.queue_id = f.queue_id
    CROSS JOIN LATERAL (SELECT queue_pg._advise(f.p99, f.samples, f.expiry_rate, q.visibility_timeout,
                                                q.max_lease) AS rec) a
$$;

CREATE OR REPLACE FUNCTION queue_pg.timeout_advice(since timestamptz, until timestamptz)
RETURNS TABLE (queue text, scope text, type text, current_timeout double precision,
               recommended_timeout double precision, heartbeat_interval double precision,
               samples bigint, p50 double precision, p95 double precision, p99 double precision,
               max double precision, expiry_rate double precision, dead_letter_rate double precision,
               redeliveries bigint, stale_receipts bigint, confidence text,
               split_advised boolean, p99_spread double precision)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM queue_pg._check_window(since, until);
    RETURN QUERY
    SELECT a.queue, a.scope, a.type, a.current_timeout, a.recommended_timeout, a.heartbeat_interval,
           a.samples, a.p50, a.p95, a.p99, a.max, a.expiry_rate, a.dead_letter_rate, a.redeliveries,
           a.stale_receipts, a.confidence, a.split_advised, a.p99_spread
    FROM queue_pg._advice(since, until, NULL) a
    ORDER BY a.queue, a.scope, a.type NULLS FIRST;
END $$;

-- The default window: the last 24 hours.
CREATE OR REPLACE VIEW queue_pg.processing_times AS
SELECT p.* FROM (SELECT queue_pg.now() AS t) n,
     LATERAL queue_pg.processing_times(n.t - interval '24 hours', n.t) p;

CREATE OR REPLACE VIEW queue_pg.timeout_advice AS
SELECT a.* FROM (SELECT queue_pg.now() AS t) n,
     LATERAL queue_pg.timeout_advice(n.t - interval '24 hours', n.t) a;

-- What a hot standby shows is as old as the last transaction it replayed: the read-only surfaces
-- (queue-pg top, metrics, stats, the dashboard) run there too and say how old. On a primary:
-- standby false and the rest NULL. replay_age grows on a quiet primary's standby too (nothing new
-- to replay); replay_pending says whether WAL it received still waits to be replayed.
CREATE OR REPLACE FUNCTION queue_pg.replica_status(
    OUT standby boolean, OUT replayed_at timestamptz, OUT replay_age double precision,
    OUT replay_pending boolean)
LANGUAGE sql STABLE AS $$
    SELECT r,
           CASE WHEN r THEN pg_catalog.pg_last_xact_replay_timestamp() END,
           CASE WHEN r THEN extract(epoch FROM pg_catalog.clock_timestamp()
                                               - pg_catalog.pg_last_xact_replay_timestamp())::float8 END,
           CASE WHEN r THEN pg_catalog.pg_last_wal_receive_lsn()
                            IS DISTINCT FROM pg_catalog.pg_last_wal_replay_lsn() END
    FROM pg_catalog.pg_is_in_recovery() r
$$;
