-- A tenant whose data key was destroyed (`tenant.erased`): its sealed name
-- and e-mail can no longer be opened and it is refused every write.
ALTER TABLE tenants ADD COLUMN erased BOOLEAN NOT NULL DEFAULT FALSE;
