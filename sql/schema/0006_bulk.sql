-- Revision 0006: bulk sends that happen once.
-- A bulk writer (a Spark task) sends a chunk of rows under a key: the writing role, a write_id
-- of its choosing, the partition and the chunk within it. The key is recorded in the transaction
-- that sends the chunk, so a retried, duplicated or re-run writer finds it and sends nothing
-- (for as long as the queue keeps its history: a run after that is a new write).
-- The writer is part of the key: a role that may send to the queue cannot claim, and so
-- suppress, another role's writes by guessing their write_id.
CREATE TABLE queue_pg.bulk_writes (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    writer oid NOT NULL,
    write_id text NOT NULL,
    part integer NOT NULL,
    chunk integer NOT NULL,
    messages bigint NOT NULL DEFAULT 0,
    written_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    PRIMARY KEY (queue_id, writer, write_id, part, chunk)
);
-- The sweep forgets keys older than their queue's history_retention (queue_pg._forget_writes).
CREATE INDEX bulk_writes_written ON queue_pg.bulk_writes (written_at);
REVOKE ALL ON queue_pg.bulk_writes FROM PUBLIC;
