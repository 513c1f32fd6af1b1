-- Signatures that later versions replaced. CREATE OR REPLACE cannot change a function's
-- parameters (it would add an overload and make calls ambiguous), so the old ones go first.
DROP FUNCTION IF EXISTS queue_pg._relet(queue_pg.queues, text, double precision, jsonb, text);
DROP FUNCTION IF EXISTS queue_pg.change_visibility(text, text, double precision);
DROP FUNCTION IF EXISTS queue_pg.update_message(text, text, jsonb, double precision);
