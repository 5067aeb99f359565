-- One row per application of an event: no key, so applying one twice shows.
CREATE TABLE applied (sequence BIGINT NOT NULL);
