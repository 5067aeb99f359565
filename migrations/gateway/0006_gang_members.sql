-- A lease that spans several nodes (a gang): every member, in node-rank
-- order, as `{node_id, zone, gpu_uuids, gpu_indices}` (empty for a lease on
-- one node), and the members whose part has started. Such a lease runs
-- once all of them have.
ALTER TABLE leases ADD COLUMN members JSONB NOT NULL DEFAULT '[]'::jsonb;
ALTER TABLE leases ADD COLUMN members_started JSONB NOT NULL DEFAULT '[]'::jsonb;
