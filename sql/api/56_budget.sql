-- Leases from a duplicate budget (docs/timeouts.md, "Leases from a duplicate budget"): each
-- type's lease is the quantile 1 - duplicate_budget of its processing time, read from a
-- lognormal fitted to the upper part of its recent history, with a margin when samples are few.

-- P(Z > z) of a standard normal: erfc(z / sqrt 2) / 2, erfc by the Chebyshev fit of Numerical
-- Recipes (fractional error below 1.2e-7 everywhere, so tail probabilities of 1e-9 keep their
-- digits; PostgreSQL 15 has no erfc).
CREATE OR REPLACE FUNCTION queue_pg._normal_tail(z double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN z >= 0 THEN e / 2 ELSE 1 - e / 2 END
    FROM (SELECT 1 / (1 + 0.5 * abs(z / sqrt(2))) AS t, abs(z / sqrt(2)) AS x) a,
    LATERAL (SELECT t * exp(-x * x - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277))))))))) AS e) b
$$;

-- The z with P(Z > z) = p, for 0 < p <= 0.5 (Abramowitz and Stegun 26.2.23, |error| < 4.5e-4:
-- a lease's relative error below 0.05% x sigma).
CREATE OR REPLACE FUNCTION queue_pg._normal_upper(p double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT t - (2.515517 + 0.802853 * t + 0.010328 * t * t)
             / (1 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t)
    FROM (SELECT sqrt(-2 * ln(p)) AS t) a
$$;

-- The lognormal tail of a type's processing times, fitted to its upper part: mu = ln p50 and
-- the larger of the two spreads the p95 and the p99 call for (a tail heavier than lognormal
-- shows as a p99 farther out than the p95 predicts, and the fit follows the heavier one);
-- margin widens sigma by 1 / sqrt(the samples above p95) (about the relative error of a spread
-- read from that many), 45% at 100 samples, 4.5% at 10,000. NULL without 100 samples or
-- without spread (p99 = p50: no tail to fit): those take the 6 x p99 rule.
CREATE OR REPLACE FUNCTION queue_pg._tail_fit(p50 double precision, p95 double precision,
    p99 double precision, samples bigint, OUT mu double precision, OUT sigma double precision,
    OUT margin double precision)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ln(p50), greatest(ln(p99 / p50) / 2.326348, ln(p95 / p50) / 1.644854, 0),
           1 + 1 / sqrt(0.05 * samples)
    WHERE samples >= 100 AND p50 > 0 AND p95 >= p50 AND p99 > p50
$$;

-- Expected duplicates per million deliveries at `lease` under the fit (mu, sigma): the share of
-- runs that outlast it.
CREATE OR REPLACE FUNCTION queue_pg._duplicates_per_million(lease double precision, mu double precision,
                                                            sigma double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN lease IS NULL OR mu IS NULL THEN NULL
                WHEN sigma = 0 THEN CASE WHEN ln(lease) >= mu THEN 0 ELSE 1e6 END
                ELSE 1e6 * queue_pg._normal_tail((ln(lease) - mu) / sigma) END
$$;

-- The duplicate budget split across a queue's fitted types, optimally: the leases L_i that make
-- the expected wait of hung work, sum w_i L_i, the least while the predicted duplicate rate,
-- sum w_i P_i(L_i) / sum w_i, stays within the budget. w_i: type i's share of the deliveries
-- (its samples; hangs are taken to fall on the types in proportion to their deliveries, as
-- nothing tells them apart); P_i: the survival of the fit (mu_i, s_i = sigma x margin). Lagrange:
-- at the optimum every lease not held by a bound has the same fitted density f_i(L_i) = d: a
-- type whose tail falls steeply (a second more buys much risk) is covered further than its own
-- quantile, cheaply, and leaves budget to a type with a long tail (a second buys little), whose
-- lease is then shorter than its own quantile. Given d the lease is closed-form (the upper
-- root of ln f_i = ln d, f_i(L) = phi(z) / (s_i L), ln L = mu_i + s_i z); the total risk grows
-- with d, so a bisection on ln d finds the d that spends the budget (water-filling), each lease
-- held in [lo_i, hi_i] (a bound held is what the budget cannot move). One type: its quantile
-- 1 - budget, the rule before the split. Out: per type (in the arrays' order) the lease before
-- the bounds (quantile) and within them (lease). Where the bounds leave no split within the
-- budget (a tune_max that holds a heavy tail short), each type takes its own quantile within
-- its bounds, the rule before the split: holding the other types longer would buy next to no
-- risk for a longer wait.
CREATE OR REPLACE FUNCTION queue_pg._budget_split(budget double precision, w double precision[],
    mu double precision[], s double precision[], lo double precision[], hi double precision[])
RETURNS TABLE (i integer, quantile double precision, lease double precision)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    n integer := cardinality(w);
    total double precision := 0;
    a double precision := -200;  -- ln d: a density this low puts every lease past 19 sigma
    b double precision := 50;    -- and this high every lease at its lower bound
    mid double precision;
BEGIN
    IF n = 1 THEN
        i := 1;
        quantile := exp(mu[1] + queue_pg._normal_upper(budget) * s[1]);
        lease := least(greatest(quantile, lo[1]), hi[1]);
        RETURN NEXT;
        RETURN;
    END IF;
    FOR k IN 1 .. n LOOP
        total := total + w[k];
    END LOOP;
    IF queue_pg._split_risk(a, w, mu, s, lo, hi) > budget * total THEN
        -- the bounds leave no split within the budget: each type its own quantile
        RETURN QUERY SELECT k, e.q, least(greatest(e.q, lo[k]), hi[k]) FROM generate_series(1, n) k,
            LATERAL (SELECT exp(mu[k] + queue_pg._normal_upper(budget) * s[k]) AS q) e;
        RETURN;
    END IF;
    FOR step IN 1 .. 60 LOOP  -- ln d to 250 / 2^60
        mid := (a + b) / 2;
        IF queue_pg._split_risk(mid, w, mu, s, lo, hi) <= budget * total THEN
            a := mid;
        ELSE
            b := mid;
        END IF;
    END LOOP;
    RETURN QUERY SELECT k, e.q, least(greatest(e.q, lo[k]), hi[k]) FROM generate_series(1, n) k,
        LATERAL (SELECT queue_pg._split_lease(a, mu[k], s[k]) AS q) e;
END $$;

-- The lease of a type of fit (mu, s) at density level ln d (see _budget_split), before its
-- bounds: the upper root of ln f(L) = ln d. Where d is above all of the type's density the root
-- degenerates to the mode (z = -s), and its lower bound takes over.
CREATE OR REPLACE FUNCTION queue_pg._split_lease(ln_d double precision, mu double precision,
                                                 s double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT exp(mu + s * (-s + sqrt(greatest(s * s - 2 * (mu + ln(s) + 0.918938533204673 + ln_d), 0))))
$$;

-- sum w_i P_i(L_i) at density level ln d, each lease within its bounds (see _budget_split).
CREATE OR REPLACE FUNCTION queue_pg._split_risk(ln_d double precision, w double precision[],
    mu double precision[], s double precision[], lo double precision[], hi double precision[])
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    r double precision := 0;
BEGIN
    FOR k IN 1 .. cardinality(w) LOOP
        r := r + w[k] * queue_pg._normal_tail(
            (ln(least(greatest(queue_pg._split_lease(ln_d, mu[k], s[k]), lo[k]), hi[k])) - mu[k]) / s[k]);
    END LOOP;
    RETURN r;
END $$;

-- Per queue and type (scopes of _advice) of [since, until): the lease the queue's duplicate
-- budget calls for, with what it costs. fit 'lognormal': the queue's named types with a fit share
-- the budget (_budget_split: the least expected wait of hung work at the budget's predicted
-- duplicate rate); a lognormal group without a type, and the queue-wide row, take the quantile
-- 1 - budget of their own fit. Either widened by the fit's margin, within [tune_min,
-- least(tune_max, max_lease)], and never below the longest run seen while the sample is too
-- small to reach the quantile (samples x budget < 1: a lease shorter than a run seen is then
-- known too short). fit '6 x p99' (fewer than 100 samples, or no spread to fit): the advice's
-- recommended timeout, outside the split. recovery_time: how long after its receive a hung or
-- crashed run's message is delivered again (the lease). rule_timeout and
-- rule_duplicates_per_million: the 6 x p99 rule's timeout and its predicted risk under the same
-- fit, for comparison.
CREATE OR REPLACE FUNCTION queue_pg._lease_advice(since timestamptz, until timestamptz, only_id integer)
RETURNS TABLE (queue_id integer, queue text, scope text, type text, duplicate_budget double precision,
               samples bigint, confidence text, fit text, quantile double precision,
               lease double precision, duplicates_per_million double precision,
               recovery_time double precision, rule_timeout double precision,
               rule_duplicates_per_million double precision)
LANGUAGE sql STABLE AS $$
    WITH g AS MATERIALIZED (
        SELECT a.*, q.duplicate_budget AS budget, q.tune_min,
               least(coalesce(q.tune_max, q.max_lease), q.max_lease) AS hi, f.mu, f.sigma,
               f.sigma * f.margin AS s,
               CASE WHEN a.samples * q.duplicate_budget < 1 THEN greatest(a.max, q.tune_min)
                    ELSE q.tune_min END AS lo,
               row_number() OVER (PARTITION BY a.queue_id ORDER BY a.scope, a.type) AS n
        FROM queue_pg._advice(since, until, only_id) a
        JOIN queue_pg.queues q ON q.id = a.queue_id
        LEFT JOIN LATERAL queue_pg._tail_fit(a.p50, a.p95, a.p99, a.samples) f ON true
    ),
    shared AS (  -- the types that share the budget, per queue
        SELECT g.queue_id, g.budget, array_agg(g.n ORDER BY g.n) AS ns,
               array_agg(g.samples::float8 ORDER BY g.n) AS w, array_agg(g.mu ORDER BY g.n) AS mu,
               array_agg(g.s ORDER BY g.n) AS s, array_agg(g.lo ORDER BY g.n) AS lo,
               array_agg(g.hi ORDER BY g.n) AS hi
        FROM g WHERE g.mu IS NOT NULL AND g.scope = 'type' AND g.type IS NOT NULL
        GROUP BY g.queue_id, g.budget
    ),
    split AS (
        SELECT sh.queue_id, sh.ns[b.i] AS n, b.quantile, b.lease
        FROM shared sh, LATERAL queue_pg._budget_split(sh.budget, sh.w, sh.mu, sh.s, sh.lo, sh.hi) b
    )
    SELECT g.queue_id, g.queue, g.scope, g.type, g.budget, g.samples, g.confidence,
           CASE WHEN g.mu IS NOT NULL THEN 'lognormal' WHEN g.recommended_timeout IS NOT NULL THEN '6 x p99' END,
           x.quantile, l.lease, queue_pg._duplicates_per_million(l.lease, g.mu, g.sigma), l.lease,
           g.recommended_timeout, queue_pg._duplicates_per_million(g.recommended_timeout, g.mu, g.sigma)
    FROM g
    LEFT JOIN split sp ON sp.queue_id = g.queue_id AND sp.n = g.n
    CROSS JOIN LATERAL (
        SELECT coalesce(sp.quantile, exp(g.mu + queue_pg._normal_upper(g.budget) * g.s)) AS quantile) x
    CROSS JOIN LATERAL (SELECT CASE WHEN g.mu IS NULL THEN g.recommended_timeout
        ELSE least(greatest(ceil(1000 * coalesce(sp.lease, least(greatest(x.quantile, g.lo), g.hi))) / 1000,
                            g.tune_min), g.hi) END AS lease) l
$$;

CREATE OR REPLACE FUNCTION queue_pg.lease_advice(since timestamptz, until timestamptz)
RETURNS TABLE (queue text, scope text, type text, duplicate_budget double precision,
               samples bigint, confidence text, fit text, quantile double precision,
               lease double precision, duplicates_per_million double precision,
               recovery_time double precision, rule_timeout double precision,
               rule_duplicates_per_million double precision)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM queue_pg._check_window(since, until);
    RETURN QUERY
    SELECT a.queue, a.scope, a.type, a.duplicate_budget, a.samples, a.confidence, a.fit, a.quantile,
           a.lease, a.duplicates_per_million, a.recovery_time, a.rule_timeout, a.rule_duplicates_per_million
    FROM queue_pg._lease_advice(since, until, NULL) a
    ORDER BY a.queue, a.scope, a.type NULLS FIRST;
END $$;

CREATE OR REPLACE VIEW queue_pg.lease_advice AS
SELECT a.* FROM (SELECT queue_pg.now() AS t) n,
     LATERAL queue_pg.lease_advice(n.t - interval '24 hours', n.t) a;

-- Hung work. A heartbeating consumer keeps its lease up to max_lease (12 hours by default), a
-- hung run with it. On a 'per_type' queue a run of a type with a lease (queue_pg.type_leases:
-- the budget's lease, or 6 x p99) is stuck once it has run _hung_factors().stuck times that
-- lease (stuck_jobs shows it), and past _hung_factors().stop times it a heartbeat that would
-- extend its lease is refused (LeaseLimitExceeded, as past max_lease: the worker logs a
-- warning, cancels the job and stops beating) so that the message is delivered again when the
-- lease it has lapses. At a budget of 1e-6 a live run past twice its type's lease is far
-- rarer than one in a million; four times is the point where waiting costs more than a retry.
CREATE OR REPLACE FUNCTION queue_pg._hung_factors(OUT stuck double precision, OUT stop double precision)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 2::float8, 4::float8 $$;

-- Seconds after its receive from which a run of the message's type on queue q (a 'per_type'
-- queue) has its heartbeats refused; NULL: no limit but max_lease.
CREATE OR REPLACE FUNCTION queue_pg._hung_limit(q queue_pg.queues, attributes jsonb) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT least(q.max_lease, (queue_pg._hung_factors()).stop * l.lease) FROM queue_pg.type_leases l
    WHERE q.lease_policy = 'per_type' AND l.queue_id = q.id AND l.type = left(attributes ->> 'type', 100)
$$;

-- The leased messages whose run has lasted past the stuck point of their type (see above),
-- with the consumer that leased them (its name, when it registered one): no bodies.
CREATE OR REPLACE FUNCTION queue_pg._stuck_jobs()
RETURNS TABLE (queue text, id bigint, type text, consumer text, leased_at timestamptz,
               running_for double precision, type_lease double precision, stuck_after double precision,
               stopped_after double precision, visible_until timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    at timestamptz := queue_pg._now();
BEGIN
    RETURN QUERY
    SELECT q.name, m.id, l.type, left(c.name, 100), m.last_received_at,
           extract(epoch FROM at - m.last_received_at)::float8, l.lease,
           (queue_pg._hung_factors()).stuck * l.lease, least(q.max_lease, (queue_pg._hung_factors()).stop * l.lease),
           m.visible_at
    FROM queue_pg.queues q
    JOIN queue_pg.type_leases l ON l.queue_id = q.id
    JOIN queue_pg.messages m ON m.queue_id = q.id AND m.visible_at > at AND m.last_received_at IS NOT NULL
                            AND left(m.attributes ->> 'type', 100) = l.type
    LEFT JOIN queue_pg.consumers c ON c.id = m.consumer_id
    WHERE q.lease_policy = 'per_type' AND queue_pg._sees(q.id)
      AND (m.expires_at IS NULL OR m.expires_at > at)
      AND m.last_received_at < at - queue_pg._seconds((queue_pg._hung_factors()).stuck * l.lease)
    ORDER BY q.name, m.last_received_at;
END $$;

CREATE OR REPLACE VIEW queue_pg.stuck_jobs AS SELECT * FROM queue_pg._stuck_jobs();

-- The stuck and stop points of each type of queue `queue_name` that has them (a 'per_type'
-- queue's types with a lease in type_leases), in seconds after a receive: what a worker reads
-- (once a minute per queue it runs jobs of) to log a job of its own once when it becomes stuck,
-- by the rule above, without reading stuck_jobs. No rows for a 'fixed' queue, or one the caller
-- has no grant on.
CREATE OR REPLACE FUNCTION queue_pg.hung_limits(queue_name text)
RETURNS TABLE (type text, type_lease double precision, stuck_after double precision,
               stopped_after double precision)
LANGUAGE sql STABLE AS $$
    SELECT l.type, l.lease, (queue_pg._hung_factors()).stuck * l.lease,
           least(q.max_lease, (queue_pg._hung_factors()).stop * l.lease)
    FROM queue_pg.queues q JOIN queue_pg.type_leases l ON l.queue_id = q.id
    WHERE q.name = queue_name AND q.lease_policy = 'per_type' AND queue_pg._sees(q.id)
    ORDER BY l.type
$$;
