-- Revision 0007: periodic tasks. One row per schedule: a cron expression evaluated in SQL
-- (queue_pg._cron_next, sql/api/52_periodic.sql) in the schedule's time zone, and the next tick
-- due. Workers fire due ticks with queue_pg.fire_schedules(): the row is locked (SKIP LOCKED) and
-- next_run moved past now in the transaction that sends the tick's message, so each tick is sent
-- once however many workers race for it.
CREATE TABLE queue_pg.periodic (
    name text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.:-]{1,200}$'),
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    cron text NOT NULL,
    tz text NOT NULL DEFAULT 'UTC',
    body jsonb NOT NULL,
    attributes jsonb,
    -- ticks later than `grace` seconds when a worker gets to them were missed: 'skip' drops them,
    -- 'catch_up' sends the latest `catch_up` of them
    missed text NOT NULL DEFAULT 'skip' CHECK (missed IN ('skip', 'catch_up')),
    catch_up integer NOT NULL DEFAULT 10 CHECK (catch_up BETWEEN 0 AND 1000),
    grace double precision NOT NULL DEFAULT 60 CHECK (grace >= 0),
    next_run timestamptz NOT NULL,
    last_run timestamptz,
    last_tick timestamptz,
    last_message_id bigint,
    skipped bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT statement_timestamp()
);
CREATE INDEX periodic_due ON queue_pg.periodic (next_run);
REVOKE ALL ON queue_pg.periodic FROM PUBLIC;

-- Per-queue start rate (sql/api/53_task_limits.sql): a token bucket refilled at per_second and
-- holding at most one second's worth (at least one start). Only queues whose options name a
-- rate_limit read it; a claim on such a queue locks its row until the claim's transaction ends.
CREATE TABLE queue_pg.rate_limits (
    queue_id integer PRIMARY KEY REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    per_second double precision NOT NULL CHECK (per_second > 0),
    tokens double precision NOT NULL,
    at timestamptz NOT NULL
);
REVOKE ALL ON queue_pg.rate_limits FROM PUBLIC;
