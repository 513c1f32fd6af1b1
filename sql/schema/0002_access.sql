-- queue_pg schema, revision 0002: access control.
-- Three group roles (cluster-wide, NOLOGIN), per-queue grants, and every table closed to PUBLIC:
-- other roles reach the data only through the functions (SECURITY DEFINER, see sql/api/60_access.sql).

-- Roles belong to the cluster, not the database: a second database on the same server finds them
-- made already. A migrator that may not create roles gets a warning and an install that only
-- superusers and the owner can use, until a DBA creates the roles and the api is re-applied.
DO $$
DECLARE
    r text;
    may boolean;
BEGIN
    SELECT rolsuper OR rolcreaterole INTO may FROM pg_catalog.pg_roles WHERE rolname = current_user;
    FOREACH r IN ARRAY ARRAY['queue_pg_admin', 'queue_pg_producer', 'queue_pg_consumer'] LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r);
        IF NOT may THEN
            RAISE WARNING 'queue_pg: role % is missing and % may not create roles; run CREATE ROLE % NOLOGIN as a superuser, then queue-pg migrate --reapply-api',
                r, current_user, r;
            CONTINUE;
        END IF;
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- another database's migration made it just now
        END;
    END LOOP;
END $$;

-- Who may do what on which queue. A grant names a role by oid (pg_roles.oid: a rename keeps it);
-- it works for that role and every role that has its privileges. Dropping the queue drops its
-- grants; dropping the role leaves a grant to nobody (list_grants shows the bare oid).
CREATE TABLE queue_pg.grants (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    role oid NOT NULL,
    privilege text NOT NULL CHECK (privilege IN ('send', 'receive', 'manage')),
    granted_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    PRIMARY KEY (queue_id, role, privilege)
);

-- What list_grants returns.
CREATE TYPE queue_pg.grant_info AS (
    queue text,
    role text,
    privilege text,
    granted_at timestamptz
);

-- Closed to PUBLIC: whatever default privileges the database had, no table, sequence or function
-- of the schema is anyone's but its owner's; sql/api/60_access.sql grants EXECUTE by role.
REVOKE ALL ON ALL TABLES IN SCHEMA queue_pg FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA queue_pg FROM PUBLIC;
REVOKE ALL ON SCHEMA queue_pg FROM PUBLIC;
