-- The last divergence between the log and the copy that was recorded as
-- `audit.divergence_detected`: a run that finds the same one again (same
-- first sequence, same kind) records nothing, across restarts and between
-- replicas, so that a broken copy does not flood the log with one event per
-- verify call. One row; a full run that holds clears it.

CREATE TABLE reported_divergence (
    singleton      BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    first_sequence BIGINT NOT NULL CHECK (first_sequence > 0),
    kind           TEXT NOT NULL,
    reported_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
