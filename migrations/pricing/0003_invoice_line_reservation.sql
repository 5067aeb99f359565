-- The reservation a charge names (`charge.accrued.reservation_id`): the
-- reservation itself on its commitment's lines (then equal to lease_id),
-- the covering one on a reserved lease's. The cost report leaves the
-- commitment out of "the same usage on demand": the usage is the leases'.
-- Rows projected before this column exist read NULL (as usage) until the
-- projection is rebuilt from the log.
ALTER TABLE invoice_lines ADD COLUMN reservation_id UUID;
