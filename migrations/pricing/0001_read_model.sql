-- Pricing's read models, written only by the "invoices" projection of
-- lh-pricing, in the same transaction as its projection offset; rebuilt from
-- the log at will (`lh-pricing rebuild`), so every column is a pure function
-- of the events and their stream sequences.
--
-- One file per schema: a read model has no history of its own to migrate
-- (docs/adr/025).

-- One row per charge.accrued event: what one lease cost within one invoice
-- period (a UTC calendar month).
CREATE TABLE invoice_lines (
    charge_id          UUID        PRIMARY KEY,
    tenant_id          UUID        NOT NULL,
    period             TEXT        NOT NULL,  -- YYYY-MM
    lease_id           UUID        NOT NULL,
    tier               TEXT        NOT NULL,
    gpus               INT         NOT NULL,
    vram_gb            INT         NOT NULL,  -- total over all GPUs of the lease
    billed_seconds     BIGINT      NOT NULL,
    unit_price         NUMERIC     NOT NULL,  -- CNY per GB of VRAM per hour
    amount             NUMERIC     NOT NULL,  -- rounded to 2 places (lh_domain::rating)
    currency           TEXT        NOT NULL,
    from_at            TIMESTAMPTZ NOT NULL,
    to_at              TIMESTAMPTZ NOT NULL,
    price_book_version INT         NOT NULL,
    sequence           BIGINT      NOT NULL,  -- stream sequence of the charge.accrued event
    -- The reservation the charge names (`charge.accrued.reservation_id`):
    -- the reservation itself on its commitment's lines (then equal to
    -- lease_id), the covering one on a reserved lease's. The cost report
    -- leaves the commitment out of "the same usage on demand": the usage is
    -- the leases'.
    reservation_id     UUID,
    -- The lease's billable age at the end of the charge
    -- (`charge.accrued.age_seconds`), for a what-if to apply a ladder at the
    -- age the lease had. NULL where the event does not carry it: readers
    -- then take the lease's running sum of billed seconds.
    age_seconds        BIGINT
);

CREATE INDEX invoice_lines_tenant_period ON invoice_lines (tenant_id, period);
-- A what-if reads one month of every tenant, and the history of the
-- month's leases.
CREATE INDEX invoice_lines_period ON invoice_lines (period);
CREATE INDEX invoice_lines_lease ON invoice_lines (lease_id, from_at, sequence);

-- Issued invoices and notes, one row per invoice.issued or
-- invoice.note_issued event. Every column is a function of the log, so a
-- rebuild gives identical rows (and every document its hash: it is the
-- event's).
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

-- The SLA credits of credit.granted.
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
