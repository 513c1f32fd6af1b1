-- The Azure Queue Storage endpoint (docs/azure.md): account keys, and queue metadata.
-- Keys are entry points of the owner and queue_pg_admin only (60_access.sql gives them to no group
-- role): a key names the PostgreSQL role whose grants decide what its requests may do. An admin
-- who is not the owner may not make a key for a role above its own, and only the owner reads
-- secrets back (as 59_sqs.sql does for SQS keys).

-- A new key for `role` under `account_name` (NULL: a generated name), returned: Azure's 3 - 24
-- lower-case letters and digits, one live key a name. The key itself (64 random bytes, base64 as
-- Azure's account keys) is made and sealed by the caller (queue_pg/sealing.py): the database
-- never sees it in plain, and the table's azure_keys_sealed check refuses anything else.
CREATE OR REPLACE FUNCTION queue_pg.azure_create_key(role name, sealed_secret text,
                                                     account_name text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    name_ text := coalesce(account_name,
                           'qp' || left(replace(gen_random_uuid()::text, '-', ''), 16));
BEGIN
    PERFORM queue_pg._check_key_role(role, 'an Azure key');
    PERFORM queue_pg._check_sealed(sealed_secret);
    IF name_ !~ '^[a-z0-9]{3,24}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('account = %s is invalid: allowed 3 to 24 lower-case letters and digits',
                             quote_literal(left(name_, 100)));
    END IF;
    IF EXISTS (SELECT 1 FROM queue_pg.azure_keys k WHERE k.account = name_ AND k.revoked_at IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('account = %s is invalid: it has a live key (revoke it first)',
                             quote_literal(name_));
    END IF;
    INSERT INTO queue_pg.azure_keys (account, secret_key, role)
    VALUES (name_, sealed_secret, azure_create_key.role);
    RETURN name_;
END $$;

-- Revoke an account's live key: true when it had one.
CREATE OR REPLACE FUNCTION queue_pg.azure_revoke_key(account text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    WITH r AS (
        UPDATE queue_pg.azure_keys k SET revoked_at = clock_timestamp()
        WHERE k.account = azure_revoke_key.account AND k.revoked_at IS NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM r)
$$;

-- An account's live key and role, for the endpoint's signature check; no row when unknown,
-- revoked, or its role was dropped. The owner's only (the endpoint connects as the owner).
CREATE OR REPLACE FUNCTION queue_pg.azure_key(account text)
RETURNS TABLE (secret_key text, role name)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT queue_pg._is_owner() THEN
        RAISE EXCEPTION USING ERRCODE = 'QP011',
            MESSAGE = format('permission denied: role %s may not read Azure keys',
                             quote_literal(queue_pg._caller())),
            DETAIL = 'only the queue_pg owner (the Azure endpoint''s own connection) reads them';
    END IF;
    RETURN QUERY SELECT k.secret_key, k.role FROM queue_pg.azure_keys k
                 WHERE k.account = azure_key.account
                   AND queue_pg._key_live(k.revoked_at, k.role);
END $$;

-- Replace a queue's metadata (Set Queue Metadata; needs `manage`): an object of string values,
-- names as Azure's (C# identifiers, at most 256 characters), 8 KiB in all as Azure.
CREATE OR REPLACE FUNCTION queue_pg.azure_set_metadata(queue text, metadata jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    bad text;
    size bigint;
BEGIN
    IF metadata IS NULL OR jsonb_typeof(metadata) <> 'object' THEN
        PERFORM queue_pg._raise('QP003', 'metadata must be a JSON object of strings');
    END IF;
    SELECT m.key INTO bad FROM jsonb_each(metadata) m
    WHERE m.key !~ '^[A-Za-z_][A-Za-z0-9_]{0,255}$' OR jsonb_typeof(m.value) <> 'string'
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('metadata name %s is invalid: allowed names of letters, digits and _'
                             ' (not first a digit), 1 to 256 characters, with string values',
                             quote_literal(left(bad, 100)));
    END IF;
    SELECT coalesce(sum(octet_length(m.key) + octet_length(m.value #>> '{}')), 0) INTO size
    FROM jsonb_each(metadata) m;
    PERFORM queue_pg._check('metadata size', size, 0, 8192, 'bytes');
    INSERT INTO queue_pg.azure_queue_metadata (queue_id, metadata) VALUES (q.id, metadata)
    ON CONFLICT (queue_id) DO UPDATE SET metadata = excluded.metadata;
END $$;

-- A queue's metadata ('{}' when none), for a caller who may send to, receive from or manage it.
CREATE OR REPLACE FUNCTION queue_pg.azure_metadata(queue text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue);
BEGIN
    IF NOT queue_pg._sees(q.id) THEN
        PERFORM queue_pg._authorize(q.id, q.name, 'receive');
    END IF;
    RETURN coalesce((SELECT m.metadata FROM queue_pg.azure_queue_metadata m WHERE m.queue_id = q.id),
                    '{}');
END $$;

-- List Queues: names from `marker` on (inclusive, Azure's NextMarker) that start with `prefix`,
-- at most n + 1 (the last one, when there, is the next page's marker), with metadata shown only
-- for the queues the caller may see (its grants): '{}' for the others.
CREATE OR REPLACE FUNCTION queue_pg.azure_list_queues(prefix text, marker text, n integer)
RETURNS TABLE (name text, metadata jsonb)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM queue_pg._check('maxresults', n, 1, 5000, 'queues');
    RETURN QUERY
    SELECT q.name,
           CASE WHEN queue_pg._sees(q.id)
                THEN coalesce((SELECT m.metadata FROM queue_pg.azure_queue_metadata m
                               WHERE m.queue_id = q.id), '{}')
                ELSE '{}'::jsonb END
    FROM queue_pg.queues q
    WHERE left(q.name, length(coalesce(prefix, ''))) = coalesce(prefix, '')
      AND (marker IS NULL OR q.name COLLATE "C" >= marker COLLATE "C")
    ORDER BY q.name COLLATE "C"
    LIMIT n + 1;
END $$;

-- Azure Put Message: a send (the caller needs 'send' on the queue) whose answer carries a pop
-- receipt, as Azure's does. The message gets lease number 1 before any receive (a message no
-- receive has taken has 0, for which no receipt exists), so the receipt settles it through the
-- usual functions (delete_message, update_message, azure_update: these need 'receive') until a
-- receive takes it (lease 2: this receipt is stale), or it is updated, deleted or expires.
-- receipt is NULL when the send made no new message of this queue (a duplicate of a message
-- already received, or one routed to another queue).
CREATE OR REPLACE FUNCTION queue_pg.azure_put(queue text, body jsonb, delay double precision,
                                              ttl double precision, OUT id bigint, OUT receipt text,
                                              OUT enqueued_at timestamptz, OUT visible_at timestamptz,
                                              OUT expires_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    id := queue_pg.send(queue, body, delay, ttl);
    UPDATE queue_pg.messages m SET lease_no = 1
    WHERE m.id = azure_put.id AND m.queue_id = (queue_pg._queue(queue)).id
      AND m.lease_no = 0 AND m.last_received_at IS NULL
    RETURNING queue_pg._receipt(m.queue_id, m.id, 1, queue_pg._key()), m.enqueued_at, m.visible_at,
              m.expires_at
    INTO receipt, enqueued_at, visible_at, expires_at;
END $$;

-- Azure Update Message: update_message (new visibility and, optionally, body), then a new lease
-- number, so the receipt given is stale from then on and the one returned is the only one that
-- settles the message (Azure's rule). A relaxed queue's lease token is kept: the receive time
-- it stands for has not changed.
CREATE OR REPLACE FUNCTION queue_pg.azure_update(queue text, receipt text, body jsonb,
                                                 visibility_timeout double precision)
RETURNS queue_pg.message
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'receive');
    key bytea := queue_pg._key();
    m queue_pg.message := queue_pg._relet(q, receipt, visibility_timeout, body, NULL, false,
                                          'visibility_timeout');
    token text := (queue_pg._parse_receipt(q.id, receipt, key)).token;
BEGIN
    UPDATE queue_pg.messages t SET lease_no = t.lease_no + 1
    WHERE t.id = m.id AND t.queue_id = q.id
    RETURNING queue_pg._receipt(q.id, t.id, t.lease_no, key, token) INTO m.receipt;
    RETURN m;
END $$;

-- Set Queue ACL (needs `manage`): replace the queue's stored access policies with `policies`, a
-- JSON array of at most 5 objects {id, start, expiry, permission} (id 1 to 64 characters,
-- distinct; start and expiry ISO 8601 times or null; permission letters of r, a, u, p or null).
CREATE OR REPLACE FUNCTION queue_pg.azure_set_acl(queue text, policies jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    bad jsonb;
BEGIN
    IF policies IS NULL OR jsonb_typeof(policies) <> 'array' THEN
        PERFORM queue_pg._raise('QP003', 'policies must be a JSON array of objects');
    END IF;
    PERFORM queue_pg._check('len(policies)', jsonb_array_length(policies), 0, 5, 'policies');
    SELECT p INTO bad FROM jsonb_array_elements(policies) p
    WHERE jsonb_typeof(p) <> 'object' OR jsonb_typeof(p -> 'id') IS DISTINCT FROM 'string'
       OR length(p ->> 'id') NOT BETWEEN 1 AND 64
       OR coalesce(jsonb_typeof(p -> 'permission'), 'null') NOT IN ('string', 'null')
       OR (p ->> 'permission') !~ '^[raup]*$'
       OR coalesce(jsonb_typeof(p -> 'start'), 'null') NOT IN ('string', 'null')
       OR coalesce(jsonb_typeof(p -> 'expiry'), 'null') NOT IN ('string', 'null')
       OR (p ->> 'start') !~ '^\d{4}-\d\d-\d\dT[0-9:.]+(Z|[+-]\d\d:?\d\d)?$'
       OR (p ->> 'expiry') !~ '^\d{4}-\d\d-\d\dT[0-9:.]+(Z|[+-]\d\d:?\d\d)?$'
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('policy %s is invalid: allowed {"id": 1 to 64 characters, "start" and'
                             ' "expiry": ISO 8601 times or null, "permission": letters of raup or null}',
                             left(bad::text, 200));
    END IF;
    SELECT p -> 'id' INTO bad FROM jsonb_array_elements(policies) p
    GROUP BY p -> 'id' HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('policies has duplicate id %s: allowed distinct ids only', left(bad::text, 100));
    END IF;
    DELETE FROM queue_pg.azure_access_policies a WHERE a.queue_id = q.id;
    INSERT INTO queue_pg.azure_access_policies (queue_id, id, start, expiry, permission)
    SELECT q.id, p ->> 'id', (p ->> 'start')::timestamptz, (p ->> 'expiry')::timestamptz,
           p ->> 'permission'
    FROM jsonb_array_elements(policies) p;
EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format THEN  -- 2026-13-45: no such time
    RAISE EXCEPTION USING ERRCODE = 'QP003',
        MESSAGE = format('policies has a start or expiry that is no time: %s', SQLERRM);
END $$;

-- Get Queue ACL (needs `manage`): the queue's stored access policies, by id.
CREATE OR REPLACE FUNCTION queue_pg.azure_acl(queue text)
RETURNS TABLE (id text, start timestamptz, expiry timestamptz, permission text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
BEGIN
    RETURN QUERY SELECT a.id, a.start, a.expiry, a.permission FROM queue_pg.azure_access_policies a
                 WHERE a.queue_id = q.id ORDER BY a.id COLLATE "C";
END $$;

-- The stored access policy `id` of a queue, for the endpoint's check of a SAS that names it
-- (`si`); no row when the queue or the policy does not exist. The owner's only, as azure_key:
-- it runs before the request's role is known.
CREATE OR REPLACE FUNCTION queue_pg.azure_access_policy(queue text, id text)
RETURNS TABLE (start timestamptz, expiry timestamptz, permission text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT queue_pg._is_owner() THEN
        RAISE EXCEPTION USING ERRCODE = 'QP011',
            MESSAGE = format('permission denied: role %s may not read Azure access policies',
                             quote_literal(queue_pg._caller())),
            DETAIL = 'only the queue_pg owner (the Azure endpoint''s own connection) reads them';
    END IF;
    RETURN QUERY SELECT a.start, a.expiry, a.permission
                 FROM queue_pg.azure_access_policies a JOIN queue_pg.queues q ON q.id = a.queue_id
                 WHERE q.name = azure_access_policy.queue AND a.id = azure_access_policy.id;
END $$;

-- An account's service-level settings are its key's role's: the caller must be the role of the
-- account's live key (or the owner: the endpoint without auth, or an operator), so a key of one
-- account changes nothing of another's.
CREATE OR REPLACE FUNCTION queue_pg._azure_account_of_caller(account text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF queue_pg._is_owner() THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM queue_pg.azure_keys k
                   WHERE k.account = _azure_account_of_caller.account AND k.revoked_at IS NULL
                     AND k.role = queue_pg._caller()) THEN
        RAISE EXCEPTION USING ERRCODE = 'QP011',
            MESSAGE = format('permission denied: role %s holds no live key of account %s',
                             quote_literal(queue_pg._caller()), quote_literal(left(account, 100)));
    END IF;
END $$;

-- Get Queue Service Properties: Azure's defaults (no logging, metrics or CORS rules), each
-- top-level element replaced by what Set Queue Service Properties stored for the account.
CREATE OR REPLACE FUNCTION queue_pg.azure_service_properties(account text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    off jsonb := '{"Version": "1.0", "Enabled": "false", "RetentionPolicy": {"Enabled": "false"}}'::jsonb;
BEGIN
    PERFORM queue_pg._azure_account_of_caller(account);
    RETURN jsonb_build_object(
        'Logging', '{"Version": "1.0", "Delete": "false", "Read": "false", "Write": "false",
                     "RetentionPolicy": {"Enabled": "false"}}'::jsonb,
        'HourMetrics', off, 'MinuteMetrics', off, 'Cors', '[]'::jsonb)
        || coalesce((SELECT p.properties FROM queue_pg.azure_service_properties p
                     WHERE p.account = azure_service_properties.account), '{}');
END $$;

-- Every account's CORS rules (those with at least one), for the endpoint: it answers preflights,
-- which are not signed, from one cached read of all accounts (queue_pg/azure/cors.py), so a
-- preflight costs no read of its own whatever account or queue it names. The owner's only, as
-- azure_key (the endpoint's own connection).
CREATE OR REPLACE FUNCTION queue_pg.azure_cors_rules()
RETURNS TABLE (account text, rules jsonb)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT queue_pg._is_owner() THEN
        RAISE EXCEPTION USING ERRCODE = 'QP011',
            MESSAGE = format('permission denied: role %s may not read every account''s CORS rules',
                             quote_literal(queue_pg._caller())),
            DETAIL = 'only the queue_pg owner (the Azure endpoint''s own connection) reads them';
    END IF;
    RETURN QUERY SELECT p.account, p.properties -> 'Cors' FROM queue_pg.azure_service_properties p
                 WHERE jsonb_typeof(p.properties -> 'Cors') = 'array'
                   AND jsonb_array_length(p.properties -> 'Cors') > 0;
END $$;

-- Azure's limits on an account's CORS rules (Set Queue Service Properties), as the endpoint
-- enforces them (queue_pg/azure/cors.py): the first problem of `rules`, naming the rule, the
-- element, the value and what is allowed; NULL when there is none. Each element is one of Azure's
-- comma-separated lists: AllowedOrigins (required: '*', or up to 64 origins of at most 256
-- visible ASCII characters), AllowedMethods (required: DELETE, GET, HEAD, MERGE, POST, OPTIONS,
-- PUT, PATCH), AllowedHeaders and ExposedHeaders (may be empty: header names of at most 256
-- characters, at most 64 literal and 2 prefixed ones, 'x-ms-meta-*'), MaxAgeInSeconds (required:
-- a whole number from 0); 2 KiB of values in all. The endpoint sends some of these values back in
-- response headers to anyone, so every item is a plain token: no spaces, no control characters.
CREATE OR REPLACE FUNCTION queue_pg._azure_cors_problem(rules jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    r record;
    e record;
    item text;
    items text[];
    total int := 0;
    methods constant text[] := ARRAY['DELETE', 'GET', 'HEAD', 'MERGE', 'POST', 'OPTIONS', 'PUT', 'PATCH'];
BEGIN
    FOR r IN SELECT x.rule, x.n - 1 AS i FROM jsonb_array_elements(rules) WITH ORDINALITY x(rule, n) LOOP
        IF jsonb_typeof(r.rule) <> 'object' THEN
            RETURN format('Cors[%s] is a JSON %s: allowed an object of AllowedOrigins, AllowedMethods,'
                          ' AllowedHeaders, ExposedHeaders, MaxAgeInSeconds', r.i, jsonb_typeof(r.rule));
        END IF;
        IF coalesce(r.rule ->> 'MaxAgeInSeconds', '') !~ '^\d{1,9}$' THEN
            RETURN format('Cors[%s].MaxAgeInSeconds = %s is invalid: allowed a whole number from 0'
                          ' to 999999999', r.i, coalesce(queue_pg._shown(r.rule ->> 'MaxAgeInSeconds'), 'missing'));
        END IF;
        FOR e IN SELECT * FROM jsonb_each(r.rule) LOOP
            IF e.key NOT IN ('AllowedOrigins', 'AllowedMethods', 'AllowedHeaders', 'ExposedHeaders',
                             'MaxAgeInSeconds') THEN
                RETURN format('Cors[%s] element %s is invalid: allowed AllowedOrigins, AllowedMethods,'
                              ' AllowedHeaders, ExposedHeaders, MaxAgeInSeconds', r.i, queue_pg._shown(e.key));
            END IF;
            CONTINUE WHEN e.key = 'MaxAgeInSeconds';
            IF jsonb_typeof(e.value) <> 'string' THEN
                RETURN format('Cors[%s].%s is a JSON %s: allowed a comma-separated list in a string',
                              r.i, e.key, jsonb_typeof(e.value));
            END IF;
            total := total + length(e.value #>> '{}');
            items := CASE WHEN btrim(e.value #>> '{}') = '' THEN '{}'::text[]
                          ELSE ARRAY(SELECT btrim(t)
                                     FROM unnest(string_to_array(e.value #>> '{}', ',')) t) END;
            IF e.key IN ('AllowedOrigins', 'AllowedMethods') AND cardinality(items) = 0 THEN
                RETURN format('Cors[%s].%s is empty: allowed %s', r.i, e.key,
                              CASE e.key WHEN 'AllowedOrigins' THEN '''*'' or 1 to 64 origins'
                                         ELSE array_to_string(methods, ', ') END);
            END IF;
            IF e.key = 'AllowedMethods' THEN
                SELECT queue_pg._shown(t) INTO item FROM unnest(items) t
                WHERE upper(t) <> ALL (methods) LIMIT 1;
                IF FOUND THEN
                    RETURN format('Cors[%s].AllowedMethods item %s is invalid: allowed %s', r.i,
                                  item, array_to_string(methods, ', '));
                END IF;
            ELSIF e.key = 'AllowedOrigins' THEN
                SELECT queue_pg._shown(t) INTO item FROM unnest(items) t
                WHERE t !~ '^[\x21-\x7e]+$' OR length(t) > 256 LIMIT 1;
                IF FOUND OR cardinality(items) > 64 THEN
                    RETURN format('Cors[%s].AllowedOrigins %s is invalid: allowed ''*'' or 1 to 64 origins'
                                  ' of 1 to 256 visible ASCII characters, comma-separated', r.i,
                                  CASE WHEN FOUND THEN 'item ' || item
                                       ELSE format('(%s origins)', cardinality(items)) END);
                END IF;
            ELSE
                SELECT queue_pg._shown(t) INTO item FROM unnest(items) t
                WHERE t !~ '^[-!#$%&''*+.^_`|~0-9A-Za-z]+$' OR length(t) > 256 LIMIT 1;
                IF FOUND OR (SELECT count(*) FROM unnest(items) t WHERE t !~ '[*]$') > 64
                   OR (SELECT count(*) FROM unnest(items) t WHERE t ~ '[*]$') > 2 THEN
                    RETURN format('Cors[%s].%s %s is invalid: allowed header names of 1 to 256 characters'
                                  ' (letters, digits and !#$%%&''*+-.^_`|~), at most 64 literal and 2'
                                  ' prefixed (ending in *), comma-separated', r.i, e.key,
                                  CASE WHEN FOUND THEN 'item ' || item
                                       ELSE format('(%s names)', cardinality(items)) END);
                END IF;
            END IF;
        END LOOP;
        IF NOT (r.rule ? 'AllowedOrigins' AND r.rule ? 'AllowedMethods') THEN
            RETURN format('Cors[%s] is invalid: AllowedOrigins and AllowedMethods are required', r.i);
        END IF;
    END LOOP;
    IF total > 2048 THEN
        RETURN format('Cors is %s characters of values: allowed up to 2048 (Azure''s 2 KiB)', total);
    END IF;
    RETURN NULL;
END $$;

-- Set Queue Service Properties: the top-level elements given replace the stored ones, those not
-- given stay (as Azure). Checked as Azure: at most 5 CORS rules within Azure's limits
-- (_azure_cors_problem), retention of 1 to 365 days, booleans 'true' / 'false'.
CREATE OR REPLACE FUNCTION queue_pg.azure_set_service_properties(account text, properties jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    bad text;
BEGIN
    PERFORM queue_pg._azure_account_of_caller(account);
    IF properties IS NULL OR jsonb_typeof(properties) <> 'object' THEN
        PERFORM queue_pg._raise('QP003', 'properties must be a JSON object');
    END IF;
    SELECT k INTO bad FROM jsonb_object_keys(properties) k
    WHERE k NOT IN ('Logging', 'HourMetrics', 'MinuteMetrics', 'Cors') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('properties.%s is invalid: allowed Logging, HourMetrics, MinuteMetrics, Cors',
                             left(bad, 100));
    END IF;
    IF properties ? 'Cors' THEN
        IF jsonb_typeof(properties -> 'Cors') <> 'array' THEN
            PERFORM queue_pg._raise('QP003', 'properties.Cors must be an array of rules');
        END IF;
        PERFORM queue_pg._check('len(Cors)', jsonb_array_length(properties -> 'Cors'), 0, 5, 'Cors');
        bad := queue_pg._azure_cors_problem(properties -> 'Cors');
        IF bad IS NOT NULL THEN
            PERFORM queue_pg._raise('QP003', bad);
        END IF;
    END IF;
    SELECT e.key INTO bad
    FROM jsonb_each(properties - 'Cors') e
    WHERE jsonb_typeof(e.value) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_each_text(e.value) f
                  WHERE f.key IN ('Enabled', 'Delete', 'Read', 'Write', 'IncludeAPIs')
                    AND f.value NOT IN ('true', 'false'))
       OR coalesce(e.value #>> '{RetentionPolicy,Enabled}', 'false') NOT IN ('true', 'false')
       OR (e.value #>> '{RetentionPolicy,Enabled}' = 'true'
           AND coalesce(e.value #>> '{RetentionPolicy,Days}', '') !~ '^([1-9]|[1-9]\d|[12]\d\d|3[0-5]\d|36[0-5])$')
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('properties.%s is invalid: allowed booleans true or false, and a'
                             ' RetentionPolicy enabled with Days of 1 to 365', bad);
    END IF;
    INSERT INTO queue_pg.azure_service_properties AS p (account, properties)
    VALUES (account, properties)
    ON CONFLICT ON CONSTRAINT azure_service_properties_pkey
    DO UPDATE SET properties = p.properties || excluded.properties, updated_at = clock_timestamp();
END $$;
