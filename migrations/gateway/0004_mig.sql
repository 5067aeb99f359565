-- Issue 4: MIG leases. mig_profile is what the tenant asked for (e.g.
-- "3g.20gb"); mig_instance is the GPU instance it got, {"profile", "start"}.
-- Both NULL for whole-GPU and fractional leases.
ALTER TABLE leases ADD COLUMN mig_profile TEXT;
ALTER TABLE leases ADD COLUMN mig_instance JSONB;
