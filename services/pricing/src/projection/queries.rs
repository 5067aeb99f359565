//! Reads of the invoices projection for the RPCs: a month's charges,
//! invoice and note documents and their list, the cost report and the
//! what-if. Nothing here writes; errors are messages for the RPC caller.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use futures::TryStreamExt as _;
use lh_events::{ChargeAccrued, Tier};
use rust_decimal::Decimal;
use sqlx::PgPool;
use uuid::Uuid;

use crate::what_if::{WhatIf, WhatIfError, MAX_WHAT_IF_CHARGES};

use lh_rpc::charges::{parse_period, ChargeLine, ChargeStatement, ChargeStatementRequest};
use lh_rpc::cost_report::{parse_week, CostReport, CostReportRequest, TierCost};
use lh_rpc::invoice_document::{
    invoice_id, money, Credit, DocumentList, DocumentRequest, DocumentStatus, DocumentSummary,
    InvoiceDocument, Line, ListRequest, MAX_LIST_LIMIT, STORAGE_TIER,
};
use lh_rpc::what_if::{WhatIfReply, WhatIfRequest};

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

/// The charges of `request` as the projection holds them. Errors are
/// messages for the RPC caller.
pub async fn read_charge_statement(
    pool: &PgPool,
    request: &ChargeStatementRequest,
) -> Result<ChargeStatement, String> {
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
        .map(|r| ChargeLine {
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
    Ok(ChargeStatement::new(
        request.tenant_id,
        request.period.clone(),
        lh_domain::rating::CURRENCY.to_string(),
        lines,
    ))
}

fn db_error(e: sqlx::Error) -> String {
    tracing::error!(error = %e, "cannot read invoices");
    "invoices unavailable: database error".to_string()
}

type GroupRow = (
    Uuid,
    String,
    i32,
    i64,
    i64,
    DateTime<Utc>,
    DateTime<Utc>,
    Decimal,
);

/// The lines of a tenant's month from the charges stored after `after` and
/// at or below `through`: what the ledger put on a document of that range.
pub async fn lines_between(
    pool: &PgPool,
    tenant_id: Uuid,
    period: &str,
    after: u64,
    through: u64,
) -> sqlx::Result<Vec<Line>> {
    let rows: Vec<GroupRow> = sqlx::query_as(
        "SELECT lease_id, tier, price_book_version, count(*), sum(billed_seconds)::BIGINT,
                min(from_at), max(to_at), sum(amount)
         FROM invoice_lines
         WHERE tenant_id = $1 AND period = $2 AND sequence > $3 AND sequence <= $4
         GROUP BY lease_id, tier, price_book_version",
    )
    .bind(tenant_id)
    .bind(period)
    .bind(after.min(i64::MAX as u64) as i64)
    .bind(through.min(i64::MAX as u64) as i64)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Line {
            lease_id: r.0,
            tier: r.1,
            price_book_version: r.2 as u32,
            charges: r.3 as u64,
            billed_seconds: r.4 as u64,
            from: r.5,
            to: r.6,
            amount: money(r.7),
        })
        .collect())
}

/// A tenant's invoice of `period` as it stands: no number, every charge so
/// far and the credits waiting for it.
async fn draft(pool: &PgPool, tenant_id: Uuid, period: &str) -> sqlx::Result<InvoiceDocument> {
    let lines = lines_between(pool, tenant_id, period, 0, u64::MAX).await?;
    let (through,): (Option<i64>,) = sqlx::query_as(
        "SELECT max(sequence) FROM invoice_lines WHERE tenant_id = $1 AND period = $2",
    )
    .bind(tenant_id)
    .bind(period)
    .fetch_one(pool)
    .await?;
    let credits: Vec<(Uuid, String, Decimal)> = sqlx::query_as(
        "SELECT credit_id, period, amount FROM credits
         WHERE tenant_id = $1 AND applies_to_period = $2 AND applied_to IS NULL",
    )
    .bind(tenant_id)
    .bind(period)
    .fetch_all(pool)
    .await?;
    let credits = credits
        .into_iter()
        .map(|(credit_id, period, amount)| Credit {
            credit_id,
            period,
            amount: money(amount),
        })
        .collect();
    Ok(InvoiceDocument::draft(
        tenant_id,
        period,
        through.unwrap_or(0) as u64,
        lines,
        credits,
    ))
}

async fn issued(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<InvoiceDocument>> {
    let row: Option<(sqlx::types::Json<InvoiceDocument>,)> =
        sqlx::query_as("SELECT document FROM invoice_documents WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|(d,)| d.0))
}

/// One invoice or note, or `None`. Errors are messages for the RPC caller.
pub async fn read_document(
    pool: &PgPool,
    request: &DocumentRequest,
) -> Result<Option<InvoiceDocument>, String> {
    let (id, tenant) = match request {
        DocumentRequest::ById { id, tenant_id } => (*id, *tenant_id),
        DocumentRequest::ByPeriod { tenant_id, period } => {
            parse_period(period)?;
            (invoice_id(*tenant_id, period), Some(*tenant_id))
        }
    };
    let found = match issued(pool, id).await.map_err(db_error)? {
        Some(document) => Some(document),
        None => {
            let known: Option<(Uuid, String)> =
                sqlx::query_as("SELECT tenant_id, period FROM invoice_drafts WHERE id = $1")
                    .bind(id)
                    .fetch_optional(pool)
                    .await
                    .map_err(db_error)?;
            let known = known.or_else(|| match request {
                // A month with nothing charged yet: its empty draft.
                DocumentRequest::ByPeriod { tenant_id, period } => {
                    Some((*tenant_id, period.clone()))
                }
                DocumentRequest::ById { .. } => None,
            });
            match known {
                Some((tenant_id, period)) => {
                    Some(draft(pool, tenant_id, &period).await.map_err(db_error)?)
                }
                None => None,
            }
        }
    };
    Ok(found.filter(|d| tenant.is_none_or(|t| t == d.tenant_id)))
}

/// Invoices and notes, newest period first. Errors are messages for the
/// RPC caller.
pub async fn list_documents(pool: &PgPool, request: &ListRequest) -> Result<DocumentList, String> {
    if let Some(period) = &request.period {
        parse_period(period)?;
    }
    if request.limit == 0 || request.limit > MAX_LIST_LIMIT {
        return Err(format!("limit must be 1 to {MAX_LIST_LIMIT}"));
    }
    let limit = request.limit as i64;
    let mut invoices: Vec<DocumentSummary> = Vec::new();
    if request.status != Some(DocumentStatus::Draft) {
        let rows: Vec<(sqlx::types::Json<InvoiceDocument>,)> = sqlx::query_as(
            "SELECT document FROM invoice_documents
             WHERE ($1::UUID IS NULL OR tenant_id = $1) AND ($2::TEXT IS NULL OR period = $2)
             ORDER BY period DESC, kind <> 'invoice', number
             LIMIT $3",
        )
        .bind(request.tenant_id)
        .bind(&request.period)
        .bind(limit)
        .fetch_all(pool)
        .await
        .map_err(db_error)?;
        invoices.extend(rows.iter().map(|(d,)| DocumentSummary::from(&d.0)));
    }
    if request.status != Some(DocumentStatus::Issued) {
        let mut drafts: Vec<(Uuid, String)> = sqlx::query_as(
            "SELECT d.tenant_id, d.period FROM invoice_drafts d
             WHERE ($1::UUID IS NULL OR d.tenant_id = $1) AND ($2::TEXT IS NULL OR d.period = $2)
               AND NOT EXISTS (SELECT 1 FROM invoice_documents i WHERE i.id = d.id)
             ORDER BY d.period DESC, d.tenant_id
             LIMIT $3",
        )
        .bind(request.tenant_id)
        .bind(&request.period)
        .bind(limit)
        .fetch_all(pool)
        .await
        .map_err(db_error)?;
        // A tenant's month with nothing yet still has its (empty) draft.
        if let (Some(tenant), Some(period), true) =
            (request.tenant_id, &request.period, drafts.is_empty())
        {
            let issued = issued(pool, invoice_id(tenant, period))
                .await
                .map_err(db_error)?;
            if issued.is_none() {
                drafts.push((tenant, period.clone()));
            }
        }
        for (tenant, period) in drafts {
            let d = draft(pool, tenant, &period).await.map_err(db_error)?;
            invoices.push(DocumentSummary::from(&d));
        }
    }
    invoices.sort_by(|a, b| {
        b.period
            .cmp(&a.period)
            .then(a.tenant_id.cmp(&b.tenant_id))
            .then(
                (a.kind != lh_rpc::invoice_document::DocumentKind::Invoice)
                    .cmp(&(b.kind != lh_rpc::invoice_document::DocumentKind::Invoice)),
            )
            .then(a.number.cmp(&b.number))
    });
    invoices.truncate(request.limit as usize);
    Ok(DocumentList { invoices })
}

type CostRow = (String, i32, Option<Decimal>, bool, i64, i64, Decimal);

/// The tenant's spend in an ISO week per tier, against the same usage at
/// the on-demand price. Errors are messages for the RPC caller.
pub async fn cost_report(pool: &PgPool, request: &CostReportRequest) -> Result<CostReport, String> {
    let (from, to) = parse_week(&request.week)?;
    let rows: Vec<CostRow> = sqlx::query_as(
        "SELECT l.tier, l.vram_gb, b.basic_price,
                COALESCE(l.reservation_id = l.lease_id, false) AS commitment,
                count(*), sum(l.billed_seconds)::BIGINT, sum(l.amount)
         FROM invoice_lines l LEFT JOIN price_books b ON b.version = l.price_book_version
         WHERE l.tenant_id = $1 AND l.from_at >= $2 AND l.from_at < $3
         GROUP BY l.tier, l.vram_gb, b.basic_price, commitment",
    )
    .bind(request.tenant_id)
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await
    .map_err(db_error)?;
    let mut tiers: BTreeMap<String, (u64, u64, Decimal, Decimal)> = BTreeMap::new();
    for (tier, vram_gb, basic_price, commitment, charges, seconds, spend) in rows {
        // A reservation's commitment is paid, not used: the usage it buys
        // is its leases' (charged at 0.00), counted on their own lines. A
        // book without a basic price compares with what was charged.
        // Storage has no on-demand price but its own: it saves nothing.
        let on_demand = match basic_price {
            _ if commitment => Decimal::ZERO,
            _ if tier == STORAGE_TIER => spend,
            Some(price) => {
                Decimal::from(vram_gb) * price * Decimal::from(seconds) / Decimal::from(3600)
            }
            None => spend,
        };
        let t = tiers.entry(tier).or_default();
        t.0 += charges as u64;
        t.1 += seconds as u64;
        t.2 += spend;
        t.3 += on_demand;
    }
    let tiers = tiers
        .into_iter()
        .map(|(tier, (charges, billed_seconds, spend, on_demand))| {
            let (spend, on_demand) = (money(spend), money(on_demand));
            TierCost {
                tier,
                charges,
                billed_seconds,
                spend,
                on_demand,
                saving: money(on_demand - spend),
            }
        })
        .collect();
    Ok(CostReport::new(
        request.tenant_id,
        request.week.clone(),
        (from, to),
        tiers,
    ))
}

type WhatIfRow = (
    Uuid,
    Uuid,
    Uuid,
    String,
    i32,
    i32,
    i64,
    Decimal,
    Decimal,
    String,
    DateTime<Utc>,
    DateTime<Utc>,
    i32,
    Option<Uuid>,
    i64,
);

/// A month's lease charges priced again on another book, per tenant
/// ([`crate::what_if`]); storage lines are left out. A book or period that cannot be used, or a month
/// too large, is refused naming the field; errors are messages for the
/// RPC caller.
pub async fn what_if(pool: &PgPool, request: &WhatIfRequest) -> Result<WhatIfReply, String> {
    let refused = |e: WhatIfError| {
        let (field, detail) = e.refusal();
        WhatIfReply::Refused { field, detail }
    };
    let mut what_if = match WhatIf::new(request.book.clone(), &request.period) {
        Ok(w) => w,
        Err(e) => return Ok(refused(e)),
    };
    let (_, month_end) =
        crate::ledger::month_bounds(&request.period).expect("WhatIf::new checked the period");
    // Counted first, so that a month too large is refused at once rather
    // than after reading it.
    let (charges,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM invoice_lines WHERE period = $1 AND tier <> $2")
            .bind(&request.period)
            .bind(STORAGE_TIER)
            .fetch_one(pool)
            .await
            .map_err(db_error)?;
    if charges as u64 > MAX_WHAT_IF_CHARGES {
        return Ok(refused(WhatIfError::TooLarge(MAX_WHAT_IF_CHARGES)));
    }
    // A row projected without its age (before the column, or a charge
    // written before hourly accrual) takes the lease's billed seconds so
    // far, over every month: a lease that started in an earlier month is
    // that much older.
    let mut rows = sqlx::query_as::<_, WhatIfRow>(
        "SELECT charge_id, tenant_id, lease_id, tier, gpus, vram_gb, billed_seconds, unit_price,
                amount, currency, from_at, to_at, price_book_version, reservation_id, age
         FROM (
             SELECT l.*, COALESCE(l.age_seconds, SUM(l.billed_seconds)
                 OVER (PARTITION BY l.lease_id ORDER BY l.from_at, l.sequence))::BIGINT AS age
             FROM invoice_lines l
             WHERE l.lease_id IN (SELECT lease_id FROM invoice_lines WHERE period = $1)
               AND l.from_at < $2 AND l.tier <> $3
         ) lines
         WHERE period = $1",
    )
    .bind(&request.period)
    .bind(month_end)
    .bind(STORAGE_TIER)
    .fetch(pool);
    while let Some(row) = rows.try_next().await.map_err(db_error)? {
        let charge = charge_of(row, &request.period)?;
        if let Err(e) = what_if.add(&charge) {
            return Ok(refused(e));
        }
    }
    Ok(WhatIfReply::Report(what_if.report()))
}

/// The `charge.accrued` an `invoice_lines` row was projected from, as far
/// as a what-if needs it.
fn charge_of(row: WhatIfRow, period: &str) -> Result<ChargeAccrued, String> {
    let (charge_id, tenant_id, lease_id, tier, gpus, vram_gb, billed_seconds) =
        (row.0, row.1, row.2, row.3, row.4, row.5, row.6);
    let tier = Tier::ALL
        .into_iter()
        .find(|t| t.as_str() == tier)
        .ok_or_else(|| {
            tracing::error!(%charge_id, tier, "an invoice line of an unknown tier");
            "what-if unavailable: a charge of an unknown tier".to_string()
        })?;
    Ok(ChargeAccrued {
        charge_id,
        tenant_id,
        lease_id,
        period: period.to_string(),
        tier,
        gpus: gpus.max(0) as u32,
        vram_gb: vram_gb.max(0) as u32,
        from: row.10,
        to: row.11,
        billed_seconds: billed_seconds.max(0) as u64,
        unit_price_cny_per_gb_hour: row.7,
        // PostgreSQL's 0.00 decodes as a bare 0: money has two places.
        amount: lh_domain::rating::round_amount(row.8),
        currency: row.9,
        price_book_version: row.12.max(0) as u32,
        age_seconds: Some(row.14.max(0) as u64),
        priced_gb_seconds: None,
        reservation_id: row.13,
    })
}
