-- A lease's spot terms and lineage ({"max_price_cny_per_gpu_hour",
-- "recovery", "recovery_of"}, only the keys it has), its zone and region
-- constraints ({"zones", "regions"}), and why its preemption notice was
-- given. NULL when the lease has none.
ALTER TABLE leases ADD COLUMN spot JSONB;
ALTER TABLE leases ADD COLUMN constraints JSONB;
ALTER TABLE leases ADD COLUMN preemption_reason TEXT;
