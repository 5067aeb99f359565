-- The audit service's second, independent copy of the event log, and the
-- checkpoints it signed. Both tables are append-only: a trigger refuses every
-- UPDATE, DELETE and TRUNCATE, so a row once written is never rewritten.
-- (The connection's search_path is the audit schema, so names are unqualified.)

CREATE TABLE events (
    -- Stream sequence in LH_EVENTS.
    sequence    BIGINT PRIMARY KEY CHECK (sequence > 0),
    subject     TEXT NOT NULL,
    event_id    UUID NOT NULL,
    event_type  TEXT NOT NULL,
    occurred_at TIMESTAMPTZ NOT NULL,
    -- The message bytes exactly as JetStream stored them; the chain hashes these.
    payload     BYTEA NOT NULL,
    -- Chain link h_sequence (schemas/audit-chain.md).
    hash        BYTEA NOT NULL CHECK (octet_length(hash) = 32)
);

CREATE TABLE checkpoints (
    -- Stream sequence of the last event the checkpoint covers.
    sequence   BIGINT PRIMARY KEY CHECK (sequence > 0),
    -- Number of events chained up to and including `sequence`.
    events     BIGINT NOT NULL CHECK (events > 0),
    head       BYTEA NOT NULL CHECK (octet_length(head) = 32),
    public_key BYTEA NOT NULL CHECK (octet_length(public_key) = 32),
    signature  BYTEA NOT NULL CHECK (octet_length(signature) = 64),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE FUNCTION refuse_audit_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit table %.% is append-only: % refused',
        TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER events_append_only
    BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION refuse_audit_change();
CREATE TRIGGER events_no_truncate
    BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_audit_change();

CREATE TRIGGER checkpoints_append_only
    BEFORE UPDATE OR DELETE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION refuse_audit_change();
CREATE TRIGGER checkpoints_no_truncate
    BEFORE TRUNCATE ON checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_audit_change();
