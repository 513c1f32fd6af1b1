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
