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
