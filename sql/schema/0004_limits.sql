-- Revision 0004: the sweep's lock.
-- Partition upkeep runs one sweep at a time. It was an advisory lock, whose key any role that
-- can connect may take (and so stop every sweep); a row lock on a table no other role may read
-- or lock serves instead (SELECT ... FOR UPDATE SKIP LOCKED, inside the owner's functions).
CREATE TABLE queue_pg.sweeper (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton)
);
INSERT INTO queue_pg.sweeper DEFAULT VALUES;
REVOKE ALL ON queue_pg.sweeper FROM PUBLIC;
