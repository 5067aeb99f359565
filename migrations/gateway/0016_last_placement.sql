-- The node and stream sequence of a lease's last placement (`lease.placed`,
-- or a `lease.migrated` onto a node): the node names its workload's log by
-- that sequence. Kept when the lease goes back to the queue, so that the
-- log of its last run can still be read; NULL for rows from before.
ALTER TABLE leases ADD COLUMN last_placement_node_id TEXT;
ALTER TABLE leases ADD COLUMN last_placement_sequence BIGINT;
