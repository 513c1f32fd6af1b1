-- Revision 0022: the cost of the core cycle.
--
-- History of busy queues is a sample. A finished message's history row carries
-- its weight, the number of finished messages it stands for (1: every message kept); every
-- figure drawn from the history counts a row as `weight` messages. history_sampling says, per
-- queue and type ('' for messages without one), that one deleted message in `every` is kept:
-- sweep sets it from the last minute's rate (queue_pg._history_sampling), and a queue-type
-- without a row keeps every message.
ALTER TABLE queue_pg.message_history ADD COLUMN weight integer NOT NULL DEFAULT 1;

CREATE TABLE queue_pg.history_sampling (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    type text NOT NULL,
    every integer NOT NULL CHECK (every >= 2),
    PRIMARY KEY (queue_id, type)
);

REVOKE ALL ON queue_pg.history_sampling FROM PUBLIC;

-- Relaxed lease durability, on request per queue: a receive that owns its transaction commits
-- without waiting for the WAL flush; its receipts carry a lease token (the server's start and
-- the lease's receive time) so that no receipt of a lease a crash lost can pass (sql/api/00_util.sql).
ALTER TABLE queue_pg.queues ADD COLUMN lease_durability text NOT NULL DEFAULT 'durable';
