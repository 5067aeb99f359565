-- The gateway's read models, rebuilt from the log by the "gateway" projection.
-- Only facts from events go in here (no now(), no serial ids), so a rebuild
-- from sequence 1 produces identical rows. The one exception is
-- lease_usage_minutes, the record of usage beyond the telemetry stream
-- (docs/adr/018), which a rebuild carries over.
--
-- One file per schema: a read model has no history of its own to migrate
-- (docs/adr/025). Columns keep the order in which the API's row builders
-- were written against them.

CREATE TABLE tenants (
    id              UUID PRIMARY KEY,
    name_sealed     TEXT NOT NULL,
    email_sealed    TEXT NOT NULL,
    -- The key given with the tenant's creation; every key, that one
    -- included, is also in tenant_keys.
    api_key_sha256  TEXT NOT NULL UNIQUE,
    max_gpus        INTEGER NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    sequence        BIGINT NOT NULL,
    -- VRAM quota over all the tenant's leases; NULL for none.
    max_vram_gb     INTEGER,
    -- Fair-share weight among tenants in the queue.
    weight          INTEGER NOT NULL DEFAULT 1,
    suspended       BOOLEAN NOT NULL DEFAULT FALSE,
    -- NULL while suspended by an operator (the reason is sealed, below);
    -- reads `erased` once the tenant is erased.
    suspended_reason TEXT,
    -- A prepaid tenant whose balance pricing declared exhausted
    -- (`balance.exhausted`, until `balance.restored`): its new leases are
    -- refused.
    balance_exhausted BOOLEAN NOT NULL DEFAULT FALSE,
    -- A tenant whose data key was destroyed (`tenant.erased`): its sealed
    -- name and e-mail can no longer be opened and it is refused every write.
    erased          BOOLEAN NOT NULL DEFAULT FALSE,
    -- The operator's suspension reason sealed with the tenant's key, as the
    -- event carries it.
    suspended_reason_sealed TEXT
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
    last_sequence       BIGINT NOT NULL,
    -- Priority within the tenant, and the preemption notice given to it.
    priority            INTEGER NOT NULL DEFAULT 0,
    preemption_deadline TIMESTAMPTZ,
    preempted_for       UUID,
    -- A memory-sliced share of one GPU, {"milli": 1..1000, "vram_gb": N};
    -- NULL for whole-GPU leases.
    gpu_fraction        JSONB,
    -- MIG leases: the profile asked for (e.g. "3g.20gb") and the GPU
    -- instance got, {"profile", "start"}; NULL for other leases.
    mig_profile         TEXT,
    mig_instance        JSONB,
    -- Moves off a lost or drained node, and why the last one happened;
    -- started_at stays the first start.
    migrations          INTEGER NOT NULL DEFAULT 0,
    last_migration_reason TEXT,
    -- What the lease runs ({"command": [...], "image": "..."}); the
    -- environment's values are not copied into the read model. NULL when the
    -- lease carries no workload.
    workload            JSONB,
    -- Idle reclaim: the start of the last idle stretch a node reported, and
    -- the last time the lease was suspended for it (state 'suspended' until
    -- POST /v1/leases/{id}/resume).
    idle_since          TIMESTAMPTZ,
    suspended_at        TIMESTAMPTZ,
    -- Spot terms and lineage ({"max_price_cny_per_gpu_hour", "recovery",
    -- "recovery_of"}, only the keys it has), zone and region constraints
    -- ({"zones", "regions"}), and why its preemption notice was given. NULL
    -- when the lease has none.
    spot                JSONB,
    constraints         JSONB,
    preemption_reason   TEXT,
    -- What made a failed lease fail, where its node could tell
    -- (`lease.ended.failure`, e.g. `gpu_memory_exceeded`); NULL otherwise.
    failure             TEXT,
    -- The node and stream sequence of the lease's last placement
    -- (`lease.placed`, or a `lease.migrated` onto a node): the node names its
    -- workload's log by that sequence. Kept when the lease goes back to the
    -- queue, so that the log of its last run can still be read.
    last_placement_node_id  TEXT,
    last_placement_sequence BIGINT
);

CREATE INDEX leases_by_tenant ON leases (tenant_id, requested_sequence DESC);
-- Each lease request counts the tenant's leases waiting for a placement.
CREATE INDEX leases_pending_by_tenant ON leases (tenant_id) WHERE state IN ('requested', 'queued');

-- A tenant's API keys, each issued and revoked by events; key 1 is the one
-- given with the tenant's creation. Times come from the events, so a
-- rebuild produces identical rows.
CREATE TABLE tenant_keys (
    tenant_id   UUID NOT NULL,
    key_id      INTEGER NOT NULL,
    -- The key's visible beginning, as the event that issued it gives it.
    prefix      TEXT NOT NULL,
    sha256      TEXT NOT NULL UNIQUE,
    created_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ,
    revoked_at  TIMESTAMPTZ,
    sequence    BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, key_id)
);

-- What each lease used of each GPU, one row per minute, folded from the
-- usage samples on LH_TELEMETRY (kept 48 hours there; these rows are the
-- record, kept LH_USAGE_KEEP_DAYS, see docs/adr/018). A rebuild carries
-- them over and adds what the stream still holds: `last_sequence` is the
-- newest sample a row counts, so a sample at or below it is never counted
-- twice.
CREATE TABLE lease_usage_minutes (
    lease_id UUID NOT NULL,
    gpu_uuid TEXT NOT NULL,
    -- The minute (UTC) the samples fall in.
    minute TIMESTAMPTZ NOT NULL,
    -- From the lease read model when it knows the lease, else the sample's.
    tenant_id UUID,
    node_id TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    -- Samples whose GPU told its utilisation (MIG mode does not), and the
    -- sum of what they told.
    utilization_samples INTEGER NOT NULL,
    utilization_pct_sum BIGINT NOT NULL,
    memory_used_mib_sum BIGINT NOT NULL,
    memory_used_mib_max BIGINT NOT NULL,
    temperature_c_max INTEGER,
    power_samples INTEGER NOT NULL,
    power_w_sum DOUBLE PRECISION NOT NULL,
    last_sequence BIGINT NOT NULL,
    PRIMARY KEY (lease_id, gpu_uuid, minute)
);

-- The fleet's usage over a window, and the hourly prune of old minutes.
CREATE INDEX lease_usage_minutes_by_minute ON lease_usage_minutes (minute);
-- A tenant's usage over a window.
CREATE INDEX lease_usage_minutes_by_tenant ON lease_usage_minutes (tenant_id, minute);
