-- Revision 0008: FIFO queues and fair queues.
-- fifo: messages carry a group; within a group, one message at a time is deliverable (the group's
-- head) and the rest wait, in send order, with visible_at = 'infinity': the claim index never
-- reaches them, so a receive stays a walk of the claim index from its floor, O(batch), however
-- many groups wait. Removing the head (delete, expiry, purge, dead letter) makes the next one
-- visible (queue_pg._fifo_advance). Fixed at create: a queue's messages cannot change kind.
-- fair: on a standard queue, the group names a tenant, and receive serves the tenants with the
-- fewest messages in flight first (queue_pg._fair_claim).
ALTER TABLE queue_pg.queues
    ADD COLUMN fifo boolean NOT NULL DEFAULT false,
    ADD COLUMN fair boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT queues_fifo_fair_check CHECK (NOT (fifo AND fair));

-- One row per non-empty group of a FIFO queue: the lock that orders a group's sends against the
-- removal of its head, and which message the head is.
CREATE TABLE queue_pg.fifo_groups (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    group_id text NOT NULL,
    head bigint,
    PRIMARY KEY (queue_id, group_id)
);
REVOKE ALL ON queue_pg.fifo_groups FROM PUBLIC;

-- A group's messages by state and age: the next waiting message of a FIFO group (visible_at =
-- 'infinity', lowest id), a tenant's oldest visible messages and its count in flight (fair).
-- Partial: messages without a group (every message of a plain queue) cost it nothing.
CREATE INDEX messages_group ON queue_pg.messages (queue_id, group_id, visible_at, id)
    WHERE group_id IS NOT NULL;
