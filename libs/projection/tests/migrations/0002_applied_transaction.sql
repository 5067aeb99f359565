-- The transaction that applied each event: how many a transaction took.
ALTER TABLE applied ADD COLUMN transaction_id BIGINT NOT NULL DEFAULT txid_current();
