-- Signatures that later versions replaced. CREATE OR REPLACE cannot change a function's
-- parameters (it would add an overload and make calls ambiguous), so the old ones go first;
-- helpers nothing calls any more go too.
DROP FUNCTION IF EXISTS queue_pg._relet(queue_pg.queues, text, double precision, jsonb, text);
DROP FUNCTION IF EXISTS queue_pg.change_visibility(text, text, double precision);
DROP FUNCTION IF EXISTS queue_pg.update_message(text, text, jsonb, double precision);
DROP FUNCTION IF EXISTS queue_pg._receive(text, integer, double precision, double precision, boolean);
DROP FUNCTION IF EXISTS queue_pg.receive(text, integer, double precision, double precision);
DROP FUNCTION IF EXISTS queue_pg.send(text, jsonb, double precision, double precision, jsonb);
DROP FUNCTION IF EXISTS queue_pg.send_batch(text, jsonb[], double precision, double precision, jsonb[]);
DROP FUNCTION IF EXISTS queue_pg._create_claim_sequences(integer);
DROP FUNCTION IF EXISTS queue_pg._history_rows(queue_pg.queues, queue_pg.messages[], text, timestamptz);
DROP FUNCTION IF EXISTS queue_pg._check_ttl(double precision);
DROP FUNCTION IF EXISTS queue_pg._channel(integer);
DROP FUNCTION IF EXISTS queue_pg._claim(queue_pg.queues, integer, double precision, boolean);
-- revision 0013 (consumers): receive's, _receive's and _claim's `consumer`
DROP FUNCTION IF EXISTS queue_pg._receive(text, integer, double precision, double precision, boolean, text[]);
DROP FUNCTION IF EXISTS queue_pg.receive(text, integer, double precision, double precision, text[]);
DROP FUNCTION IF EXISTS queue_pg._claim(queue_pg.queues, integer, double precision, boolean, boolean);
DROP FUNCTION IF EXISTS queue_pg._history_maintenance(timestamptz, integer);
-- revision 0020 (consumer heartbeats): register_consumer's `session`
DROP FUNCTION IF EXISTS queue_pg.register_consumer(text, integer);
DROP FUNCTION IF EXISTS queue_pg._unfit(integer, jsonb, jsonb);
DROP FUNCTION IF EXISTS queue_pg._counter(text, integer);
DROP FUNCTION IF EXISTS queue_pg._count(text, integer, bigint);
-- revisions 0008 (FIFO and fair queues: settings fifo, fair; send's and send_batch's "group") and
-- 0009 (deduplication: send's dedup_id, send_batch's dedup_ids, settings content_dedup,
-- dedup_window): the signatures before both, and those with only one of them
DROP FUNCTION IF EXISTS queue_pg.send(text, jsonb, double precision, double precision, jsonb, boolean);
DROP FUNCTION IF EXISTS queue_pg.send_batch(text, jsonb[], double precision, double precision, jsonb[], boolean);
DROP FUNCTION IF EXISTS queue_pg.send(text, jsonb, double precision, double precision, jsonb, boolean, text);
DROP FUNCTION IF EXISTS queue_pg.send_batch(text, jsonb[], double precision, double precision, jsonb[], boolean, text[]);
DROP FUNCTION IF EXISTS queue_pg.create_queue(text, double precision, double precision, double precision,
    integer, double precision, double precision, text, integer, integer, boolean, double precision);
DROP FUNCTION IF EXISTS queue_pg.alter_queue(text, double precision, double precision, double precision,
    integer, double precision, double precision, text, integer, integer, boolean, double precision, text[]);
DROP FUNCTION IF EXISTS queue_pg.create_queue(text, double precision, double precision, double precision,
    integer, double precision, double precision, text, integer, integer, boolean, double precision, boolean, boolean);
DROP FUNCTION IF EXISTS queue_pg.alter_queue(text, double precision, double precision, double precision,
    integer, double precision, double precision, text, integer, integer, boolean, double precision, boolean, boolean, text[]);
DROP FUNCTION IF EXISTS queue_pg.create_queue(text, double precision, double precision, double precision,
    integer, double precision, double precision, text, integer, integer, boolean, double precision, boolean, double precision);
DROP FUNCTION IF EXISTS queue_pg.alter_queue(text, double precision, double precision, double precision,
    integer, double precision, double precision, text, integer, integer, boolean, double precision, boolean, double precision, text[]);
DROP FUNCTION IF EXISTS queue_pg._history_partitions(timestamptz, double precision);
-- the SQS endpoint's MessageDeduplicationId: _fifo_send keeps each message's dedup id
DROP FUNCTION IF EXISTS queue_pg._fifo_send(queue_pg.queues, jsonb[], jsonb[], text[], timestamptz,
    double precision, bigint[]);
-- the bulk path sends through _send_rows (send_batch's rules), which names a bad row itself
DROP FUNCTION IF EXISTS queue_pg._refuse_staged(queue_pg.queues, jsonb, jsonb, tid);
-- flow counts are _count_flow's (plpgsql assignments, no statement)
DROP FUNCTION IF EXISTS queue_pg._tally(text, bigint);
-- sweep's scope (a limited role sweeps its own queues only)
DROP FUNCTION IF EXISTS queue_pg._maintain(timestamptz);
DROP FUNCTION IF EXISTS queue_pg._forget_writes(integer);
DROP FUNCTION IF EXISTS queue_pg._forget_dedup(timestamptz, integer);
-- a schedule's name is its queue's (revision 0014): dropping one names the queue
DROP FUNCTION IF EXISTS queue_pg.drop_schedule(text);
-- redrive_message: _move_back's `ids`
DROP FUNCTION IF EXISTS queue_pg._move_back(integer, integer, bigint, timestamptz, timestamptz);
-- _diagnose's unused receipt, and the lease token of relaxed receipts
DROP FUNCTION IF EXISTS queue_pg._diagnose(queue_pg.queues, text, bigint, integer);
DROP FUNCTION IF EXISTS queue_pg._diagnose(queue_pg.queues, bigint, integer);
-- history rows carry a weight (revision 0022)
DROP FUNCTION IF EXISTS queue_pg._history_row(queue_pg.queues, queue_pg.messages, text, timestamptz);
-- revision 0022: create_queue's and alter_queue's lease_durability; receipts that carry a lease token
DROP FUNCTION IF EXISTS queue_pg.create_queue(text, double precision, double precision, double precision,
    integer, double precision, double precision, text, integer, integer, boolean, double precision, boolean,
    boolean, boolean, double precision);
DROP FUNCTION IF EXISTS queue_pg.alter_queue(text, double precision, double precision, double precision,
    integer, double precision, double precision, text, integer, integer, boolean, double precision, boolean,
    boolean, boolean, double precision, text[]);
DROP FUNCTION IF EXISTS queue_pg._current_lease(bigint, integer, integer, timestamptz, integer, bigint,
    integer, timestamptz);
-- stats's exact (counts past _exact_up_to() estimated unless exact)
DROP FUNCTION IF EXISTS queue_pg.stats(text);
-- revision 0023 (duplicate budget): alter_tuning's `duplicate_budget`
DROP FUNCTION IF EXISTS queue_pg.alter_tuning(text, text, boolean, double precision, double precision, text[]);
-- issue 35 (revoke a running job): cancel_message's `terminate`
DROP FUNCTION IF EXISTS queue_pg.cancel_message(text, bigint);
-- revision 0029 (sealed endpoint secrets): the key makers that made the secret in SQL
DROP FUNCTION IF EXISTS queue_pg.sqs_create_key(name);
DROP FUNCTION IF EXISTS queue_pg.azure_create_key(name, text);
