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
