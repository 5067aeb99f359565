//! The `invoices` projection: one `invoice_lines` row per `charge.accrued`,
//! and the invoice read from those rows.

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use lh_bus::Stored;
use lh_events::{subject, EventData};
use lh_projection::Projector;
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use lh_rpc::invoice::{parse_period, Invoice, InvoiceLine, InvoiceRequest};

/// Name of the projection's offset row.
pub const NAME: &str = "invoices";
/// The table the projection writes.
pub const TABLE: &str = "invoice_lines";

/// Charges into invoice lines. Every column is a function of the event and
/// its stream sequence, so a rebuild yields byte-identical rows.
#[derive(Debug, Clone, Copy, Default)]
pub struct InvoiceProjector;

impl Projector for InvoiceProjector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn filters(&self) -> &'static [&'static str] {
        &[subject::CHARGES_ALL]
    }

    fn apply<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        event: &'c Stored,
    ) -> BoxFuture<'c, sqlx::Result<()>> {
        Box::pin(async move {
            let EventData::ChargeAccrued(c) = &event.envelope.data else {
                return Ok(());
            };
            sqlx::query(
                "INSERT INTO invoice_lines (charge_id, tenant_id, period, lease_id, tier, gpus,
                    vram_gb, billed_seconds, unit_price, amount, currency, from_at, to_at,
                    price_book_version, sequence)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
                 ON CONFLICT (charge_id) DO NOTHING",
            )
            .bind(c.charge_id)
            .bind(c.tenant_id)
            .bind(&c.period)
            .bind(c.lease_id)
            .bind(c.tier.as_str())
            .bind(c.gpus as i32)
            .bind(c.vram_gb as i32)
            .bind(c.billed_seconds as i64)
            .bind(c.unit_price_cny_per_gb_hour)
            .bind(c.amount)
            .bind(&c.currency)
            .bind(c.from)
            .bind(c.to)
            .bind(c.price_book_version as i32)
            .bind(event.sequence as i64)
            .execute(conn)
            .await?;
            Ok(())
        })
    }
}

type LineRow = (
    Uuid,
    String,
    i32,
    i32,
    i64,
    Decimal,
    Decimal,
    DateTime<Utc>,
    DateTime<Utc>,
    i32,
);

/// The invoice of `request` as the projection holds it. Errors are
/// messages for the RPC caller.
pub async fn read_invoice(pool: &PgPool, request: &InvoiceRequest) -> Result<Invoice, String> {
    parse_period(&request.period)?;
    let rows: Vec<LineRow> = sqlx::query_as(
        "SELECT lease_id, tier, gpus, vram_gb, billed_seconds, unit_price, amount,
                from_at, to_at, price_book_version
         FROM invoice_lines
         WHERE tenant_id = $1 AND period = $2
         ORDER BY from_at, lease_id, charge_id",
    )
    .bind(request.tenant_id)
    .bind(&request.period)
    .fetch_all(pool)
    .await
    .map_err(|e| {
        tracing::error!(error = %e, "cannot read invoice lines");
        "invoice unavailable: database error".to_string()
    })?;
    let lines = rows
        .into_iter()
        .map(|r| InvoiceLine {
            lease_id: r.0,
            tier: r.1,
            gpus: r.2 as u32,
            vram_gb: r.3 as u32,
            billed_seconds: r.4 as u64,
            unit_price: r.5,
            // PostgreSQL keeps 0.00 as a zero with scale 2, but it decodes
            // as a bare 0: re-apply the two places money always has.
            amount: lh_domain::rating::round_amount(r.6),
            from: r.7,
            to: r.8,
            price_book_version: r.9 as u32,
        })
        .collect();
    Ok(Invoice::new(
        request.tenant_id,
        request.period.clone(),
        lh_domain::rating::CURRENCY.to_string(),
        lines,
    ))
}
