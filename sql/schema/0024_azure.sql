-- Revision 0024: the Azure Queue Storage endpoint (queue_pg.azure, docs/azure.md).
-- Account keys: Shared Key and SAS sign with the key itself, so the server must read it back; it
-- is kept here, readable by the schema owner only (no grant to anyone; the endpoint connects as
-- the owner and SET ROLEs to the key's role per request). One live key an account name (a Shared
-- Key request names only its account); a revoked key keeps its row (revoked_at).
CREATE TABLE queue_pg.azure_keys (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account text NOT NULL CHECK (account ~ '^[a-z0-9]{3,24}$'),
    secret_key text NOT NULL CHECK (length(secret_key) >= 32),
    role name NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at timestamptz
);
CREATE UNIQUE INDEX azure_keys_live ON queue_pg.azure_keys (account) WHERE revoked_at IS NULL;
REVOKE ALL ON queue_pg.azure_keys FROM PUBLIC;

-- Azure queue metadata (x-ms-meta-*), by queue: gone with its queue.
CREATE TABLE queue_pg.azure_queue_metadata (
    queue_id integer PRIMARY KEY REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    metadata jsonb NOT NULL DEFAULT '{}'
);
REVOKE ALL ON queue_pg.azure_queue_metadata FROM PUBLIC;
