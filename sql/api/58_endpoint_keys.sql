-- Keys of the protocol endpoints (SQS: 59_sqs.sql, Azure: 59_azure.sql): the one rule of who may
-- make a key for which role. A key names the PostgreSQL role whose grants decide what its requests
-- may do, so `role` must exist, and an admin who is not the owner may not make a key for a role
-- above its own (a superuser, or one with the owner's privileges): else an admin could act as the
-- owner through an endpoint. `what` names the key in the message ('an SQS key', 'an Azure key').
CREATE OR REPLACE FUNCTION queue_pg._check_key_role(role name, what text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF role IS NULL OR to_regrole(quote_ident(role)) IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('role = %s is invalid: allowed an existing PostgreSQL role',
                             coalesce(quote_literal(left(role, 100)), 'NULL'));
    END IF;
    IF NOT queue_pg._is_owner() AND (
        pg_has_role(to_regrole(quote_ident(role)), current_user, 'USAGE')
        OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = role AND r.rolsuper)
    ) THEN
        RAISE EXCEPTION USING ERRCODE = 'QP011',
            MESSAGE = format('permission denied: role %s may not make %s for role %s',
                             quote_literal(queue_pg._caller()), what, quote_literal(role)),
            DETAIL = 'the role is a superuser or has the queue_pg owner''s privileges; only the'
                     ' owner or a superuser makes keys for it';
    END IF;
END $$;

-- Endpoint secrets are sealed at rest (revision 0029, docs/access.md "Endpoint keys at rest"):
-- sealed and opened in Python (queue_pg/sealing.py) with a key the database never holds. The rule
-- of their form is the tables' *_keys_sealed checks; this is it for a caller, as QP003.
CREATE OR REPLACE FUNCTION queue_pg._check_sealed(sealed_secret text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF sealed_secret IS NULL OR sealed_secret !~ '^qps1\.[0-9a-f]{8}\.[A-Za-z0-9_-]{60,}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('sealed_secret = %s is invalid: allowed a secret sealed by queue_pg'
                             ' (qps1.KEYID.DATA): make keys with queue-pg sqs|azure key create',
                             coalesce(quote_literal(left(sealed_secret, 12) || '...'), 'NULL')),
            DETAIL = 'the database stores no endpoint secret in plain';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION queue_pg._check_secret_reader() RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT queue_pg._is_owner() THEN
        RAISE EXCEPTION USING ERRCODE = 'QP011',
            MESSAGE = format('permission denied: role %s may not read or seal endpoint secrets',
                             quote_literal(queue_pg._caller())),
            DETAIL = 'only the queue_pg owner reads them (the endpoints'' own connection)';
    END IF;
END $$;

-- The stored secrets (SQS and Azure, live and revoked) not sealed under the key `key_id`: plain
-- ones (made before revision 0029) and ones sealed under an older key, for `queue-pg secret-key
-- seal` to (re)seal. kind 'sqs' (id: the access key) or 'azure' (id: the row id). Owner only.
CREATE OR REPLACE FUNCTION queue_pg.endpoint_secrets(key_id text)
RETURNS TABLE (kind text, id text, role name, secret_key text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM queue_pg._check_secret_reader();
    RETURN QUERY
        SELECT 'sqs', k.access_key, k.role, k.secret_key FROM queue_pg.sqs_keys k
        WHERE NOT starts_with(k.secret_key, 'qps1.' || key_id || '.')
        UNION ALL
        SELECT 'azure', k.id::text, k.role, k.secret_key FROM queue_pg.azure_keys k
        WHERE NOT starts_with(k.secret_key, 'qps1.' || key_id || '.')
        ORDER BY 1, 2;
END $$;

-- Replace one stored secret by its sealed form, if it is still `old` (a concurrent seal or revoke
-- wins, and the row is left alone): true when replaced. Owner only.
CREATE OR REPLACE FUNCTION queue_pg.endpoint_reseal(kind text, id text, old text, sealed text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer;
BEGIN
    PERFORM queue_pg._check_secret_reader();
    PERFORM queue_pg._check_sealed(sealed);
    IF kind = 'sqs' THEN
        UPDATE queue_pg.sqs_keys k SET secret_key = sealed
        WHERE k.access_key = endpoint_reseal.id AND k.secret_key = old;
    ELSIF kind = 'azure' THEN
        UPDATE queue_pg.azure_keys k SET secret_key = sealed
        WHERE k.id = endpoint_reseal.id::bigint AND k.secret_key = old;
    ELSE
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('kind = %s is invalid: allowed sqs, azure', quote_literal(left(kind, 100)));
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n = 1;
END $$;

-- Once every stored secret is sealed, the tables' checks hold for every row: validate them (a
-- plain row left makes this fail with PostgreSQL's check_violation). Owner only.
CREATE OR REPLACE FUNCTION queue_pg.endpoint_secrets_sealed() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM queue_pg._check_secret_reader();
    ALTER TABLE queue_pg.sqs_keys VALIDATE CONSTRAINT sqs_keys_sealed;
    ALTER TABLE queue_pg.azure_keys VALIDATE CONSTRAINT azure_keys_sealed;
END $$;
