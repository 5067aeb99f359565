-- A prepaid tenant whose balance pricing declared exhausted
-- (`balance.exhausted`, until `balance.restored`): its new leases are refused.
ALTER TABLE tenants ADD COLUMN balance_exhausted BOOLEAN NOT NULL DEFAULT FALSE;
