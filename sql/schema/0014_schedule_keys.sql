-- Revision 0014: a schedule's name belongs to its queue. Schedules are keyed by (queue, name),
-- so a role that manages one queue can neither take a name another queue's tasks register nor
-- learn which queue holds a name it cannot see.
ALTER TABLE queue_pg.periodic DROP CONSTRAINT periodic_pkey;
ALTER TABLE queue_pg.periodic ADD CONSTRAINT periodic_pkey PRIMARY KEY (queue_id, name);
