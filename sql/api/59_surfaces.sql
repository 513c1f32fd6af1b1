-- What the live surfaces read (queue-pg top, the Prometheus collector, dashboards): one row per
-- queue the caller may see, in one statement, so a screen refresh or a scrape costs one query
-- whatever the number of queues. Only composes the monitoring figures (55_monitoring.sql): it
-- computes none of its own.

-- queue_stats of every queue the caller sees, beside its visibility timeout and the figures of
-- the history rows finished in [since, until): the queue-wide advice (timeout_advice, scope
-- 'queue') and the waiting times (processing_times). The history columns are NULL for a queue
-- with nothing finished in the window. `at` is queue_pg.now() of the read, the clock the figures
-- were taken at (a reader turns two reads' counters into rates with it).
CREATE OR REPLACE FUNCTION queue_pg.queue_overview(since timestamptz, until timestamptz)
RETURNS TABLE (
    queue text, at timestamptz,
    visible bigint, in_flight bigint, delayed bigint, dead_lettered bigint,
    oldest_visible_age double precision, stale_receipts bigint, lease_expiries bigint,
    sent bigint, received bigint, deleted bigint,
    sent_1m bigint, received_1m bigint, deleted_1m bigint, lease_expiries_1m bigint, stale_receipts_1m bigint,
    sent_1h bigint, received_1h bigint, deleted_1h bigint, lease_expiries_1h bigint, stale_receipts_1h bigint,
    approximate boolean, sampled_at timestamptz,
    visibility_timeout double precision, recommended_timeout double precision,
    heartbeat_interval double precision, confidence text, messages_finished bigint, samples bigint,
    p50 double precision, p95 double precision, p99 double precision, max double precision,
    wait_samples bigint, wait_p50 double precision, wait_p95 double precision,
    wait_p99 double precision, wait_max double precision,
    expiry_rate double precision, dead_letter_rate double precision
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t_at timestamptz := queue_pg._now();
BEGIN
    PERFORM queue_pg._check_window(since, until);
    RETURN QUERY
    SELECT s.queue, t_at, s.visible, s.in_flight, s.delayed, s.dead_lettered, s.oldest_visible_age,
           s.stale_receipts, s.lease_expiries, s.sent, s.received, s.deleted,
           s.sent_1m, s.received_1m, s.deleted_1m, s.lease_expiries_1m, s.stale_receipts_1m,
           s.sent_1h, s.received_1h, s.deleted_1h, s.lease_expiries_1h, s.stale_receipts_1h,
           s.approximate, s.sampled_at,
           q.visibility_timeout, a.recommended_timeout, a.heartbeat_interval,
           coalesce(a.confidence, 'none'), w.messages, a.samples, a.p50, a.p95, a.p99, a.max,
           w.wait_samples, w.wait_p50, w.wait_p95, w.wait_p99, w.wait_max,
           a.expiry_rate, a.dead_letter_rate
    FROM queue_pg._queue_stats() s
    JOIN queue_pg.queues q ON q.name = s.queue
    LEFT JOIN (SELECT * FROM queue_pg._advice(since, until, NULL) x WHERE x.scope = 'queue') a
        ON a.queue_id = q.id
    LEFT JOIN (SELECT * FROM queue_pg._history_figures(since, until, NULL) x WHERE x.scope = 'queue') w
        ON w.queue_id = q.id
    ORDER BY s.queue;
END $$;
