-- Tenants' datasets, one row a version, from `dataset.version_added` and
-- `dataset.removed`. A removed version's row is deleted, and so are all of
-- a tenant's once it is erased. Times come from the events, so a rebuild
-- produces identical rows.
CREATE TABLE datasets (
    dataset_id  UUID NOT NULL,
    tenant_id   UUID NOT NULL,
    name        TEXT NOT NULL,
    -- Lowercase hex SHA-256 of the version's manifest.
    version     TEXT NOT NULL,
    bytes       BIGINT NOT NULL,
    files       BIGINT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    sequence    BIGINT NOT NULL,
    PRIMARY KEY (dataset_id, version)
);

-- A tenant's datasets, listed by name, newest version first.
CREATE INDEX datasets_by_tenant ON datasets (tenant_id, name, created_at DESC);
