-- What auditors filter on, next to each copied event: its tenant, the
-- principal that caused it, the object it is about and its outcome (see
-- lh_events::trail). The keeper fills them from the envelope and the
-- subject; a message it could not decode keeps NULLs there, as it does in
-- event_type and occurred_at.
ALTER TABLE events
    ADD COLUMN tenant_id UUID,
    ADD COLUMN actor     TEXT,
    ADD COLUMN object    TEXT,
    ADD COLUMN outcome   TEXT CHECK (outcome IN ('success', 'failure'));

-- Rows copied before these columns existed are filled from their payload,
-- leniently: bytes that are no JSON envelope leave NULLs. This is the one
-- rewrite the append-only trigger lets through: it adds what the stored
-- bytes already say, and touches neither the bytes nor their hash.
CREATE FUNCTION audit_envelope(payload BYTEA) RETURNS JSONB
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN convert_from(payload, 'UTF8')::jsonb;
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END
$$;

CREATE FUNCTION audit_uuid(text TEXT) RETURNS UUID
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN text::uuid;
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END
$$;

ALTER TABLE events DISABLE TRIGGER events_append_only;
WITH parsed AS (
    SELECT sequence, audit_envelope(payload) AS env FROM events
)
UPDATE events e SET
    tenant_id = audit_uuid(p.env ->> 'tenant_id'),
    actor = CASE p.env -> 'actor' ->> 'kind'
        WHEN 'operator' THEN (p.env -> 'actor' -> 'id' ->> 'role') || ':' || (p.env -> 'actor' -> 'id' ->> 'name')
        WHEN 'admin' THEN 'admin'
        WHEN 'auditor' THEN 'auditor'
        ELSE (p.env -> 'actor' ->> 'kind') || ':' || (p.env -> 'actor' ->> 'id')
    END,
    object = CASE
        WHEN e.subject LIKE 'lh.evt.spot.%' THEN substring(e.subject FROM '^lh\.evt\.(spot\.[^.]+\.[^.]+)')
        ELSE substring(e.subject FROM '^lh\.evt\.([^.]+\.[^.]+)')
    END,
    outcome = CASE
        WHEN e.event_type IS NULL THEN NULL
        WHEN e.event_type IN ('access.refused', 'lease.rejected') THEN 'failure'
        ELSE 'success'
    END
FROM parsed p
WHERE e.sequence = p.sequence;
ALTER TABLE events ENABLE TRIGGER events_append_only;

DROP FUNCTION audit_envelope(BYTEA);
DROP FUNCTION audit_uuid(TEXT);

-- Keyset paging runs on the primary key (sequence); these serve the filters.
CREATE INDEX events_tenant_sequence ON events (tenant_id, sequence) WHERE tenant_id IS NOT NULL;
CREATE INDEX events_actor_sequence ON events (actor, sequence) WHERE actor IS NOT NULL;
CREATE INDEX events_type_sequence ON events (event_type, sequence);
CREATE INDEX events_occurred_at ON events (occurred_at);
CREATE INDEX events_object_sequence ON events (object, sequence) WHERE object IS NOT NULL;
