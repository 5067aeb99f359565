-- What made a failed lease fail, where its node could tell
-- (`lease.ended.failure`, e.g. `gpu_memory_exceeded`); NULL otherwise and
-- for leases that ended before nodes said.
ALTER TABLE leases ADD COLUMN failure TEXT;
