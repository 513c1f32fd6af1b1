-- Helpers shared by every function: the clock, errors, validation, receipts.

-- The server's clock. clock_timestamp, not now(): a long poll and a long transaction must see
-- time go on. The setting queue_pg.time_offset (an interval) moves it, so tests and the model
-- checker can make time pass; only for a superuser or a member of the owner's role, since what a
-- session writes with its clock (leases, delays, expiries) is everyone's: for any other caller a
-- non-empty offset, from SET or from a role's or database's default, is refused (_offset_now).
-- _now is what the functions use: a one-expression sql function, inlined where it is called; the
-- unset case costs one current_setting and calls no plpgsql. now() is the entry point for callers
-- (and the view); plpgsql, because a SECURITY DEFINER sql function is planned anew on every call.
-- Whether the caller is a superuser or has the owner's privileges (current_user, inside the
-- SECURITY DEFINER entry points): who may move the clock and run partition DDL.
CREATE OR REPLACE FUNCTION queue_pg._is_owner() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN current_setting('is_superuser') = 'on' OR pg_has_role(queue_pg._caller(), current_user, 'USAGE');
END $$;

CREATE OR REPLACE FUNCTION queue_pg._offset_now() RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    offset_text text := current_setting('queue_pg.time_offset', true);
    shift interval;
BEGIN
    IF NOT queue_pg._is_owner() THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('queue_pg.time_offset = %s is refused: only a superuser or a member of role %s may move the queue clock',
                             quote_literal(left(offset_text, 100)), quote_ident(current_user)),
            HINT = 'RESET queue_pg.time_offset (and ALTER ROLE ... RESET queue_pg.time_offset if a role or database default sets it)';
    END IF;
    BEGIN
        shift := offset_text::interval;
    EXCEPTION WHEN data_exception THEN
        shift := NULL;
    END;
    IF shift IS NULL OR shift > interval '100 years' OR shift < interval '-100 years' THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('queue_pg.time_offset = %s is invalid: allowed an interval from -100 years to 100 years',
                             quote_literal(left(offset_text, 100)));
    END IF;
    RETURN clock_timestamp() + shift;
END $$;

CREATE OR REPLACE FUNCTION queue_pg._now() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT CASE WHEN coalesce(current_setting('queue_pg.time_offset', true), '') = ''
                THEN clock_timestamp() ELSE queue_pg._offset_now() END
$$;

CREATE OR REPLACE FUNCTION queue_pg.now() RETURNS timestamptz
LANGUAGE plpgsql VOLATILE PARALLEL SAFE AS $$
BEGIN
    RETURN queue_pg._now();
END $$;

CREATE OR REPLACE FUNCTION queue_pg._raise(code text, msg text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg;
END $$;

-- A value a user chose, for an error message: quoted, control characters shown as '?', its first
-- 100 characters.
CREATE OR REPLACE FUNCTION queue_pg._shown(v text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT quote_literal(left(regexp_replace(v, '[[:cntrl:]]', '?', 'g'), 100)) $$;

-- Seconds as text without float noise: 30 -> '30', 0.5 -> '0.5'.
CREATE OR REPLACE FUNCTION queue_pg._fmt(v double precision) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT CASE WHEN v IS NULL THEN 'NULL' ELSE v::numeric::text END $$;

-- Refuses NaN, infinities and values outside [lo, hi]; the message names parameter, value, range.
-- The test is a one-expression sql function, inlined into its caller's expression (a plpgsql
-- call of its own cost each entry point a few µs per check, and more on an idle server whose
-- caches went cold: see docs/design.md, "Latency"); only a refusal calls plpgsql, to raise.
CREATE OR REPLACE FUNCTION queue_pg._out_of_range(param text, v double precision, lo double precision,
                                                  hi double precision, unit text)
RETURNS double precision
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'QP003',
        MESSAGE = format('%s = %s is out of range: allowed %s to %s %s', param,
                         coalesce(v::text, 'NULL'), queue_pg._fmt(lo), queue_pg._fmt(hi), unit);
END $$;

CREATE OR REPLACE FUNCTION queue_pg._check(param text, v double precision, lo double precision,
                                           hi double precision, unit text DEFAULT 'seconds')
RETURNS double precision
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN v IS NULL OR v = 'NaN'::float8 OR v < lo OR v > hi
                THEN queue_pg._out_of_range(param, v, lo, hi, unit) ELSE v END
$$;

-- Refuses a value outside a fixed set of words (NULL too); the message names the parameter, the
-- value (its first 100 characters) and the words allowed. The one wording of every such check.
CREATE OR REPLACE FUNCTION queue_pg._check_choice(param text, v text, allowed text[],
                                                  code text DEFAULT 'QP003') RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF v IS NULL OR NOT v = ANY (allowed) THEN
        RAISE EXCEPTION USING ERRCODE = code,
            MESSAGE = format('%s = %s is invalid: allowed %s', param,
                             coalesce(quote_literal(left(v, 100)), 'NULL'), array_to_string(allowed, ', '));
    END IF;
    RETURN v;
END $$;

-- An interval setting of the database or a role (`setting`, e.g. queue_pg.tune_interval)
-- within [lo, hi]; unset, empty, malformed or out of range: `fallback`, so no session can push
-- it past its bounds.
CREATE OR REPLACE FUNCTION queue_pg._interval_setting(setting text, lo interval, hi interval,
                                                      fallback interval) RETURNS interval
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v interval;
BEGIN
    BEGIN
        v := nullif(current_setting(setting, true), '')::interval;
    EXCEPTION WHEN data_exception OR syntax_error THEN
        v := NULL;
    END;
    IF v IS NULL OR v < lo OR v > hi THEN
        RETURN fallback;
    END IF;
    RETURN v;
END $$;

-- Bounds named once; IMMUTABLE one-line sql functions, folded to constants where they are used.
-- The longest lease, visibility timeout and delay: 7 days (Azure's longest visibility timeout).
CREATE OR REPLACE FUNCTION queue_pg._max_lease_cap() RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 604800::float8 $$;

-- The longest time-to-live and history retention: 100 years, in seconds.
CREATE OR REPLACE FUNCTION queue_pg._max_ttl() RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 3153600000::float8 $$;

-- The longest history retention a manager of a queue (not an admin) may set: 30 days.
CREATE OR REPLACE FUNCTION queue_pg._manager_retention_cap() RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 2592000::float8 $$;

CREATE OR REPLACE FUNCTION queue_pg._seconds(v double precision) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT make_interval(secs => v) $$;

-- Timestamps as microseconds since 1970 and back, exactly: the claim floor lives in a sequence.
-- Helpers here are declared with their body's true volatility (extract and timestamptz + interval
-- are STABLE), because PostgreSQL inlines a sql function only then; otherwise every use is a
-- function call of its own (measured: 20 µs each).
CREATE OR REPLACE FUNCTION queue_pg._micros(t timestamptz) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT (extract(epoch FROM t) * 1000000)::bigint $$;

CREATE OR REPLACE FUNCTION queue_pg._from_micros(v bigint) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT timestamptz 'epoch' + v::float8 * interval '1 microsecond'
$$;

-- The queue row by name, or QueueNotFound.
CREATE OR REPLACE FUNCTION queue_pg._queue(name text) RETURNS queue_pg.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q queue_pg.queues;
BEGIN
    SELECT * INTO q FROM queue_pg.queues WHERE queues.name = _queue.name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'QP001',
            MESSAGE = format('queue %s does not exist', coalesce(quote_literal(left(name, 100)), 'NULL'));
    END IF;
    RETURN q;
END $$;

-- The queue row by name for a caller who needs `need` ('send', 'receive' or 'manage') on it:
-- QueueNotFound, else AccessDenied (the rule is queue_pg._denied, sql/api/60_access.sql). A
-- superuser, the usual owner, skips the call: this runs at the start of every operation.
CREATE OR REPLACE FUNCTION queue_pg._queue(name text, need text) RETURNS queue_pg.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q queue_pg.queues;
BEGIN
    SELECT * INTO q FROM queue_pg.queues WHERE queues.name = _queue.name;
    IF NOT FOUND THEN
        PERFORM queue_pg._queue(name);  -- QueueNotFound
    END IF;
    IF current_setting('is_superuser') <> 'on' THEN
        PERFORM queue_pg._authorize(q.id, q.name, need);
    END IF;
    RETURN q;
END $$;

-- LISTEN channel of a queue; send notifies it when a message is visible at once. Any role that
-- can connect may NOTIFY any channel it can name, so the name carries a MAC of the queue id
-- with the install's secret: only a role that may receive from the queue learns it (channel()).
-- Callers pass the key in a variable: a function call as `key` (used twice) stops the inlining.
CREATE OR REPLACE FUNCTION queue_pg._channel(queue_id integer, key bytea) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT 'queue_pg_' || queue_id || '_'
           || left(encode(sha256(key || textsend('channel.' || queue_id::text) || key), 'hex'), 16)
$$;

CREATE OR REPLACE FUNCTION queue_pg.channel(queue text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    key bytea;
BEGIN
    key := queue_pg._key();
    RETURN queue_pg._channel((queue_pg._queue(queue, 'receive')).id, key);
END $$;

-- The per-queue sequence of a kind (queue_pg._sequence_kinds()). Sequences serve what must not
-- roll back (a refused receipt raises, and the refusal must still be counted) and what changes too
-- often for a row (the claim floor, the last NOTIFY): they leave no row versions behind.
CREATE OR REPLACE FUNCTION queue_pg._sequence(kind text, queue_id integer) RETURNS regclass
LANGUAGE sql STABLE AS $$ SELECT format('queue_pg.%s_%s', kind, queue_id)::regclass $$;

-- Counts n events in the queue's sequence of a kind (stale_receipts): a count no rollback undoes.
CREATE OR REPLACE FUNCTION queue_pg._advance(kind text, queue_id integer, n bigint DEFAULT 1)
RETURNS void LANGUAGE sql AS $$
    SELECT count(nextval(queue_pg._sequence(kind, queue_id))) FROM generate_series(1, n)
$$;

-- Called as its reader by the queue_stats view of revisions before 0005 (a downgrade makes that
-- view again): a SECURITY DEFINER entry point (sql/api/60_access.sql), so it reads only these
-- two kinds of counter, of queues the caller may see (NULL for the others and unknown ids).
CREATE OR REPLACE FUNCTION queue_pg._stat_counter(kind text, queue_id integer) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM queue_pg.queues q WHERE q.id = _stat_counter.queue_id)
       OR NOT queue_pg._sees(queue_id) THEN
        RETURN NULL;
    END IF;
    IF kind = 'lease_expiries' THEN  -- a table row: it rolls back with the receive
        RETURN coalesce((SELECT c.lease_expiries FROM queue_pg.queue_counters c
                         WHERE c.queue_id = _stat_counter.queue_id), 0);
    ELSIF kind <> 'stale_receipts' THEN
        RETURN NULL;
    END IF;
    RETURN coalesce(pg_sequence_last_value(queue_pg._sequence(kind, queue_id)), 0);
END $$;

-- Receipt: '<queue_id>.<message_id>.<lease_no>.<mac>', and on a queue with lease_durability
-- 'relaxed' '<queue_id>.<message_id>.<lease_no>.<token>.<mac>'. The MAC (keyed SHA-256 with the
-- install's secret, 64 bits, over the fields before it) makes a forged or altered receipt
-- detectable without looking the message up. STABLE like convert_to, so that it is inlined where
-- it is used. The signatures before the token go first (a new parameter would be an overload).
DROP FUNCTION IF EXISTS queue_pg._mac(integer, bigint, integer, bytea);
DROP FUNCTION IF EXISTS queue_pg._receipt(integer, bigint, integer, bytea);
DROP FUNCTION IF EXISTS queue_pg._parse_receipt(integer, text, bytea);
DROP FUNCTION IF EXISTS queue_pg._parse_receipts(integer, text[], bytea);
-- The MAC of a receipt's text before it (its fields joined with '.'): the one rule, used to make
-- receipts and to check them. convert_to, not textsend: the same bytes for a receipt's ASCII
-- fields, but no conversion to the client's encoding, so hashing a caller's text (a forged
-- receipt, checked before any cast) can never raise.
CREATE OR REPLACE FUNCTION queue_pg._mac_of(fields text, key bytea)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT left(encode(sha256(key || convert_to(fields, 'UTF8') || key), 'hex'), 16)
$$;

CREATE OR REPLACE FUNCTION queue_pg._mac(queue_id integer, id bigint, lease_no integer, key bytea,
                                         token text DEFAULT NULL)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT queue_pg._mac_of(queue_id::text || '.' || id::text || '.' || lease_no::text
                            || coalesce('.' || token, ''), key)
$$;

-- The lease token of a relaxed queue's receipt: 12 hex characters of the server's start time
-- and the lease's receive time (the message's last_received_at). A relaxed receive's commit
-- may be lost by a crash, and the same lease number then granted again; its new lease has
-- another receive time, and a restarted server another start time, so a receipt of the lost
-- lease (or of any lease from before the restart) does not match: StaleReceipt. No clock is
-- compared, only equality. md5 is only a compact digest here: the MAC covers the token.
CREATE OR REPLACE FUNCTION queue_pg._lease_token(received_at timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT left(md5(queue_pg._micros(pg_postmaster_start_time())::text || '.'
                    || queue_pg._micros(received_at)::text), 12)
$$;

CREATE OR REPLACE FUNCTION queue_pg._receipt(queue_id integer, id bigint, lease_no integer, key bytea,
                                             token text DEFAULT NULL)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT queue_id::text || '.' || id::text || '.' || lease_no::text || coalesce('.' || token, '') || '.'
           || queue_pg._mac(queue_id, id, lease_no, key, token)
$$;

-- plpgsql: its query is planned once per session (a sql function with a FROM is run anew each call).
CREATE OR REPLACE FUNCTION queue_pg._key() RETURNS bytea
LANGUAGE plpgsql STABLE AS $$ BEGIN RETURN (SELECT s.key FROM queue_pg.secret s); END $$;

-- Parses a receipt for queue q; (NULL, NULL) when it is malformed, forged or another queue's.
-- token: the lease token of a relaxed queue's receipt (NULL in a four-field receipt).
CREATE OR REPLACE FUNCTION queue_pg._parse_receipts(q_id integer, receipts text[], key bytea)
RETURNS TABLE (i bigint, id bigint, lease_no integer, token text)
LANGUAGE sql STABLE AS $$
    -- Set-based and inlinable (a batch parses in one pass). The MAC covers the receipt's whole
    -- text before it, so a receipt is checked as text, before any cast: one whose MAC matches
    -- is one _receipt made (its numbers well formed, without leading zeros), and only then are
    -- its fields cast; a malformed one fails the MAC. The length bound caps the hashing; the
    -- queue's field is compared as text first (another queue's receipt costs no hash). No
    -- regular expressions and no array: 5 µs a receipt before, 2 now. OFFSET 0 keeps the text
    -- before the MAC a subquery of its own (pulled up, it was computed once per reference).
    SELECT u.i, split_part(x.f, '.', 2)::bigint, split_part(x.f, '.', 3)::integer,
           nullif(split_part(x.f, '.', 4), '')
    FROM unnest(receipts) WITH ORDINALITY AS u(r, i)
    CROSS JOIN LATERAL (SELECT left(u.r, -17) AS f OFFSET 0) x
    WHERE CASE WHEN length(u.r) <= 80 AND substr(u.r, length(u.r) - 16, 1) = '.'
                    AND split_part(x.f, '.', 1) = q_id::text
               THEN queue_pg._mac_of(x.f, key) = right(u.r, 16)
               ELSE false END
$$;

-- Parses a receipt for queue q; (NULL, NULL, NULL) when it is malformed, forged or another queue's.
CREATE OR REPLACE FUNCTION queue_pg._parse_receipt(q_id integer, receipt text, key bytea,
                                                   OUT id bigint, OUT lease_no integer, OUT token text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT p.id, p.lease_no, p.token INTO id, lease_no, token
    FROM queue_pg._parse_receipts(q_id, ARRAY[receipt], key) p;
END $$;

-- A receive on a relaxed queue (lease_durability 'relaxed') that owns its transaction (its
-- statement is the transaction's first: autocommit, no BEGIN before it) commits without waiting
-- for the WAL flush. In a caller's transaction nothing changes: the caller's other statements
-- keep their durability. SET LOCAL ends with the transaction.
CREATE OR REPLACE FUNCTION queue_pg._relax_commit() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF statement_timestamp() = transaction_timestamp() THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION queue_pg._invalid_receipt(queue text, receipt text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'QP006',
        MESSAGE = format('receipt %s is not a receipt of queue %s (malformed, forged or from another queue)',
                         coalesce(quote_literal(left(receipt, 100)), 'NULL'), quote_literal(queue));
END $$;

CREATE OR REPLACE FUNCTION queue_pg._stale_receipt(q queue_pg.queues, receipt text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM queue_pg._advance('stale_receipts', q.id);
    RAISE EXCEPTION USING ERRCODE = 'QP005',
        MESSAGE = format('receipt %s of queue %s is stale: the message was received again after it was issued',
                         quote_literal(receipt), quote_literal(q.name)),
        HINT = 'the lease lapsed before the message was deleted; consider a longer visibility_timeout or a heartbeat';
END $$;

-- The history row of a finished message: the one place that says what history keeps (of the
-- attribute `type`, its first 100 characters), and how many finished messages it stands for
-- (`weight`: 1, or the `every` of a sampled queue-type). Callers insert
-- `(queue_pg._history_row(...)).*` (inlined: no call per row) when q.history is on.
CREATE OR REPLACE FUNCTION queue_pg._history_row(q queue_pg.queues, m queue_pg.messages,
                                                 outcome text, at timestamptz, weight integer DEFAULT 1)
RETURNS queue_pg.message_history
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(q.id, q.name, m.id, outcome, m.enqueued_at, m.first_received_at, m.last_received_at,
               at, m.receive_count, m.lease_expiries, left(m.attributes ->> 'type', 100),
               weight)::queue_pg.message_history
$$;

-- The history's sampling key of a message: its type as history keeps it, '' for none.
CREATE OR REPLACE FUNCTION queue_pg._history_key(attributes jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT coalesce(left(attributes ->> 'type', 100), '') $$;

-- One finished message's history row (delete_message, dead-lettering); set-based writers
-- (delete_batch, purge, sweep) insert `_history_row` rows in the statement that removes them.
-- A deleted message of a sampled queue-type (queue_pg.history_sampling) is kept with chance
-- 1 / every and weight every; dead-lettered ones are all kept (weight 1: still unbiased).
CREATE OR REPLACE FUNCTION queue_pg._history(q queue_pg.queues, m queue_pg.messages, outcome text,
                                             at timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    e integer := 1;
BEGIN
    -- plpgsql keeps the INSERT's plan for the session; a sql function's INSERT (never inlined)
    -- was planned again at every call, over every partition: 333 µs a delete_message, measured
    IF q.history THEN
        IF outcome = 'deleted' THEN
            SELECT s.every INTO e FROM queue_pg.history_sampling s
            WHERE s.queue_id = q.id AND s.type = queue_pg._history_key(m.attributes);
            e := coalesce(e, 1);
            IF e > 1 AND random() * e >= 1 THEN
                RETURN;
            END IF;
        END IF;
        INSERT INTO queue_pg.message_history SELECT (queue_pg._history_row(q, m, outcome, at, e)).*;
    END IF;
END $$;
