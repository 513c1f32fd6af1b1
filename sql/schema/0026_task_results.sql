-- Revision 0026: task results (docs/jobs.md, "Results"). A task declared with store_result keeps
-- its return value (SUCCESS) or its last error (FAILURE) here for its result_ttl, written by the
-- worker in the transaction that deletes or dead-letters its message (queue_pg.complete_task,
-- queue_pg.fail_task), read with queue_pg.task_result, expired by queue_pg.sweep. Gone with
-- its queue; no grant to anyone: the functions are the only way in.
CREATE TABLE queue_pg.task_results (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    message_id bigint NOT NULL,
    status text NOT NULL CHECK (status IN ('SUCCESS', 'FAILURE')),
    result jsonb,
    error text,
    done_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_id, message_id)
);
CREATE INDEX task_results_expiry ON queue_pg.task_results (expires_at);
REVOKE ALL ON queue_pg.task_results FROM PUBLIC;
