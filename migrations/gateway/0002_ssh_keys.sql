-- Tenants' SSH public keys, added and removed by events (`ssh_key.added`,
-- `ssh_key.removed`), which the gateway's SSH endpoint signs people in with.
-- A removed key's row is deleted, and so are all of a tenant's once it is
-- erased, so that the endpoint finds only the keys that let someone in.
-- Times come from the events, so a rebuild produces identical rows.
CREATE TABLE ssh_keys (
    key_id      UUID PRIMARY KEY,
    tenant_id   UUID NOT NULL,
    name        TEXT NOT NULL,
    -- The OpenSSH one-line form, algorithm and base64, without a comment.
    public_key  TEXT NOT NULL,
    -- `SHA256:...`, as `ssh-keygen -l` prints it.
    fingerprint TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    sequence    BIGINT NOT NULL
);

-- A tenant's keys, listed and counted; one key once per tenant.
CREATE UNIQUE INDEX ssh_keys_by_tenant ON ssh_keys (tenant_id, fingerprint);
