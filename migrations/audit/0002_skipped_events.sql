-- A message no reader can decode (junk, an unknown event type, a version
-- newer than the keeper knows) is still chained and copied: the chain covers
-- the raw bytes of every stored message. What could not be read of its
-- envelope stays NULL, and `skip_reason` says why it was not decoded
-- (junk, unknown_type, future_version, bad_payload); NULL for an event the
-- keeper decoded.
ALTER TABLE events
    ALTER COLUMN event_id DROP NOT NULL,
    ALTER COLUMN event_type DROP NOT NULL,
    ALTER COLUMN occurred_at DROP NOT NULL,
    ADD COLUMN skip_reason TEXT;
