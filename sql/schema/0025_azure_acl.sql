-- Revision 0025: stored access policies of the Azure endpoint's queues (Set / Get Queue ACL),
-- which a queue SAS names with `si`: its start, expiry and permissions come from the policy, so
-- changing or removing the policy changes or revokes every token that names it. At most 5 a
-- queue (Azure's limit, checked by queue_pg.azure_set_acl); gone with their queue.
CREATE TABLE queue_pg.azure_access_policies (
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    id text NOT NULL CHECK (length(id) BETWEEN 1 AND 64),
    start timestamptz,
    expiry timestamptz,
    permission text CHECK (permission ~ '^[raup]*$'),
    PRIMARY KEY (queue_id, id)
);
REVOKE ALL ON queue_pg.azure_access_policies FROM PUBLIC;
