-- Issue 5: leases moved off a lost node. migrations counts the moves;
-- last_migration_reason says why the last one happened. started_at stays
-- the first start.
ALTER TABLE leases ADD COLUMN migrations INT NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN last_migration_reason TEXT;
