-- Revision 0019: what the SQS endpoint keeps of a queue beside queue_pg's settings (docs/sqs.md):
-- the attributes SQS stores and returns that queue_pg does not act on (Policy, the KMS ones,
-- a FIFO queue's DeduplicationScope and FifoThroughputLimit), and the permissions of
-- AddPermission, each a label with the grants it made (sql/api/59_sqs.sql).
CREATE TABLE queue_pg.sqs_queue_attributes (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    name text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (queue_id, name)
);
REVOKE ALL ON queue_pg.sqs_queue_attributes FROM PUBLIC;

CREATE TABLE queue_pg.sqs_permissions (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    label text NOT NULL,
    principals text[] NOT NULL,
    actions text[] NOT NULL,
    -- the (role, privilege) pairs this label granted (those that were not granted before)
    granted jsonb NOT NULL DEFAULT '[]',
    PRIMARY KEY (queue_id, label)
);
REVOKE ALL ON queue_pg.sqs_permissions FROM PUBLIC;
