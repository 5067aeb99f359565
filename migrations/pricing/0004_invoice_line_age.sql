-- The lease's billable age at the end of the charge
-- (`charge.accrued.age_seconds`), for a what-if to apply a ladder at the age
-- the lease had. NULL on rows projected before this column and on charges
-- written before hourly accrual: readers take the lease's running sum of
-- billed seconds instead, until the projection is rebuilt from the log.
ALTER TABLE invoice_lines ADD COLUMN age_seconds BIGINT;

-- A what-if reads one month of every tenant, and the history of the
-- month's leases.
CREATE INDEX invoice_lines_period ON invoice_lines (period);
CREATE INDEX invoice_lines_lease ON invoice_lines (lease_id, from_at, sequence);
