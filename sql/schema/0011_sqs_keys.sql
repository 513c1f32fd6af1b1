-- Revision 0011: access keys of the SQS endpoint (queue_pg.sqs). SigV4 signs with the secret
-- itself, so the server must read it back: it is kept here, readable by the schema owner only
-- (no grant to anyone; the endpoint connects as the owner and SET ROLEs to the key's role per
-- request). A revoked key keeps its row (revoked_at) so its id is never handed out again.
CREATE TABLE queue_pg.sqs_keys (
    access_key text PRIMARY KEY CHECK (access_key ~ '^[A-Z0-9]{16,128}$'),
    secret_key text NOT NULL CHECK (length(secret_key) >= 32),
    role name NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at timestamptz
);
REVOKE ALL ON queue_pg.sqs_keys FROM PUBLIC;

-- SQS queue tags (TagQueue / UntagQueue / ListQueueTags): at most 50 a queue, keys of 1 - 128
-- and values of up to 256 characters, as SQS (sql/api/59_sqs.sql checks them).
CREATE TABLE queue_pg.queue_tags (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    key text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (queue_id, key)
);
REVOKE ALL ON queue_pg.queue_tags FROM PUBLIC;
