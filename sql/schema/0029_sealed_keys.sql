-- Revision 0029: endpoint secrets sealed at rest (docs/access.md, "Endpoint keys at rest"). The SQS
-- secrets and Azure account keys are stored sealed (AES-256-GCM) with a key the database never
-- holds: the endpoints and `queue-pg ... key create` have it (QUEUE_PG_SECRET_KEY), so a role that
-- reads these tables, or a dump of them, learns no secret. The rule is here: a row written from
-- now on must hold a sealed secret ('qps1.' key-id '.' base64url of nonce, ciphertext and tag).
-- NOT VALID: rows made before this revision keep their plain secret until `queue-pg secret-key
-- seal` seals them (the migration cannot: it has no key), which then validates the constraint.
ALTER TABLE queue_pg.sqs_keys ADD CONSTRAINT sqs_keys_sealed
    CHECK (secret_key ~ '^qps1\.[0-9a-f]{8}\.[A-Za-z0-9_-]{60,}$') NOT VALID;
ALTER TABLE queue_pg.azure_keys ADD CONSTRAINT azure_keys_sealed
    CHECK (secret_key ~ '^qps1\.[0-9a-f]{8}\.[A-Za-z0-9_-]{60,}$') NOT VALID;

-- Azure's Set Queue Service Properties, by account (docs/azure.md): analytics logging, hour and
-- minute metrics and CORS rules as the SDKs set them, kept and answered (queue_pg acts on none of
-- them). An object of the top-level elements set (Logging, HourMetrics, MinuteMetrics, Cors);
-- those never set answer Azure's defaults (queue_pg.azure_service_properties).
CREATE TABLE queue_pg.azure_service_properties (
    account text PRIMARY KEY CHECK (account ~ '^[a-z0-9]{3,24}$'),
    properties jsonb NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
REVOKE ALL ON queue_pg.azure_service_properties FROM PUBLIC;
