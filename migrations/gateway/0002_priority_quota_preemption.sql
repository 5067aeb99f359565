-- Issue 4: priorities within a tenant, VRAM quota, fair-share weight,
-- preemption notices.
ALTER TABLE tenants ADD COLUMN max_vram_gb INTEGER;
ALTER TABLE tenants ADD COLUMN weight INTEGER NOT NULL DEFAULT 1;
ALTER TABLE leases ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN preemption_deadline TIMESTAMPTZ;
ALTER TABLE leases ADD COLUMN preempted_for UUID;
