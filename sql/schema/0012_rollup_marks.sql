-- Revision 0012: rollups wait for late-committing history rows. A minute is rolled up only once
-- every transaction that could still write a history row into it has ended (see
-- queue_pg._rollup_history): `safe` is the end of the minutes that may be rolled up; `mark` a
-- newer end waiting for the transactions in `mark_writers` (the virtual transaction ids that
-- held a write lock on queue_pg.message_history when the mark was taken, at `mark_taken` by the
-- queue clock) to end, or for the cap to pass.
ALTER TABLE queue_pg.history_rollup_state
    ADD COLUMN safe timestamptz,
    ADD COLUMN mark timestamptz,
    ADD COLUMN mark_taken timestamptz,
    ADD COLUMN mark_writers text[];

-- The tuner's own baseline of a queue's stale receipts (queue_pg._tune_step): the counter at a
-- step taken once the leases granted before the last change have all reported back, when no
-- sample of queue_stats that late exists yet; stale receipts after it are of leases granted
-- since the change. One row per queue, replaced.
CREATE TABLE queue_pg.tuning_marks (
    queue_id integer PRIMARY KEY REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    at timestamptz NOT NULL,
    stale_receipts bigint NOT NULL
);
REVOKE ALL ON queue_pg.tuning_marks FROM PUBLIC;
