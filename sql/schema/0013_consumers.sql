-- Consumers that can be seen to die. A worker registers on a connection it keeps for its whole
-- life and holds a session advisory lock there (class queue_pg._consumer_space(), key its id);
-- its receives record that id in the messages they lease. A consumer whose lock is free has lost
-- its session (the process crashed, was killed, or its host went away): queue_pg.reap_consumers
-- ends its leases then, instead of when they lapse.
CREATE TABLE queue_pg.consumers (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    role text NOT NULL,                 -- who registered it (adopting it needs the same)
    pid integer NOT NULL,               -- the registering session's backend
    name text,                          -- what the worker calls itself (host:pid)
    registered_at timestamptz NOT NULL,
    lost_at timestamptz,                -- when a reap first found its lock free
    -- the queues its receives named it on (added at the first one of each): a reap looks for
    -- a lost consumer's leases there only, so what a consumer costs a reap is bounded by the
    -- queues it may receive from
    queue_ids integer[] NOT NULL DEFAULT '{}'
);

-- The consumer whose receive leased the message (NULL: a receive that named none). No index:
-- a reap looks for a lost consumer's messages among the leased ones (the claim index, visible_at
-- in the future), once per crash, and the lease UPDATE of every receive stays as it was.
ALTER TABLE queue_pg.messages ADD COLUMN consumer_id integer;
