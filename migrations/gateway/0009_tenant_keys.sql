-- A tenant's API keys, each issued and revoked by events; key 1 is the one
-- given with the tenant's creation. Times come from the events, so a
-- rebuild produces identical rows.
CREATE TABLE tenant_keys (
    tenant_id   UUID NOT NULL,
    key_id      INTEGER NOT NULL,
    -- The key's visible beginning; NULL for keys issued before prefixes.
    prefix      TEXT,
    sha256      TEXT NOT NULL UNIQUE,
    created_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ,
    revoked_at  TIMESTAMPTZ,
    sequence    BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, key_id)
);

INSERT INTO tenant_keys (tenant_id, key_id, sha256, created_at, sequence)
    SELECT id, 1, api_key_sha256, created_at, sequence FROM tenants;

ALTER TABLE tenants
    ADD COLUMN suspended BOOLEAN NOT NULL DEFAULT FALSE,
    ADD COLUMN suspended_reason TEXT;
