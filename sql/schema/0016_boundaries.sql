-- Revision 0016: a redrive task remembers the role that started it. Whoever advances the task
-- (a sweep of the owner, a redrive_step of another manager) moves only messages into queues that
-- role may send to, as a synchronous redrive moves only where its caller may send.
ALTER TABLE queue_pg.redrive_tasks ADD COLUMN started_by oid;
