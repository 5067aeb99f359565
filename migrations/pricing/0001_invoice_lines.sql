-- One row per charge.accrued event: what one lease cost within one invoice
-- period (a UTC calendar month). Written only by the "invoices" projection
-- of lh-pricing, in the same transaction as its projection offset; rebuilt
-- from the log at will (`lh-pricing rebuild`), so every column is a pure
-- function of the event and its stream sequence.
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
    sequence           BIGINT      NOT NULL   -- stream sequence of the charge.accrued event
);

CREATE INDEX invoice_lines_tenant_period ON invoice_lines (tenant_id, period);
