-- Issued invoices and notes, one row per invoice.issued or
-- invoice.note_issued event, and the SLA credits of credit.granted. Written
-- only by the "invoices" projection of lh-pricing in the same transaction as
-- its offset; every column is a function of the log, so a rebuild gives
-- identical rows (and every document its hash: it is the event's).
CREATE TABLE invoice_documents (
    id                       UUID        PRIMARY KEY,
    kind                     TEXT        NOT NULL,  -- invoice, credit_note, debit_note
    number                   TEXT        NOT NULL UNIQUE,
    tenant_id                UUID        NOT NULL,
    period                   TEXT        NOT NULL,  -- YYYY-MM
    refers_to                UUID,                  -- a note's invoice
    total                    NUMERIC     NOT NULL,
    content_hash             TEXT        NOT NULL,
    issued_at                TIMESTAMPTZ NOT NULL,
    charges_after_sequence   BIGINT      NOT NULL,
    charges_through_sequence BIGINT      NOT NULL,
    document                 JSONB       NOT NULL,  -- lh_rpc::invoice_document::InvoiceDocument
    sequence                 BIGINT      NOT NULL
);

CREATE INDEX invoice_documents_tenant_period ON invoice_documents (tenant_id, period);

-- Every tenant's month that has a draft (a charge or a credit to deduct):
-- its invoice id, so that a draft can be found by id.
CREATE TABLE invoice_drafts (
    id        UUID PRIMARY KEY,
    tenant_id UUID NOT NULL,
    period    TEXT NOT NULL
);

CREATE TABLE credits (
    credit_id         UUID    PRIMARY KEY,
    tenant_id         UUID    NOT NULL,
    period            TEXT    NOT NULL,  -- the month measured
    -- The invoice that deducts it: the first of the tenant's months from
    -- the event's applies_to_period on without an issued invoice.
    applies_to_period TEXT    NOT NULL,
    applied_to        UUID,              -- set once that invoice is issued
    amount            NUMERIC NOT NULL,
    calculation       JSONB   NOT NULL,  -- the credit.granted payload
    sequence          BIGINT  NOT NULL
);

CREATE INDEX credits_tenant_applies_to ON credits (tenant_id, applies_to_period);

-- The basic (on-demand) price of every price book version, for the cost
-- report's "the same usage on demand".
CREATE TABLE price_books (
    version     INT     PRIMARY KEY,
    basic_price NUMERIC,            -- CNY per GB-hour; none when the book has no basic tier
    sequence    BIGINT  NOT NULL
);
