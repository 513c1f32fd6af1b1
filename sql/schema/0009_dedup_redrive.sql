-- Revision 0009: deduplication and dead-letter redrive tasks.

ALTER TABLE queue_pg.queues
    -- a send without dedup_id takes the SHA-256 of its body's JSON text as its id
    ADD COLUMN content_dedup boolean NOT NULL DEFAULT false,
    -- seconds a dedup id is remembered after the send that first used it
    ADD COLUMN dedup_window double precision NOT NULL DEFAULT 300;

-- The dedup ids sent in the last dedup_window of each queue, and the message each one made.
-- Only sends that carry an id (or a content_dedup queue's sends) touch it. No foreign key: a
-- key-share lock on the queue row per send would make every dedup send of a queue write the same
-- row's multixact; queue ids are never reused, and a dropped queue's entries expire like others.
-- Expired entries are deleted by the sweep (in bounded batches, by dedup_expiry) or overwritten
-- by the next send of their id.
CREATE TABLE queue_pg.dedup (
    queue_id integer NOT NULL,
    dedup_id text NOT NULL,
    message_id bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_id, dedup_id)
);
CREATE INDEX dedup_expiry ON queue_pg.dedup (expires_at);
ALTER TABLE queue_pg.dedup SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000
);

-- Redrive tasks (SQS message move tasks): state in a table, advanced by queue_pg.redrive_step
-- (called by sweep), so a task goes on whoever restarts. One running task per dead-letter queue.
CREATE TABLE queue_pg.redrive_tasks (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    dlq_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    -- where the messages go; NULL: back to the queue each came from. No foreign key: a dropped
    -- target fails the task at its next step instead of deleting it.
    target_id integer,
    target text,
    rate double precision,  -- messages per second at most; NULL: as fast as the steps go
    status text NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'completed', 'cancelled', 'failed')),
    to_move bigint NOT NULL,
    moved bigint NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL,  -- messages dead-lettered after it are not the task's
    updated_at timestamptz NOT NULL,
    finished_at timestamptz,
    error text
);
CREATE UNIQUE INDEX redrive_tasks_running ON queue_pg.redrive_tasks (dlq_id) WHERE status = 'running';
CREATE INDEX redrive_tasks_dlq ON queue_pg.redrive_tasks (dlq_id, id);

-- What start_redrive, list_redrives and cancel_redrive return.
CREATE TYPE queue_pg.redrive_task AS (
    id bigint,
    dlq text,
    target text,
    rate double precision,
    status text,
    moved bigint,
    to_move bigint,
    started_at timestamptz,
    updated_at timestamptz,
    finished_at timestamptz,
    error text
);

REVOKE ALL ON queue_pg.dedup, queue_pg.redrive_tasks FROM PUBLIC;
