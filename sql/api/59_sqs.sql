-- Access keys of the SQS endpoint (docs/sqs.md). Entry points of the owner and queue_pg_admin
-- only (60_access.sql gives them to no group role): a key names the PostgreSQL role whose grants
-- decide what its requests may do, so making one is an admin's act. An admin who is not the owner
-- may not make a key for a role above its own (a superuser, or one with the owner's privileges),
-- and only the owner reads secrets back: else an admin could act as the owner through the endpoint.

-- A new key for `role`: an access key id (AKQP + 16 hex digits, upper case), returned, with the
-- secret the caller made and sealed (queue_pg/sealing.py: the database never sees the secret in
-- plain; the table's sqs_keys_sealed check refuses anything else).
CREATE OR REPLACE FUNCTION queue_pg.sqs_create_key(role name, sealed_secret text)
RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    id text := 'AKQP' || upper(left(replace(gen_random_uuid()::text, '-', ''), 16));
BEGIN
    PERFORM queue_pg._check_key_role(role, 'an SQS key');
    PERFORM queue_pg._check_sealed(sealed_secret);
    INSERT INTO queue_pg.sqs_keys (access_key, secret_key, role)
    VALUES (id, sealed_secret, sqs_create_key.role);
    RETURN id;
END $$;

-- Revoke a key: true when it was live.
CREATE OR REPLACE FUNCTION queue_pg.sqs_revoke_key(access_key text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    WITH r AS (
        UPDATE queue_pg.sqs_keys k SET revoked_at = clock_timestamp()
        WHERE k.access_key = sqs_revoke_key.access_key AND k.revoked_at IS NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM r)
$$;

-- A live key's secret and role, for the endpoint's signature check; no row when unknown, revoked,
-- or its role was dropped.
-- The owner's only (the endpoint connects as the owner).
CREATE OR REPLACE FUNCTION queue_pg.sqs_key(access_key text)
RETURNS TABLE (secret_key text, role name)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT queue_pg._is_owner() THEN
        RAISE EXCEPTION USING ERRCODE = 'QP011',
            MESSAGE = format('permission denied: role %s may not read SQS secrets',
                             quote_literal(queue_pg._caller())),
            DETAIL = 'only the queue_pg owner (the SQS endpoint''s own connection) reads them';
    END IF;
    RETURN QUERY SELECT k.secret_key, k.role FROM queue_pg.sqs_keys k
                 WHERE k.access_key = sqs_key.access_key
                   AND queue_pg._key_live(k.revoked_at, k.role);  -- a dropped role's keys die
END $$;

-- Queue tags (SQS's TagQueue / UntagQueue / ListQueueTags); each needs `manage` on the queue.
-- At most 50 tags a queue, keys 1 - 128 characters, values up to 256: checked after the upsert,
-- so a call that would pass 50 changes nothing.
CREATE OR REPLACE FUNCTION queue_pg.sqs_tag_queue(queue text, tags jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    bad text;
    n bigint;
BEGIN
    IF tags IS NULL OR jsonb_typeof(tags) <> 'object' THEN
        PERFORM queue_pg._raise('QP003', 'tags must be a JSON object of strings');
    END IF;
    SELECT t.key INTO bad FROM jsonb_each(tags) t
    WHERE length(t.key) NOT BETWEEN 1 AND 128 OR jsonb_typeof(t.value) <> 'string'
       OR length(t.value #>> '{}') > 256
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('tag %s is invalid: allowed keys of 1 to 128 characters, string values of up to 256',
                             quote_literal(left(bad, 130)));
    END IF;
    INSERT INTO queue_pg.queue_tags (queue_id, key, value)
    SELECT q.id, t.key, t.value #>> '{}' FROM jsonb_each(tags) t
    ON CONFLICT (queue_id, key) DO UPDATE SET value = excluded.value;
    SELECT count(*) INTO n FROM queue_pg.queue_tags t WHERE t.queue_id = q.id;
    IF n > 50 THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('tags = %s on queue %s is invalid: allowed at most 50 a queue', n,
                             quote_literal(q.name));
    END IF;
END $$;

CREATE OR REPLACE FUNCTION queue_pg.sqs_untag_queue(queue text, keys text[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
BEGIN
    DELETE FROM queue_pg.queue_tags t WHERE t.queue_id = q.id AND t.key = ANY (keys);
END $$;

CREATE OR REPLACE FUNCTION queue_pg.sqs_queue_tags(queue text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(t.key, t.value), '{}') FROM queue_pg.queue_tags t
            WHERE t.queue_id = q.id);
END $$;

-- The groups of messages just received, for the SQS endpoint's MessageGroupId attribute: by
-- receipt, on a queue the caller may receive from (a receipt names its message; a stale one
-- still names it, a forged or another queue's one matches nothing). NULL group: none.
CREATE OR REPLACE FUNCTION queue_pg.message_groups(queue text, receipts text[])
RETURNS TABLE (receipt text, "group" text)
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'receive');
BEGIN
    PERFORM queue_pg._check('len(receipts)', coalesce(cardinality(receipts), 0), 0, 1000, 'receipts');
    PERFORM queue_pg._check_list('receipts', receipts);
    RETURN QUERY
    SELECT receipts[p.i], m.group_id
    FROM queue_pg._parse_receipts(q.id, receipts, queue_pg._key()) p
    JOIN queue_pg.messages m ON m.id = p.id AND m.queue_id = q.id;
END $$;

-- What SQS says of a FIFO message besides its group, for the endpoint's MessageDeduplicationId
-- and SequenceNumber: by receipt as message_groups (the same checks), each message's group, its
-- dedup id (the one its send claimed: given, or the body's SHA-256 on a content_dedup queue;
-- kept on the message, so it outlives the dedup window) and, on a FIFO queue, its sequence
-- number: the message id, which orders a group (a group's next message is its lowest id).
CREATE OR REPLACE FUNCTION queue_pg.message_details(queue text, receipts text[])
RETURNS TABLE (receipt text, "group" text, dedup_id text, sequence bigint)
LANGUAGE plpgsql AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'receive');
BEGIN
    PERFORM queue_pg._check('len(receipts)', coalesce(cardinality(receipts), 0), 0, 1000, 'receipts');
    PERFORM queue_pg._check_list('receipts', receipts);
    RETURN QUERY
    SELECT receipts[p.i], m.group_id, m.dedup_id, CASE WHEN q.fifo THEN m.id END
    FROM queue_pg._parse_receipts(q.id, receipts, queue_pg._key()) p
    JOIN queue_pg.messages m ON m.id = p.id AND m.queue_id = q.id;
END $$;

-- SQS attributes queue_pg keeps but does not act on (Policy, KmsMasterKeyId,
-- KmsDataKeyReusePeriodSeconds, SqsManagedSseEnabled, DeduplicationScope, FifoThroughputLimit):
-- set (an empty value removes one) with `manage` on the queue; the endpoint checks their values.
CREATE OR REPLACE FUNCTION queue_pg.sqs_set_queue_attributes(queue text, attrs jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    bad text;
BEGIN
    IF attrs IS NULL OR jsonb_typeof(attrs) <> 'object' THEN
        PERFORM queue_pg._raise('QP003', 'attrs must be a JSON object of strings');
    END IF;
    SELECT a.key INTO bad FROM jsonb_each(attrs) a
    WHERE a.key NOT IN ('Policy', 'KmsMasterKeyId', 'KmsDataKeyReusePeriodSeconds',
                        'SqsManagedSseEnabled', 'DeduplicationScope', 'FifoThroughputLimit')
       OR jsonb_typeof(a.value) <> 'string' OR length(a.value #>> '{}') > 20480
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('attribute %s is invalid: allowed Policy, KmsMasterKeyId, KmsDataKeyReusePeriodSeconds, SqsManagedSseEnabled, DeduplicationScope, FifoThroughputLimit with string values of up to 20480 characters',
                             quote_literal(left(bad, 100)));
    END IF;
    DELETE FROM queue_pg.sqs_queue_attributes a
    WHERE a.queue_id = q.id AND a.name IN (SELECT key FROM jsonb_each_text(attrs) WHERE value = '');
    INSERT INTO queue_pg.sqs_queue_attributes (queue_id, name, value)
    SELECT q.id, t.key, t.value FROM jsonb_each_text(attrs) t WHERE t.value <> ''
    ON CONFLICT (queue_id, name) DO UPDATE SET value = excluded.value;
END $$;

-- A queue's kept SQS attributes, and its permissions as {label: {principals, actions}}: to any
-- member of a group role, as get_queue's settings.
CREATE OR REPLACE FUNCTION queue_pg.sqs_queue_attributes(queue text)
RETURNS TABLE (attributes jsonb, permissions jsonb)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue);
BEGIN
    RETURN QUERY SELECT
        (SELECT coalesce(jsonb_object_agg(a.name, a.value), '{}') FROM queue_pg.sqs_queue_attributes a
         WHERE a.queue_id = q.id),
        (SELECT coalesce(jsonb_object_agg(p.label, jsonb_build_object(
                    'principals', to_jsonb(p.principals), 'actions', to_jsonb(p.actions))), '{}')
         FROM queue_pg.sqs_permissions p WHERE p.queue_id = q.id);
END $$;

-- SQS's AddPermission: a label naming principals and SQS actions. A principal that names an
-- existing role gets the grants the actions need on the queue (SendMessage: send; ReceiveMessage,
-- DeleteMessage, ChangeMessageVisibility: receive; PurgeQueue: manage; *: all three); the grants
-- it did not have before are recorded with the label, for RemovePermission to take back. Other
-- principals (AWS account ids) are kept and shown in the Policy only. Needs `manage`.
CREATE OR REPLACE FUNCTION queue_pg.sqs_add_permission(queue text, label text, principals text[],
                                                       actions text[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    made jsonb := '[]'::jsonb;
    p text;
    priv text;
BEGIN
    PERFORM queue_pg._check('len(label)', length(label), 1, 80, 'characters');
    PERFORM queue_pg._check('len(principals)', coalesce(cardinality(principals), 0), 1, 50, 'principals');
    PERFORM queue_pg._check('len(actions)', coalesce(cardinality(actions), 0), 1, 7, 'actions');
    PERFORM queue_pg._check_list('principals', principals);
    PERFORM queue_pg._check_list('actions', actions);
    IF EXISTS (SELECT 1 FROM unnest(principals) x(p) WHERE x.p IS NULL OR length(x.p) NOT BETWEEN 1 AND 256) THEN
        PERFORM queue_pg._raise('QP003', 'principals are invalid: allowed names of 1 to 256 characters');
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(actions) x(a) WHERE x.a IS NULL OR x.a NOT IN (
                   '*', 'SendMessage', 'ReceiveMessage', 'DeleteMessage', 'ChangeMessageVisibility',
                   'GetQueueAttributes', 'GetQueueUrl', 'ListDeadLetterSourceQueues', 'PurgeQueue')) THEN
        PERFORM queue_pg._raise('QP003', 'actions are invalid: allowed *, SendMessage, ReceiveMessage, DeleteMessage, ChangeMessageVisibility, GetQueueAttributes, GetQueueUrl, ListDeadLetterSourceQueues, PurgeQueue');
    END IF;
    IF (SELECT count(*) FROM queue_pg.sqs_permissions s WHERE s.queue_id = q.id) >= 100 THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('label = %s is invalid: queue %s has 100 permissions, the most allowed',
                             quote_literal(label), quote_literal(q.name));
    END IF;
    IF EXISTS (SELECT 1 FROM queue_pg.sqs_permissions s WHERE s.queue_id = q.id AND s.label = sqs_add_permission.label) THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('label = %s is invalid: queue %s has a permission of that label already',
                             quote_literal(label), quote_literal(q.name));
    END IF;
    FOREACH p IN ARRAY principals LOOP
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p);
        FOR priv IN
            SELECT DISTINCT x.priv FROM unnest(actions) a(name)
            CROSS JOIN LATERAL unnest(CASE a.name
                WHEN '*' THEN ARRAY['send', 'receive', 'manage']
                WHEN 'SendMessage' THEN ARRAY['send']
                WHEN 'ReceiveMessage' THEN ARRAY['receive']
                WHEN 'DeleteMessage' THEN ARRAY['receive']
                WHEN 'ChangeMessageVisibility' THEN ARRAY['receive']
                WHEN 'PurgeQueue' THEN ARRAY['manage']
                ELSE '{}'::text[] END) x(priv)
        LOOP
            IF queue_pg._grant(q.name, p, priv, true) THEN
                made := made || jsonb_build_array(jsonb_build_array(p, priv));
            END IF;
        END LOOP;
    END LOOP;
    INSERT INTO queue_pg.sqs_permissions (queue_id, label, principals, actions, granted)
    VALUES (q.id, label, principals, actions, made);
END $$;

-- SQS's RemovePermission: drops the label and takes back the grants it made, unless another label
-- of the queue made the same. False when the queue has no such label. Needs `manage`.
CREATE OR REPLACE FUNCTION queue_pg.sqs_remove_permission(queue text, label text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q queue_pg.queues := queue_pg._queue(queue, 'manage');
    gone jsonb;
    g jsonb;
BEGIN
    DELETE FROM queue_pg.sqs_permissions s WHERE s.queue_id = q.id AND s.label = sqs_remove_permission.label
    RETURNING s.granted INTO gone;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    FOR g IN SELECT * FROM jsonb_array_elements(gone) LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM queue_pg.sqs_permissions s
                              WHERE s.queue_id = q.id AND s.granted @> jsonb_build_array(g));
        PERFORM queue_pg._grant(q.name, g->>0, g->>1, false);
    END LOOP;
    RETURN true;
END $$;
