-- queue_pg schema, revision 0001: queues, messages, history.
-- Tables only; functions and views live in sql/api and are re-applied after every upgrade.

CREATE SCHEMA IF NOT EXISTS queue_pg;

-- Secret for receipt MACs: a forged receipt is refused without a table lookup.
CREATE TABLE queue_pg.secret (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    key bytea NOT NULL DEFAULT decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex')
);
INSERT INTO queue_pg.secret DEFAULT VALUES;

CREATE TABLE queue_pg.queues (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9_-]{1,80}$'),
    visibility_timeout double precision NOT NULL DEFAULT 30,
    message_ttl double precision DEFAULT 345600,
    delay double precision NOT NULL DEFAULT 0,
    max_message_size integer NOT NULL DEFAULT 1048576,
    receive_wait double precision NOT NULL DEFAULT 0,
    max_lease double precision NOT NULL DEFAULT 43200,
    dead_letter_queue text REFERENCES queue_pg.queues (name),
    max_receive_count integer,
    in_flight_limit integer,
    history boolean NOT NULL DEFAULT true,
    history_retention double precision NOT NULL DEFAULT 604800,
    -- room for later issues (FIFO groups, dedup window, fair sharing, routing): jsonb of options
    -- that the functions ignore until the feature that reads them lands.
    options jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    CHECK ((dead_letter_queue IS NULL) = (max_receive_count IS NULL))
);

-- Only for queues with an in_flight_limit: an upper bound of received-not-deleted messages,
-- recounted exactly when it says the limit is reached (see receive).
CREATE TABLE queue_pg.in_flight (
    queue_id integer PRIMARY KEY REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    n bigint NOT NULL DEFAULT 0
);

CREATE TABLE queue_pg.messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id integer NOT NULL,
    visible_at timestamptz NOT NULL,
    expires_at timestamptz,
    enqueued_at timestamptz NOT NULL,
    receive_count integer NOT NULL DEFAULT 0,
    lease_no integer NOT NULL DEFAULT 0,
    lease_expiries integer NOT NULL DEFAULT 0,
    -- true while the lease was ended on purpose (visibility set to 0), so its return is no expiry
    released boolean NOT NULL DEFAULT false,
    first_received_at timestamptz,
    last_received_at timestamptz,
    source_queue_id integer,
    -- reserved for FIFO groups and deduplication (later issues)
    group_id text,
    dedup_id text,
    body jsonb NOT NULL,
    attributes jsonb
);

-- The claim index: a receive walks (queue_id, visible_at) up to now, so leased messages
-- (visible_at in the future) are never in its path however many there are.
CREATE INDEX messages_claim ON queue_pg.messages (queue_id, visible_at);
CREATE INDEX messages_expiry ON queue_pg.messages (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX messages_source ON queue_pg.messages (source_queue_id) WHERE source_queue_id IS NOT NULL;

-- A busy queue table must be vacuumed by row count, not by fraction of its size.
ALTER TABLE queue_pg.messages SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 20000,
    autovacuum_vacuum_cost_delay = 0
);

-- One row per finished message, partitioned by day of finished_at so old days drop as a whole.
-- What receive, peek and update_message return.
CREATE TYPE queue_pg.message AS (
    id bigint,
    queue text,
    body jsonb,
    attributes jsonb,
    receipt text,
    receive_count integer,
    enqueued_at timestamptz,
    first_received_at timestamptz,
    visible_until timestamptz,
    expires_at timestamptz
);

CREATE TABLE queue_pg.message_history (
    queue_id integer NOT NULL,
    queue text NOT NULL,
    message_id bigint NOT NULL,
    outcome text NOT NULL CHECK (outcome IN ('deleted', 'dead_lettered', 'expired', 'purged')),
    enqueued_at timestamptz NOT NULL,
    first_received_at timestamptz,
    last_received_at timestamptz,
    finished_at timestamptz NOT NULL,
    receive_count integer NOT NULL,
    lease_expiries integer NOT NULL,
    type text
) PARTITION BY RANGE (finished_at);

CREATE TABLE queue_pg.message_history_default PARTITION OF queue_pg.message_history DEFAULT;
CREATE INDEX message_history_queue ON queue_pg.message_history (queue_id, finished_at);
