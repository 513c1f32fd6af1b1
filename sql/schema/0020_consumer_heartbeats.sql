-- Revision 0020: a consumer's liveness no longer rests on a backend alone. A pooler shares and
-- recycles backends, and a failover or restart leaves rows naming the pids of a server that is
-- gone; so a worker writes a heartbeat (`last_seen`, on the real clock, every second) and says
-- at registration whether its connection is a session of its own (`session`). The backend check
-- (pid, start, and the advisory lock held by that pid) is only a fast path, taken for a
-- session consumer on the server it registered on (`seen_on`: the server's identity, its system
-- identifier and postmaster start time); everywhere else the heartbeat's age decides.
-- `lost_on`: the server whose reap marked the consumer lost (a mark made elsewhere is made again).
ALTER TABLE queue_pg.consumers
    ADD COLUMN last_seen timestamptz,
    ADD COLUMN seen_on text,
    ADD COLUMN session boolean NOT NULL DEFAULT true,
    ADD COLUMN lost_on text;
-- `session` is new: registration takes a parameter (CREATE OR REPLACE cannot add one)
DROP FUNCTION IF EXISTS queue_pg.register_consumer(text, integer);
-- consumers registered before: sessions of this server, seen now (their workers' reaps go on)
UPDATE queue_pg.consumers
SET seen_on = (SELECT s.system_identifier FROM pg_catalog.pg_control_system() s)::text || '/'
              || extract(epoch FROM pg_catalog.pg_postmaster_start_time())::text,
    last_seen = clock_timestamp();
