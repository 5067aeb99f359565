-- Whether the tenant's last measurement found it over its storage quota
-- (`storage.measured` `writes_stopped`): its identity may then read, list
-- and delete in its bucket, but not write.
ALTER TABLE storage_usage ADD COLUMN writes_stopped BOOLEAN NOT NULL DEFAULT false;
