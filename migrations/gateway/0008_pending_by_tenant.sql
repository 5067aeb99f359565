-- Each lease request counts the tenant's leases waiting for a placement.
CREATE INDEX leases_pending_by_tenant ON leases (tenant_id) WHERE state IN ('requested', 'queued');
