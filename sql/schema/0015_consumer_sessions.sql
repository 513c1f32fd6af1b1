-- Revision 0015: a consumer's session is its registering backend, known by pid and start time
-- (pg_stat_activity.backend_start, recorded here at registration; NULL where queue_pg's owner
-- may not read it). A reap compares the two with the running backends, so a clock that stepped
-- back between a backend's start and its registration cannot make a live consumer look gone.
ALTER TABLE queue_pg.consumers ADD COLUMN backend_start timestamptz;
