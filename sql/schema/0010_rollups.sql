-- Revision 0010: rollups of the history by minute and by hour, so that the advice over a day
-- reads about 24 hour rows and at most 118 minute rows per queue and type instead of every
-- history row of the day.
-- One row per queue, type and minute (minutes = 1) or hour (minutes = 60) of finished_at,
-- starting at `start`: the counts the figures need, the exact
-- minimum and maximum, and histograms of processing and waiting time over fixed log-spaced
-- buckets (queue_pg._bucket: 2% wide, so a quantile read from them is within 1% of the exact
-- one), kept sparse as parallel arrays of bucket numbers and counts.
CREATE TABLE queue_pg.history_rollups (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    minutes smallint NOT NULL CHECK (minutes IN (1, 60)),
    start timestamptz NOT NULL,
    type text,
    messages bigint NOT NULL,
    receives bigint NOT NULL,
    lease_expiries bigint NOT NULL,
    dead_lettered bigint NOT NULL,
    redeliveries bigint NOT NULL,
    work_min double precision,
    work_max double precision,
    work_buckets smallint[] NOT NULL,
    work_counts integer[] NOT NULL,
    wait_min double precision,
    wait_max double precision,
    wait_buckets smallint[] NOT NULL,
    wait_counts integer[] NOT NULL
);
CREATE INDEX history_rollups_queue ON queue_pg.history_rollups (queue_id, minutes, start);

-- The minutes [lo, hi) the minute rows cover: every history row that finished in them and was
-- committed before its minute was rolled up (at least a minute after the minute ended) is in
-- them; hour rows cover the whole hours from lo up to hours_hi. NULL: nothing rolled up yet.
-- One row; sweep holds it while it rolls up.
CREATE TABLE queue_pg.history_rollup_state (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    lo timestamptz,
    hi timestamptz,
    hours_hi timestamptz
);
INSERT INTO queue_pg.history_rollup_state DEFAULT VALUES;

REVOKE ALL ON queue_pg.history_rollups, queue_pg.history_rollup_state FROM PUBLIC;
