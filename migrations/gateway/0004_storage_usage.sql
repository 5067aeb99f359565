-- Each tenant's object storage as the log tells it (`storage.provisioned`,
-- `storage.measured`, `storage.erased`): its bucket and what the gateway
-- last measured it to hold, which the tenant's storage quota counts and
-- the measuring task reads to skip a tenant already measured this
-- interval. Times come from the events, so a rebuild produces identical
-- rows.
CREATE TABLE storage_usage (
    tenant_id   UUID PRIMARY KEY,
    bucket      TEXT NOT NULL,
    erased      BOOLEAN NOT NULL DEFAULT false,
    -- The newest measurement (by `measured_at`); none before the first.
    bytes       BIGINT,
    measured_at TIMESTAMPTZ,
    sequence    BIGINT NOT NULL
);

-- Most object storage the tenant may hold, in GB of 10^9 bytes
-- (`tenant.created` / `tenant.quota_changed` `quota.max_storage_gb`);
-- NULL: no limit.
ALTER TABLE tenants ADD COLUMN max_storage_gb INTEGER;
