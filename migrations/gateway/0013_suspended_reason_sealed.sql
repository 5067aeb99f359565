-- The operator's suspension reason sealed with the tenant's key, as the
-- event carries it; `suspended_reason` then stays NULL (or reads `erased`
-- once the tenant is erased). Suspensions logged before reasons were
-- sealed keep their clear reason there and leave this NULL.
ALTER TABLE tenants ADD COLUMN suspended_reason_sealed TEXT;
