//! The invoices projector: `charge.accrued` and `charge.storage_accrued`
//! into `invoice_lines` and the month's draft, documents, credits and
//! price books into their rows. A lease's charges are written in multi-row
//! statements, one alone the same way, so each row has one statement shape
//! whatever the batch; a storage charge (one an hour per tenant) alone.

use futures::future::BoxFuture;
use lh_bus::Stored;
use lh_events::{subject, ChargeAccrued, EventData, StorageChargeAccrued};
use lh_projection::Projector;
use lh_rpc::invoice_document::{invoice_id, InvoiceDocument};
use sqlx::PgConnection;
use uuid::Uuid;

use super::NAME;

/// Charges into invoice lines. Every column is a function of the event and
/// its stream sequence, so a rebuild yields byte-identical rows.
#[derive(Debug, Clone, Copy, Default)]
pub struct InvoiceProjector;

impl Projector for InvoiceProjector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn filters(&self) -> &'static [&'static str] {
        &[
            subject::CHARGES_ALL,
            subject::INVOICES_ALL,
            subject::CREDITS_ALL,
            subject::PRICE_BOOKS_ALL,
        ]
    }

    fn apply<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        event: &'c Stored,
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async move {
            match &event.envelope.data {
                EventData::ChargeAccrued(c) => insert_charges(conn, &[(c, event.sequence)]).await,
                EventData::StorageChargeAccrued(c) => {
                    insert_storage_charge(conn, c, event.sequence).await
                }
                EventData::InvoiceIssued(e) => {
                    let document = InvoiceDocument::from_invoice(e);
                    insert_document(conn, &document, event.sequence).await?;
                    let used: Vec<Uuid> = e.credits.iter().map(|c| c.credit_id).collect();
                    sqlx::query("UPDATE credits SET applied_to = $1 WHERE credit_id = ANY($2)")
                        .bind(e.invoice_id)
                        .bind(&used)
                        .execute(&mut *conn)
                        .await?;
                    // As the ledger does: a credit meant for this month
                    // that the invoice does not carry moves to the next,
                    // once the last part (the one that deducts) is in.
                    let last_part = e.part >= e.parts;
                    if let Some(next) = crate::ledger::next_period(&e.period).filter(|_| last_part)
                    {
                        sqlx::query(
                            "UPDATE credits SET applies_to_period = $1
                             WHERE tenant_id = $2 AND applies_to_period = $3 AND applied_to IS NULL",
                        )
                        .bind(&next)
                        .bind(e.tenant_id)
                        .bind(&e.period)
                        .execute(&mut *conn)
                        .await?;
                        insert_draft(conn, e.tenant_id, &next, true).await?;
                    }
                    Ok(())
                }
                EventData::InvoiceNoteIssued(e) => {
                    insert_document(conn, &InvoiceDocument::from_note(e), event.sequence).await
                }
                EventData::CreditGranted(e) => insert_credit(conn, e, event.sequence).await,
                EventData::PriceBookPublished(book) => {
                    insert_price_book(conn, book, event.sequence).await
                }
                // A book whose first statement expired is carried here.
                EventData::PriceBookRestated(r) => {
                    for stated in &r.history {
                        if let EventData::PriceBookPublished(book) = &stated.envelope.data {
                            insert_price_book(&mut *conn, book, stated.sequence).await?;
                        }
                    }
                    Ok(())
                }
                _ => Ok(()),
            }
        })
    }

    fn apply_batch<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        events: &'c [&'c Stored],
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async move {
            // Charges follow each other in a backlog; anything else is
            // applied on its own, after the charges before it.
            let mut charges: Vec<(&ChargeAccrued, u64)> = Vec::new();
            for &event in events {
                match &event.envelope.data {
                    EventData::ChargeAccrued(c) => charges.push((c, event.sequence)),
                    _ => {
                        insert_charges(&mut *conn, &charges).await?;
                        charges.clear();
                        self.apply(&mut *conn, event).await?;
                    }
                }
            }
            insert_charges(conn, &charges).await
        })
    }
}

/// Most charges one multi-row statement writes.
const MAX_CHARGES_PER_STATEMENT: usize = 1024;

/// Consecutive charges (one alone, too): a statement for their lines and
/// one for their drafts, so that every `invoice_lines` row is written by
/// one statement shape. The first of a charge's repeats keeps its line.
async fn insert_charges(
    conn: &mut PgConnection,
    charges: &[(&ChargeAccrued, u64)],
) -> sqlx::Result<()> {
    for chunk in charges.chunks(MAX_CHARGES_PER_STATEMENT) {
        let mut seen = std::collections::HashSet::new();
        let chunk: Vec<_> = chunk
            .iter()
            .filter(|(c, _)| seen.insert(c.charge_id))
            .collect();
        sqlx::query(
            "INSERT INTO invoice_lines (charge_id, tenant_id, period, lease_id, tier, gpus,
                vram_gb, billed_seconds, unit_price, amount, currency, from_at, to_at,
                price_book_version, sequence, reservation_id, age_seconds)
             SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::uuid[], $5::text[],
                $6::int4[], $7::int4[], $8::int8[], $9::numeric[], $10::numeric[], $11::text[],
                $12::timestamptz[], $13::timestamptz[], $14::int4[], $15::int8[], $16::uuid[],
                $17::int8[])
             ON CONFLICT (charge_id) DO NOTHING",
        )
        .bind(chunk.iter().map(|(c, _)| c.charge_id).collect::<Vec<_>>())
        .bind(chunk.iter().map(|(c, _)| c.tenant_id).collect::<Vec<_>>())
        .bind(
            chunk
                .iter()
                .map(|(c, _)| c.period.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(chunk.iter().map(|(c, _)| c.lease_id).collect::<Vec<_>>())
        .bind(
            chunk
                .iter()
                .map(|(c, _)| c.tier.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(chunk.iter().map(|(c, _)| c.gpus as i32).collect::<Vec<_>>())
        .bind(
            chunk
                .iter()
                .map(|(c, _)| c.vram_gb as i32)
                .collect::<Vec<_>>(),
        )
        .bind(
            chunk
                .iter()
                .map(|(c, _)| c.billed_seconds as i64)
                .collect::<Vec<_>>(),
        )
        .bind(
            chunk
                .iter()
                .map(|(c, _)| c.unit_price_cny_per_gb_hour)
                .collect::<Vec<_>>(),
        )
        .bind(chunk.iter().map(|(c, _)| c.amount).collect::<Vec<_>>())
        .bind(
            chunk
                .iter()
                .map(|(c, _)| c.currency.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(chunk.iter().map(|(c, _)| c.from).collect::<Vec<_>>())
        .bind(chunk.iter().map(|(c, _)| c.to).collect::<Vec<_>>())
        .bind(
            chunk
                .iter()
                .map(|(c, _)| c.price_book_version as i32)
                .collect::<Vec<_>>(),
        )
        .bind(chunk.iter().map(|(_, s)| *s as i64).collect::<Vec<_>>())
        .bind(
            chunk
                .iter()
                .map(|(c, _)| c.reservation_id)
                .collect::<Vec<_>>(),
        )
        .bind(
            chunk
                .iter()
                .map(|(c, _)| c.age_seconds.map(|s| s.min(i64::MAX as u64) as i64))
                .collect::<Vec<_>>(),
        )
        .execute(&mut *conn)
        .await?;
        let mut drafts = std::collections::BTreeMap::new();
        for (c, _) in &chunk {
            drafts
                .entry(invoice_id(c.tenant_id, &c.period))
                .or_insert((c.tenant_id, c.period.as_str()));
        }
        sqlx::query(
            "INSERT INTO invoice_drafts (id, tenant_id, period)
             SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[])
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(drafts.keys().copied().collect::<Vec<_>>())
        .bind(drafts.values().map(|(t, _)| *t).collect::<Vec<_>>())
        .bind(drafts.values().map(|(_, p)| *p).collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// A storage charge as an invoice line of its own: tier `storage`, the
/// tenant's storage id in `lease_id`, no GPUs, and in `unit_price` the
/// book's price per GB (10^9 bytes) per month.
async fn insert_storage_charge(
    conn: &mut PgConnection,
    c: &StorageChargeAccrued,
    sequence: u64,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO invoice_lines (charge_id, tenant_id, period, lease_id, tier, gpus,
            vram_gb, billed_seconds, unit_price, amount, currency, from_at, to_at,
            price_book_version, sequence, reservation_id, age_seconds)
         VALUES ($1, $2, $3, $4, $5, 0, 0, $6, $7, $8, $9, $10, $11, $12, $13, NULL, NULL)
         ON CONFLICT (charge_id) DO NOTHING",
    )
    .bind(c.charge_id)
    .bind(c.tenant_id)
    .bind(&c.period)
    .bind(c.storage_id)
    .bind(lh_rpc::invoice_document::STORAGE_TIER)
    .bind(c.billed_seconds.min(i64::MAX as u64) as i64)
    .bind(c.price_cny_per_gb_month)
    .bind(c.amount)
    .bind(&c.currency)
    .bind(c.from)
    .bind(c.to)
    .bind(c.price_book_version as i32)
    .bind(sequence as i64)
    .execute(&mut *conn)
    .await?;
    insert_draft(conn, c.tenant_id, &c.period, false).await
}

/// Records that the tenant's month has a draft; with `only_with_credits`,
/// only where a credit waits for that month.
async fn insert_draft(
    conn: &mut PgConnection,
    tenant_id: Uuid,
    period: &str,
    only_with_credits: bool,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO invoice_drafts (id, tenant_id, period)
         SELECT $1, $2, $3
         WHERE NOT $4 OR EXISTS (SELECT 1 FROM credits
             WHERE tenant_id = $2 AND applies_to_period = $3 AND applied_to IS NULL)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(invoice_id(tenant_id, period))
    .bind(tenant_id)
    .bind(period)
    .bind(only_with_credits)
    .execute(conn)
    .await?;
    Ok(())
}

async fn insert_document(
    conn: &mut PgConnection,
    d: &InvoiceDocument,
    sequence: u64,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO invoice_documents (id, kind, number, tenant_id, period, refers_to, total,
            content_hash, issued_at, charges_after_sequence, charges_through_sequence,
            document, sequence)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(d.id)
    .bind(d.kind.as_str())
    .bind(d.number.as_deref().unwrap_or_default())
    .bind(d.tenant_id)
    .bind(&d.period)
    .bind(d.refers_to)
    .bind(d.total)
    .bind(&d.content_hash)
    .bind(d.issued_at)
    .bind(d.charges_after_sequence as i64)
    .bind(d.charges_through_sequence as i64)
    .bind(sqlx::types::Json(d))
    .bind(sequence as i64)
    .execute(conn)
    .await?;
    Ok(())
}

async fn insert_credit(
    conn: &mut PgConnection,
    e: &lh_events::CreditGranted,
    sequence: u64,
) -> sqlx::Result<()> {
    // Deducted by the first of the tenant's months from applies_to_period
    // on whose invoice is not issued yet: not wholly, when only some of its
    // parts are (the last deducts).
    let mut period = e.applies_to_period.clone();
    for _ in 0..MAX_CREDIT_ROLL_MONTHS {
        let issued: Option<(Uuid,)> = sqlx::query_as(
            "SELECT id FROM invoice_documents
             WHERE tenant_id = $1 AND period = $2 AND kind = 'invoice'
               AND COALESCE((document->>'part')::INT, 1) = COALESCE((document->>'parts')::INT, 1)",
        )
        .bind(e.tenant_id)
        .bind(&period)
        .fetch_optional(&mut *conn)
        .await?;
        match crate::ledger::next_period(&period) {
            Some(next) if issued.is_some() => period = next,
            _ => break,
        }
    }
    sqlx::query(
        "INSERT INTO credits (credit_id, tenant_id, period, applies_to_period, amount,
            calculation, sequence)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (credit_id) DO NOTHING",
    )
    .bind(e.credit_id)
    .bind(e.tenant_id)
    .bind(&e.period)
    .bind(&period)
    .bind(e.amount)
    .bind(sqlx::types::Json(e))
    .bind(sequence as i64)
    .execute(&mut *conn)
    .await?;
    insert_draft(conn, e.tenant_id, &period, false).await
}

async fn insert_price_book(
    conn: &mut PgConnection,
    book: &lh_events::PriceBookPublished,
    sequence: u64,
) -> sqlx::Result<()> {
    let basic = lh_domain::rating::unit_price(book, lh_events::Tier::Basic);
    sqlx::query(
        "INSERT INTO price_books (version, basic_price, sequence) VALUES ($1, $2, $3)
         ON CONFLICT (version) DO NOTHING",
    )
    .bind(book.version as i32)
    .bind(basic)
    .bind(sequence as i64)
    .execute(conn)
    .await?;
    Ok(())
}

/// Months a credit moves on at most, past issued invoices.
const MAX_CREDIT_ROLL_MONTHS: usize = 12;
