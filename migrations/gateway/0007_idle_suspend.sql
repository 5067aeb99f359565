-- Issue 5: idle reclaim. idle_since is the start of the last idle stretch a
-- node-agent reported; suspended_at the last time the lease was suspended
-- for it (state 'suspended' until POST /v1/leases/{id}/resume).
ALTER TABLE leases ADD COLUMN idle_since TIMESTAMPTZ;
ALTER TABLE leases ADD COLUMN suspended_at TIMESTAMPTZ;
