-- Revision 0021: autovacuum by row count for what the queue churns through besides its heap.
--
-- messages' TOAST table holds the bodies (and attributes) that stay over ~2 kB once compressed;
-- every delete leaves their chunks dead. A TOAST table does not take its table's settings: it
-- keeps the server's defaults (vacuum once 20% of it is dead, with the cost delay), so with a
-- large backlog of large bodies the chunks of a million deleted messages could wait for a vacuum
-- that the heap (vacuumed every 5,000 dead rows, 0001) long had. Same thresholds as the heap.
ALTER TABLE queue_pg.messages SET (
    toast.autovacuum_vacuum_scale_factor = 0,
    toast.autovacuum_vacuum_threshold = 5000,
    toast.autovacuum_vacuum_insert_scale_factor = 0,
    toast.autovacuum_vacuum_insert_threshold = 20000,
    toast.autovacuum_vacuum_cost_delay = 0
);

-- dedup: a row per send with a deduplication id, deleted by sweep when its window ends: a queue
-- table of its own. 0009 set its vacuum by row count; it also needs no cost delay (a throttled
-- vacuum falls behind a busy queue) and analyze by row count (its expiry index drives the sweep).
ALTER TABLE queue_pg.dedup SET (
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 20000
);
