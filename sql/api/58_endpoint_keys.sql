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

-- Whether an endpoint key may sign requests: not revoked, and its role exists (a dropped role's
-- keys die). The one rule of a live key, for the look-ups below and for _enter_key.
CREATE OR REPLACE FUNCTION queue_pg._key_live(revoked_at timestamptz, role name) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT revoked_at IS NULL AND to_regrole(quote_ident(role)) IS NOT NULL
$$;

-- A live key of an endpoint, for its signature check: kind 'sqs' (name: the access key) or
-- 'azure' (name: the account); its id (the access key; an Azure key's row id: a new key of the
-- same account has another), sealed secret and role. No row when unknown, revoked, or its role
-- was dropped. The owner's only (the endpoints connect as the owner).
CREATE OR REPLACE FUNCTION queue_pg.endpoint_key(kind text, name text)
RETURNS TABLE (id text, secret_key text, role name)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM queue_pg._check_secret_reader();
    IF kind = 'sqs' THEN
        RETURN QUERY SELECT k.access_key, k.secret_key, k.role FROM queue_pg.sqs_keys k
                     WHERE k.access_key = endpoint_key.name AND queue_pg._key_live(k.revoked_at, k.role);
    ELSIF kind = 'azure' THEN
        RETURN QUERY SELECT k.id::text, k.secret_key, k.role FROM queue_pg.azure_keys k
                     WHERE k.account = endpoint_key.name AND queue_pg._key_live(k.revoked_at, k.role);
    ELSE
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('kind = %s is invalid: allowed sqs, azure', quote_literal(left(kind, 100)));
    END IF;
END $$;

-- The first statement of each transaction an endpoint runs for a request signed by a key it
-- keeps in memory (queue_pg/endpoint_keys.py): KeyRevoked (QP040) unless the key (kind and id as
-- endpoint_key gives them) is still live and still of `role`, the role its secret was opened for
-- (the seal binds the two: a row given another role since is not this key), so a revoked key
-- fails on its very next request; else the transaction takes the role (SET LOCAL ROLE).
-- Not an entry point: it runs with the caller's rights (a SECURITY DEFINER function may not set
-- the role), and only the owner may EXECUTE it or read the keys.
CREATE OR REPLACE FUNCTION queue_pg._enter_key(kind text, id text, role name) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    live boolean := false;
BEGIN
    IF kind IS DISTINCT FROM 'sqs' AND kind IS DISTINCT FROM 'azure' THEN
        RAISE EXCEPTION USING ERRCODE = 'QP003',
            MESSAGE = format('kind = %s is invalid: allowed sqs, azure',
                             coalesce(quote_literal(left(kind, 100)), 'NULL'));
    END IF;
    IF kind = 'sqs' THEN
        live := EXISTS (SELECT 1 FROM queue_pg.sqs_keys k
                        WHERE k.access_key = _enter_key.id AND k.role = _enter_key.role
                          AND queue_pg._key_live(k.revoked_at, k.role));
    ELSIF id ~ '^[0-9]{1,18}$' THEN
        live := EXISTS (SELECT 1 FROM queue_pg.azure_keys k
                        WHERE k.id = _enter_key.id::bigint AND k.role = _enter_key.role
                          AND queue_pg._key_live(k.revoked_at, k.role));
    END IF;
    IF NOT live THEN
        RAISE EXCEPTION USING ERRCODE = 'QP040',
            MESSAGE = format('the %s key %s of role %s is revoked, its role was dropped, or the key'
                             ' is not of that role', kind, coalesce(quote_literal(left(id, 100)), 'NULL'),
                             coalesce(quote_literal(role), 'NULL')),
            HINT = 'sign with a live key (queue-pg sqs|azure key create)';
    END IF;
    PERFORM set_config('role', role, true);
END $$;
