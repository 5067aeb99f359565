-- Read models of the gateway, rebuilt from the log by the "gateway" projection.
-- Only facts from events go in here (no now(), no serial ids), so a rebuild
-- from sequence 1 produces identical rows.

CREATE TABLE tenants (
    id              UUID PRIMARY KEY,
    name_sealed     TEXT NOT NULL,
    email_sealed    TEXT NOT NULL,
    api_key_sha256  TEXT NOT NULL UNIQUE,
    max_gpus        INTEGER NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    sequence        BIGINT NOT NULL
);

CREATE TABLE leases (
    id                  UUID PRIMARY KEY,
    tenant_id           UUID NOT NULL,
    state               TEXT NOT NULL,
    gpus                INTEGER NOT NULL,
    gpu_model           TEXT NOT NULL,
    tier                TEXT NOT NULL,
    idempotency_key     TEXT,
    node_id             TEXT,
    zone                TEXT,
    gpu_uuids           JSONB NOT NULL DEFAULT '[]',
    gpu_indices         JSONB NOT NULL DEFAULT '[]',
    queued_reason       TEXT,
    queue_position      INTEGER,
    rejected_reason     TEXT,
    stop_requested      BOOLEAN NOT NULL DEFAULT FALSE,
    end_reason          TEXT,
    created_at          TIMESTAMPTZ NOT NULL,
    placed_at           TIMESTAMPTZ,
    started_at          TIMESTAMPTZ,
    ended_at            TIMESTAMPTZ,
    requested_sequence  BIGINT NOT NULL,
    last_sequence       BIGINT NOT NULL
);

CREATE INDEX leases_by_tenant ON leases (tenant_id, requested_sequence DESC);
