-- Revision 0023: a queue's duplicate budget, the share of deliveries it accepts to see leased
-- twice because a live run outlasted its lease. Per-type leases are the processing-time
-- quantile 1 - duplicate_budget of the type's recent history (56_budget.sql): the input is the
-- risk itself, and leases of equal risk are compared by how fast they recover hung work.
-- Default 1e-6: one duplicate per million deliveries, below the rate at which consumers crash
-- in practice (every crash is a redelivery anyway), so at-least-once consumers see no new kind
-- of duplicate while a hung run is recovered at the tail's quantile, not at 6 x p99.
ALTER TABLE queue_pg.queues
    ADD COLUMN duplicate_budget double precision NOT NULL DEFAULT 1e-6
        CHECK (duplicate_budget >= 1e-9 AND duplicate_budget <= 0.01);
