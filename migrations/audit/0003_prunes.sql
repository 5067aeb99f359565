-- Once the log's oldest events expire, the audit copy is pruned in step with
-- it (ADR 011, decision 4). A prune is recorded here, in the same transaction
-- as the copy of the `audit.pruned` event that asked for it, and the
-- append-only triggers of `events` and `checkpoints` then let through a
-- DELETE of a row below the newest recorded anchor, and nothing else: rows
-- from the anchor on, UPDATE and TRUNCATE stay refused.

CREATE TABLE prunes (
    -- Sequence of the signed checkpoint verification rests on afterwards.
    anchor_checkpoint BIGINT PRIMARY KEY CHECK (anchor_checkpoint > 0),
    -- The log's first sequence when the prune was decided.
    below_sequence    BIGINT NOT NULL CHECK (below_sequence > anchor_checkpoint),
    -- Stream sequence of the `audit.pruned` event.
    event_sequence    BIGINT NOT NULL,
    pruned_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TRIGGER prunes_append_only
    BEFORE UPDATE OR DELETE ON prunes
    FOR EACH ROW EXECUTE FUNCTION refuse_audit_change();
CREATE TRIGGER prunes_no_truncate
    BEFORE TRUNCATE ON prunes
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_audit_change();

-- The schema is named from the trigger, not the search_path, so that a
-- session on another search_path is refused with the same message.
CREATE FUNCTION refuse_audit_change_but_prunes() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    anchor BIGINT;
BEGIN
    IF TG_OP = 'DELETE' THEN
        EXECUTE format('SELECT max(anchor_checkpoint) FROM %I.prunes', TG_TABLE_SCHEMA)
            INTO anchor;
        IF OLD.sequence < anchor THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'audit table %.% is append-only: % refused',
        TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

DROP TRIGGER events_append_only ON events;
CREATE TRIGGER events_append_only
    BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION refuse_audit_change_but_prunes();

DROP TRIGGER checkpoints_append_only ON checkpoints;
CREATE TRIGGER checkpoints_append_only
    BEFORE UPDATE OR DELETE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION refuse_audit_change_but_prunes();
