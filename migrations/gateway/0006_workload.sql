-- Issue 5: what a lease runs ({"command": [...], "image": "..."}; the
-- environment's values are not copied into the read model). NULL when the
-- lease carries no workload.
ALTER TABLE leases ADD COLUMN workload JSONB;
