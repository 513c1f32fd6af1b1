-- Rollups of the history by minute and by hour (revision 0010), kept by sweep and read by the
-- figures and the advice (_history_figures in 55_monitoring.sql) for the whole minutes of a
-- window, so a day costs about 24 hour rows (and at most 118 minute rows at its ends) per queue
-- and type instead of every history row of the day.

-- A time rounded down (_floor_to) or up (_ceil_to) to a multiple of `secs` seconds since the
-- epoch (a minute: 60, an hour: 3600), whatever the session's TimeZone.
CREATE OR REPLACE FUNCTION queue_pg._floor_to(t timestamptz, secs integer) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT to_timestamp(floor(extract(epoch FROM t) / secs) * secs)
$$;

CREATE OR REPLACE FUNCTION queue_pg._ceil_to(t timestamptz, secs integer) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT to_timestamp(ceil(extract(epoch FROM t) / secs) * secs)
$$;

-- The histogram bucket of a time in seconds: 0 below 100 us, else 1 + floor(log_1.02(t / 100 us)),
-- so bucket b holds [100 us x 1.02^(b-1), 100 us x 1.02^b). _bucket_value is its geometric
-- middle, within 0.995% (sqrt(1.02) - 1) of every time in it; bucket 0 says 50 us.
CREATE OR REPLACE FUNCTION queue_pg._bucket(t double precision) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN t < 1e-4 THEN 0
                ELSE least(32767, 1 + floor(ln(t / 1e-4) / ln(1.02)))::smallint END
$$;

CREATE OR REPLACE FUNCTION queue_pg._bucket_value(b smallint) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN b = 0 THEN 5e-5 ELSE 1e-4 * power(1.02::float8, b - 0.5) END
$$;

-- Quantile p of a histogram of `total` values the way percentile_cont reads sorted values: the
-- value at rank p x (total - 1), interpolated between the ranks around it, whose buckets are
-- b_lo and b_hi; each rank's value is its bucket's middle kept within the exact [lo, hi]. Each
-- is within 0.995% of the true value at that rank, so the interpolation is too.
CREATE OR REPLACE FUNCTION queue_pg._histogram_value(p double precision, total bigint, b_lo smallint,
                                                     b_hi smallint, lo double precision, hi double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT least(hi, greatest(lo, queue_pg._bucket_value(b_lo)))
           + (p * (total - 1) - floor(p * (total - 1)))
             * (least(hi, greatest(lo, queue_pg._bucket_value(b_hi))) - least(hi, greatest(lo, queue_pg._bucket_value(b_lo))))
$$;

-- The transactions that may be writing history rows now, other than the caller's: those holding
-- (or waiting for) a write lock on queue_pg.message_history, by virtual transaction id (unique
-- for the server's lifetime). A row is written in the statement that computes its finished_at,
-- after that statement has locked the table, so a row that will finish in a minute already
-- ended is written by one of these. pg_locks is readable by every role and is per database.
CREATE OR REPLACE FUNCTION queue_pg._history_writers() RETURNS text[]
LANGUAGE sql VOLATILE AS $$
    SELECT coalesce(array_agg(DISTINCT l.virtualtransaction), '{}')
    FROM pg_catalog.pg_locks l
    WHERE l.locktype = 'relation' AND l.relation = 'queue_pg.message_history'::regclass
      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
      AND l.mode IN ('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
      AND l.pid IS DISTINCT FROM pg_backend_pid()
$$;

-- How long (queue clock) a mark waits for the writers it saw before the minutes up to it are
-- rolled up anyway: one session left open cannot stop the rollups for ever. Its rows in those
-- minutes, committed later, are missed by the rollups (they stay in the history).
CREATE OR REPLACE FUNCTION queue_pg._rollup_cap() RETURNS interval
LANGUAGE sql IMMUTABLE AS $$ SELECT interval '10 minutes' $$;

-- How many history rows a second each queue-type keeps at most, about: past it, deleted
-- messages are sampled (history_sampling, revision 0022).
CREATE OR REPLACE FUNCTION queue_pg._history_rows_per_second() RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 10 $$;

-- Sets the history's sampling (history_sampling) from the deleted messages of the last minute,
-- as the weighted history rows count them: a queue-type finishing more than
-- _history_rows_per_second() a second keeps one deleted message in every = ceil(rate / that),
-- so it writes between half that and that many rows a second; one finishing fewer keeps all.
-- At most 100 sampled types per queue (the busiest); the rest keep every message. Reads at most
-- 20,000 rows a queue (a burst not sampled yet: the rate is then underestimated, and the next
-- run corrects it). Run by the owner's sweeps, under the rollups' row lock (one at a time).
CREATE OR REPLACE FUNCTION queue_pg._history_sampling(at timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    per_second integer := queue_pg._history_rows_per_second();
BEGIN
    PERFORM 1 FROM queue_pg.history_rollup_state FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    WITH want AS MATERIALIZED (
        SELECT r.queue_id, r.type, r.every FROM (
            SELECT x.queue_id, x.type, ceil(x.n / 60.0 / per_second)::integer AS every,
                   row_number() OVER (PARTITION BY x.queue_id ORDER BY x.n DESC, x.type) AS rank
            FROM (SELECT q.id AS queue_id, coalesce(h.type, '') AS type, sum(h.weight) AS n
                  FROM queue_pg.queues q
                  CROSS JOIN LATERAL (
                      SELECT x.type, x.weight FROM queue_pg.message_history x
                      WHERE x.queue_id = q.id AND x.finished_at >= at - interval '1 minute'
                        AND x.finished_at < at AND x.outcome = 'deleted'
                      LIMIT 20000) h
                  WHERE q.history
                  GROUP BY 1, 2) x
            WHERE x.n > 60 * per_second) r
        WHERE r.rank <= 100 AND r.every >= 2
    ), gone AS (
        DELETE FROM queue_pg.history_sampling s
        WHERE NOT EXISTS (SELECT 1 FROM want w WHERE (w.queue_id, w.type) = (s.queue_id, s.type))
    )
    INSERT INTO queue_pg.history_sampling AS s
    SELECT w.queue_id, w.type, w.every FROM want w ORDER BY 1, 2
    ON CONFLICT (queue_id, type) DO UPDATE SET every = excluded.every WHERE s.every <> excluded.every;
END $$;

-- Rolls up the history of whole minutes after the covered ones (history_rollup_state.hi), up to
-- the minute that ended at least a minute ago, and only once every transaction that could still
-- write a row into them has ended: a call that finds writers at work (_history_writers) takes a
-- mark (the minute end, the writers) and rolls up to an older mark whose writers have all ended
-- (or that is older than _rollup_cap()); with no writer at work it may roll up at once. Then it
-- merges each hour whose minutes are all rolled up into an hour row. Bounded work per call: at
-- most 60 statements of each kind, and it stops once it has read max_rows history rows (the
-- last step may take it one minute's rows past). A step rolls up the next hour at once when it
-- holds no more rows than the budget left, else the next minute; a stretch without history is
-- skipped by one index probe per queue. One roller at a time (a row lock; another sweep
-- skips). Returns the history rows read plus the hours merged: 0 once caught up.
CREATE OR REPLACE FUNCTION queue_pg._rollup_history(at timestamptz, max_rows bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    target timestamptz := queue_pg._floor_to(at, 60) - interval '1 minute';
    st record;
    nxt timestamptz;
    upto timestamptz;
    n bigint;
    done bigint := 0;
    steps integer := 0;
    writers text[];
BEGIN
    IF EXISTS (SELECT 1 FROM queue_pg.history_rollup_state s
               WHERE s.hi >= target AND s.hours_hi > s.hi - interval '1 hour') THEN
        RETURN 0;  -- caught up: no lock, no write
    END IF;
    SELECT s.* INTO st FROM queue_pg.history_rollup_state s FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- how far it may go: a mark whose writers have all ended (or that is older than the cap)
    -- becomes safe; a new mark waits for the writers seen now
    writers := queue_pg._history_writers();
    IF st.mark IS NOT NULL AND (NOT st.mark_writers && writers OR at >= st.mark_taken + queue_pg._rollup_cap()
                                OR at < st.mark_taken) THEN
        st.safe := greatest(st.safe, st.mark);
        st.mark := NULL;
    END IF;
    IF st.mark IS NULL AND (st.safe IS NULL OR st.safe < target) THEN
        IF cardinality(writers) = 0 THEN
            st.safe := target;
        ELSE
            st.mark := target;
            st.mark_taken := at;
            st.mark_writers := writers;
        END IF;
    END IF;
    IF st.safe IS NULL THEN
        UPDATE queue_pg.history_rollup_state s SET mark = st.mark, mark_taken = st.mark_taken,
            mark_writers = st.mark_writers;
        RETURN 1;  -- not caught up: waiting for the mark's writers
    END IF;
    target := least(target, st.safe);
    IF st.hi IS NULL THEN  -- the first run starts at the oldest history row
        SELECT min(f.x) INTO nxt FROM queue_pg.queues q
        CROSS JOIN LATERAL (SELECT min(h.finished_at) AS x FROM queue_pg.message_history h WHERE h.queue_id = q.id) f;
        st.lo := least(queue_pg._floor_to(coalesce(nxt, at), 60), target);
        st.hi := st.lo;
        st.hours_hi := queue_pg._ceil_to(st.lo, 3600);
    END IF;
    WHILE st.hi < target AND done < max_rows AND steps < 60 LOOP
        steps := steps + 1;
        SELECT min(f.x) INTO nxt FROM queue_pg.queues q
        CROSS JOIN LATERAL (SELECT h.finished_at AS x FROM queue_pg.message_history h
                            WHERE h.queue_id = q.id AND h.finished_at >= st.hi
                            ORDER BY h.finished_at LIMIT 1) f;
        IF nxt IS NULL OR nxt >= target THEN
            st.hi := target;
            EXIT;
        END IF;
        st.hi := queue_pg._floor_to(nxt, 60);
        upto := least(target, st.hi + interval '1 hour');
        SELECT count(*) INTO n FROM (
            SELECT 1 FROM queue_pg.queues q
            CROSS JOIN LATERAL (SELECT 1 FROM queue_pg.message_history h
                                WHERE h.queue_id = q.id AND h.finished_at >= st.hi AND h.finished_at < upto
                                LIMIT max_rows - done + 1) f
            LIMIT max_rows - done + 1) c;
        IF n > max_rows - done THEN
            upto := st.hi + interval '1 minute';
        END IF;
        -- planned for these bounds (EXECUTE): an hour of backfill reads its day's partition
        -- whole, a minute of a live queue goes through the index (queue_id, finished_at)
        EXECUTE $sql$
        WITH raw AS MATERIALIZED (
            SELECT h.queue_id, queue_pg._floor_to(h.finished_at, 60) AS start, h.type, h.outcome,
                   h.receive_count, h.lease_expiries, h.weight AS w,
                   queue_pg._work_time(h.outcome, h.last_received_at, h.finished_at) AS work,
                   queue_pg._wait_time(h.first_received_at, h.enqueued_at) AS wait
            FROM queue_pg.queues q
            JOIN queue_pg.message_history h ON h.queue_id = q.id AND h.finished_at >= $1 AND h.finished_at < $2
        ), hist AS (
            SELECT x.queue_id, x.start, x.type, x.kind, array_agg(x.b ORDER BY x.b) AS bs,
                   array_agg(x.n ORDER BY x.b) AS ns
            FROM (SELECT r.queue_id, r.start, r.type, k.kind, queue_pg._bucket(k.t) AS b, sum(r.w)::integer AS n
                  FROM raw r CROSS JOIN LATERAL (VALUES ('work', r.work), ('wait', r.wait)) k(kind, t)
                  WHERE k.t IS NOT NULL GROUP BY 1, 2, 3, 4, 5) x
            GROUP BY x.queue_id, x.start, x.type, x.kind
        ), ins AS (
            INSERT INTO queue_pg.history_rollups
            SELECT g.queue_id, 1, g.start, g.type, g.messages, g.receives, g.lease_expiries, g.dead_lettered,
                   g.redeliveries, g.work_min, g.work_max, coalesce(w.bs, '{}'), coalesce(w.ns, '{}'),
                   g.wait_min, g.wait_max, coalesce(t.bs, '{}'), coalesce(t.ns, '{}')
            FROM (SELECT r.queue_id, r.start, r.type, sum(r.w) AS messages,
                         sum(r.receive_count * r.w) AS receives, sum(r.lease_expiries * r.w) AS lease_expiries,
                         coalesce(sum(r.w) FILTER (WHERE r.outcome = 'dead_lettered'), 0) AS dead_lettered,
                         sum(greatest(r.receive_count - 1, 0) * r.w) AS redeliveries,
                         min(r.work) AS work_min, max(r.work) AS work_max,
                         min(r.wait) AS wait_min, max(r.wait) AS wait_max
                  FROM raw r GROUP BY r.queue_id, r.start, r.type) g
            LEFT JOIN hist w ON (w.queue_id, w.start, w.kind) = (g.queue_id, g.start, 'work')
                            AND w.type IS NOT DISTINCT FROM g.type
            LEFT JOIN hist t ON (t.queue_id, t.start, t.kind) = (g.queue_id, g.start, 'wait')
                            AND t.type IS NOT DISTINCT FROM g.type
            RETURNING messages
        )
        SELECT coalesce(sum(ins.messages), 0) FROM ins
        $sql$ INTO n USING st.hi, upto;
        done := done + n;
        st.hi := upto;
    END LOOP;
    steps := 0;
    WHILE st.hours_hi + interval '1 hour' <= st.hi AND steps < 60 LOOP
        steps := steps + 1;
        PERFORM queue_pg._rollup_hour(st.hours_hi);
        st.hours_hi := st.hours_hi + interval '1 hour';
    END LOOP;
    UPDATE queue_pg.history_rollup_state s SET lo = st.lo, hi = st.hi, hours_hi = st.hours_hi,
        safe = st.safe, mark = st.mark, mark_taken = st.mark_taken, mark_writers = st.mark_writers;
    RETURN done + steps + (st.mark IS NOT NULL)::int;
END $$;

-- The hour rows of the hour starting at `first`, merged from its minute rows (each queue's
-- through the index).
CREATE OR REPLACE FUNCTION queue_pg._rollup_hour(first timestamptz) RETURNS void
LANGUAGE sql AS $$
    WITH m AS MATERIALIZED (
        SELECT r.* FROM queue_pg.queues q CROSS JOIN LATERAL (
            SELECT x.* FROM queue_pg.history_rollups x
            WHERE x.queue_id = q.id AND x.minutes = 1 AND x.start >= first AND x.start < first + interval '1 hour'
            OFFSET 0) r
    ), hist AS (
        SELECT x.queue_id, x.type, x.kind, array_agg(x.b ORDER BY x.b) AS bs, array_agg(x.n ORDER BY x.b) AS ns
        FROM (SELECT r.queue_id, r.type, k.kind, u.b, sum(u.n)::integer AS n
              FROM m r
              CROSS JOIN LATERAL (VALUES ('work', r.work_buckets, r.work_counts),
                                         ('wait', r.wait_buckets, r.wait_counts)) k(kind, bs, ns)
              CROSS JOIN LATERAL unnest(k.bs, k.ns) u(b, n)
              GROUP BY 1, 2, 3, 4) x
        GROUP BY x.queue_id, x.type, x.kind
    )
    INSERT INTO queue_pg.history_rollups
    SELECT g.queue_id, 60, first, g.type, g.messages, g.receives, g.lease_expiries, g.dead_lettered,
           g.redeliveries, g.work_min, g.work_max, coalesce(w.bs, '{}'), coalesce(w.ns, '{}'),
           g.wait_min, g.wait_max, coalesce(t.bs, '{}'), coalesce(t.ns, '{}')
    FROM (SELECT r.queue_id, r.type, sum(r.messages) AS messages, sum(r.receives) AS receives,
                 sum(r.lease_expiries) AS lease_expiries, sum(r.dead_lettered) AS dead_lettered,
                 sum(r.redeliveries) AS redeliveries, min(r.work_min) AS work_min, max(r.work_max) AS work_max,
                 min(r.wait_min) AS wait_min, max(r.wait_max) AS wait_max
          FROM m r GROUP BY r.queue_id, r.type) g
    LEFT JOIN hist w ON (w.queue_id, w.kind) = (g.queue_id, 'work') AND w.type IS NOT DISTINCT FROM g.type
    LEFT JOIN hist t ON (t.queue_id, t.kind) = (g.queue_id, 'wait') AND t.type IS NOT DISTINCT FROM g.type
$$;

-- Rollups older than their queue's history_retention go, like the history rows
-- (bounded batches; a concurrent sweep's rows are skipped).
CREATE OR REPLACE FUNCTION queue_pg._forget_rollups(at timestamptz, max_rows integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queue_pg.history_rollups r
    WHERE r.ctid = ANY (ARRAY(
        SELECT x.ctid FROM queue_pg.queues q
        JOIN queue_pg.history_rollups x
          ON x.queue_id = q.id AND x.minutes IN (1, 60) AND x.start < at - queue_pg._seconds(q.history_retention)
        LIMIT max_rows FOR UPDATE OF x SKIP LOCKED));
END $$;

-- The figures of _history_figures (55_monitoring.sql) for a window [since, until) whose minutes
-- [a, b) are rolled up, and within them the hours [ha, hb) (ha = hb: none): those hours from
-- the hour rows, the other minutes of [a, b) from the minute rows, and the rest of the window
-- (its ragged ends, and the last minutes not rolled up yet) from the history rows. Counts,
-- rates, minimum and maximum are exact; p50 / p95 / p99 come from the merged histograms
-- (_histogram_value: within 1%).
CREATE OR REPLACE FUNCTION queue_pg._rolled_figures(since timestamptz, until timestamptz, only_id integer,
                                                    a timestamptz, b timestamptz,
                                                    ha timestamptz, hb timestamptz)
RETURNS TABLE (queue_id integer, queue text, scope text, type text, messages bigint,
               samples bigint, p50 double precision, p95 double precision, p99 double precision, max double precision,
               wait_samples bigint, wait_p50 double precision, wait_p95 double precision,
               wait_p99 double precision, wait_max double precision,
               expiry_rate double precision, dead_letter_rate double precision, redeliveries bigint)
LANGUAGE sql STABLE AS $$
    WITH qs AS MATERIALIZED (
        SELECT q.id, q.name FROM queue_pg.queues q
        -- only_id NULL: the queues the caller may see, chosen before any history is read
        WHERE CASE WHEN only_id IS NULL THEN queue_pg._sees(q.id) ELSE q.id = only_id END
    ), raw AS MATERIALIZED (  -- each queue's rows of the two ends through the index
        SELECT h.queue_id, h.type, h.outcome, h.receive_count, h.lease_expiries, h.weight AS w,
               queue_pg._work_time(h.outcome, h.last_received_at, h.finished_at) AS work,
               queue_pg._wait_time(h.first_received_at, h.enqueued_at) AS wait
        FROM qs CROSS JOIN LATERAL (
            SELECT x.* FROM queue_pg.message_history x
            WHERE x.queue_id = qs.id AND x.finished_at >= since AND x.finished_at < a
            UNION ALL
            SELECT x.* FROM queue_pg.message_history x
            WHERE x.queue_id = qs.id AND x.finished_at >= b AND x.finished_at < until) h
    ), roll AS MATERIALIZED (  -- each queue's rows through the index (queue_id, minutes, start)
        SELECT r.* FROM qs CROSS JOIN LATERAL (
            SELECT x.* FROM queue_pg.history_rollups x
            WHERE x.queue_id = qs.id AND x.minutes = 60 AND x.start >= ha AND x.start < hb
            UNION ALL
            SELECT x.* FROM queue_pg.history_rollups x
            WHERE x.queue_id = qs.id AND x.minutes = 1 AND x.start >= a AND x.start < ha
            UNION ALL
            SELECT x.* FROM queue_pg.history_rollups x
            WHERE x.queue_id = qs.id AND x.minutes = 1 AND x.start >= hb AND x.start < b) r
    ), parts AS (
        SELECT r.queue_id, r.type, sum(r.w) AS messages, sum(r.receive_count * r.w) AS receives,
               sum(r.lease_expiries * r.w) AS lease_expiries,
               coalesce(sum(r.w) FILTER (WHERE r.outcome = 'dead_lettered'), 0) AS dead_lettered,
               sum(greatest(r.receive_count - 1, 0) * r.w) AS redeliveries,
               min(r.work) AS work_min, max(r.work) AS work_max, min(r.wait) AS wait_min, max(r.wait) AS wait_max
        FROM raw r GROUP BY r.queue_id, r.type
        UNION ALL
        SELECT r.queue_id, r.type, sum(r.messages), sum(r.receives), sum(r.lease_expiries), sum(r.dead_lettered),
               sum(r.redeliveries), min(r.work_min), max(r.work_max), min(r.wait_min), max(r.wait_max)
        FROM roll r GROUP BY r.queue_id, r.type
    ), sums AS (
        SELECT p.queue_id, p.type, grouping(p.type) = 1 AS whole, sum(p.messages)::bigint AS messages,
               sum(p.receives) AS receives, sum(p.lease_expiries) AS lease_expiries,
               sum(p.dead_lettered) AS dead_lettered, sum(p.redeliveries)::bigint AS redeliveries,
               min(p.work_min) AS work_min, max(p.work_max) AS work_max,
               min(p.wait_min) AS wait_min, max(p.wait_max) AS wait_max
        FROM parts p GROUP BY GROUPING SETS ((p.queue_id), (p.queue_id, p.type))
    ), cells AS (
        SELECT r.queue_id, r.type, k.kind, queue_pg._bucket(k.t) AS b, sum(r.w) AS n
        FROM raw r CROSS JOIN LATERAL (VALUES ('work', r.work), ('wait', r.wait)) k(kind, t)
        WHERE k.t IS NOT NULL GROUP BY 1, 2, 3, 4
        UNION ALL
        SELECT r.queue_id, r.type, k.kind, u.b, sum(u.n)
        FROM roll r
        CROSS JOIN LATERAL (VALUES ('work', r.work_buckets, r.work_counts), ('wait', r.wait_buckets, r.wait_counts)) k(kind, bs, ns)
        CROSS JOIN LATERAL unnest(k.bs, k.ns) u(b, n)
        GROUP BY 1, 2, 3, 4
    ), cum AS (
        SELECT c.*, sum(c.n) OVER (PARTITION BY c.queue_id, c.type, c.whole, c.kind ORDER BY c.b) AS upto,
               sum(c.n) OVER (PARTITION BY c.queue_id, c.type, c.whole, c.kind) AS total
        FROM (SELECT c.queue_id, c.type, grouping(c.type) = 1 AS whole, c.kind, c.b, sum(c.n)::bigint AS n
              FROM cells c GROUP BY GROUPING SETS ((c.queue_id, c.kind, c.b), (c.queue_id, c.type, c.kind, c.b))) c
    ), hists AS (  -- per group, the buckets of the ranks around p x (total - 1) for each p
        SELECT c.queue_id, c.type, c.whole, c.kind, c.total::bigint AS total,
               min(c.b) FILTER (WHERE c.upto > floor(0.5 * (c.total - 1))) AS lo50,
               min(c.b) FILTER (WHERE c.upto > least(floor(0.5 * (c.total - 1)) + 1, c.total - 1)) AS hi50,
               min(c.b) FILTER (WHERE c.upto > floor(0.95 * (c.total - 1))) AS lo95,
               min(c.b) FILTER (WHERE c.upto > least(floor(0.95 * (c.total - 1)) + 1, c.total - 1)) AS hi95,
               min(c.b) FILTER (WHERE c.upto > floor(0.99 * (c.total - 1))) AS lo99,
               min(c.b) FILTER (WHERE c.upto > least(floor(0.99 * (c.total - 1)) + 1, c.total - 1)) AS hi99
        FROM cum c GROUP BY c.queue_id, c.type, c.whole, c.kind, c.total
    )
    SELECT s.queue_id, qs.name, CASE WHEN s.whole THEN 'queue' ELSE 'type' END, s.type, s.messages,
           coalesce(w.total, 0),
           queue_pg._histogram_value(0.5, w.total, w.lo50, w.hi50, s.work_min, s.work_max),
           queue_pg._histogram_value(0.95, w.total, w.lo95, w.hi95, s.work_min, s.work_max),
           queue_pg._histogram_value(0.99, w.total, w.lo99, w.hi99, s.work_min, s.work_max),
           s.work_max, coalesce(t.total, 0),
           queue_pg._histogram_value(0.5, t.total, t.lo50, t.hi50, s.wait_min, s.wait_max),
           queue_pg._histogram_value(0.95, t.total, t.lo95, t.hi95, s.wait_min, s.wait_max),
           queue_pg._histogram_value(0.99, t.total, t.lo99, t.hi99, s.wait_min, s.wait_max),
           s.wait_max,
           s.lease_expiries::float8 / nullif(s.receives, 0), s.dead_lettered::float8 / s.messages, s.redeliveries
    FROM sums s
    JOIN qs ON qs.id = s.queue_id
    LEFT JOIN hists w ON w.queue_id = s.queue_id AND w.whole = s.whole AND w.type IS NOT DISTINCT FROM s.type AND w.kind = 'work'
    LEFT JOIN hists t ON t.queue_id = s.queue_id AND t.whole = s.whole AND t.type IS NOT DISTINCT FROM s.type AND t.kind = 'wait'
$$;
