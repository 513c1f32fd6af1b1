-- Revision 0005: what the queue learns about its own work, and what it does with it.
-- Samples of each queue's figures (written by maintenance, read by queue_stats), the per-type
-- leases of queues whose lease_policy is 'per_type', the tuner's settings and its log, and
-- routes that send a type of message to another queue.

ALTER TABLE queue_pg.queues
    -- 'fixed': a receive without visibility_timeout leases for the queue's default;
    -- 'per_type': for its type's lease in queue_pg.type_leases, else the default.
    ADD COLUMN lease_policy text NOT NULL DEFAULT 'fixed' CHECK (lease_policy IN ('fixed', 'per_type')),
    -- queue_pg.tune() moves visibility_timeout toward the advice, within [tune_min, tune_max].
    ADD COLUMN auto_tune boolean NOT NULL DEFAULT false,
    ADD COLUMN tune_min double precision NOT NULL DEFAULT 1,
    ADD COLUMN tune_max double precision,
    -- true while queue_pg.routes has a row for the queue: sends to other queues never look.
    ADD COLUMN has_routes boolean NOT NULL DEFAULT false;

-- Counts of each queue now and then (at most every 15 seconds, by sweep): the flow counters'
-- values, so that queue_stats can subtract the one of a minute or an hour ago, and exact
-- message counts, which queue_stats reports for a queue too large to count on every read.
CREATE TABLE queue_pg.queue_samples (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    at timestamptz NOT NULL,
    sent bigint NOT NULL,
    received bigint NOT NULL,
    deleted bigint NOT NULL,
    lease_expiries bigint NOT NULL,
    stale_receipts bigint NOT NULL,
    visible bigint NOT NULL,
    in_flight bigint NOT NULL,
    delayed bigint NOT NULL,
    dead_lettered bigint NOT NULL,
    PRIMARY KEY (queue_id, at)
);
CREATE INDEX queue_samples_at ON queue_pg.queue_samples (at);

-- The lease a receive gives a message of `type` on a 'per_type' queue: refreshed from the
-- advice by queue_pg.tune(), read by one index lookup per message at receive.
CREATE TABLE queue_pg.type_leases (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    type text NOT NULL,
    lease double precision NOT NULL,
    samples bigint NOT NULL,
    refreshed_at timestamptz NOT NULL,
    PRIMARY KEY (queue_id, type)
);

-- Every change the tuner made: a queue's default timeout, with the evidence behind it.
CREATE TABLE queue_pg.tuning_history (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL,
    queue_id integer NOT NULL,
    queue text NOT NULL,
    old_timeout double precision NOT NULL,
    new_timeout double precision NOT NULL,
    advice double precision NOT NULL,
    samples bigint NOT NULL,
    why text NOT NULL,
    stale_receipts bigint NOT NULL  -- the queue's refused stale receipts then (see tune)
);
CREATE INDEX tuning_history_queue ON queue_pg.tuning_history (queue_id, at);

-- A send to queue_id whose attributes' type is `type` lands in target_id.
CREATE TABLE queue_pg.routes (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    type text NOT NULL,
    target_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    PRIMARY KEY (queue_id, type),
    CHECK (queue_id <> target_id)
);
CREATE INDEX routes_target ON queue_pg.routes (target_id);

REVOKE ALL ON queue_pg.queue_samples, queue_pg.type_leases, queue_pg.tuning_history, queue_pg.routes FROM PUBLIC;

-- When maintenance last ran the tuner (at most once a minute).
CREATE TABLE queue_pg.tuning_runs (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    at timestamptz
);
INSERT INTO queue_pg.tuning_runs DEFAULT VALUES;
REVOKE ALL ON queue_pg.tuning_runs FROM PUBLIC;

-- What tune returns: one queue looked at.
CREATE TYPE queue_pg.tuning_step AS (
    queue text,
    old_timeout double precision,
    new_timeout double precision,
    advice double precision,
    samples bigint,
    changed boolean,
    why text
);

-- What list_routes returns.
CREATE TYPE queue_pg.route_info AS (
    queue text,
    type text,
    target text,
    created_at timestamptz
);
