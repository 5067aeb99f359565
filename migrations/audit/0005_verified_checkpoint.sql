-- Where the service's own verification resumes: the newest checkpoint a run
-- verified, so that a verify call checks only what came after it and a
-- restart does not replay the whole log again. One row; the signature is
-- kept so that the resume point is checked against the pinned keys again.

CREATE TABLE verified_checkpoint (
    singleton   BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    sequence    BIGINT NOT NULL CHECK (sequence > 0),
    events      BIGINT NOT NULL CHECK (events > 0),
    head        BYTEA NOT NULL CHECK (length(head) = 32),
    signature   BYTEA NOT NULL CHECK (length(signature) = 64),
    verified_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
