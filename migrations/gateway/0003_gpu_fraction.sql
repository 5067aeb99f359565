-- Issue 4: fractional (memory-sliced vGPU) leases: one share of one GPU,
-- {"milli": 1..1000, "vram_gb": N}; NULL for whole-GPU leases.
ALTER TABLE leases ADD COLUMN gpu_fraction JSONB;
