//! Invoices and notes, and a month's charges, answered by the pricing
//! service from its projection:
//!
//! - `GET /v1/invoices`: the caller's invoices and notes (the admin's: any
//!   tenant's), newest month first, filtered by `period` and `status`;
//! - `GET /v1/invoices/{id}`: one invoice or note; `{id}` is its id, or a
//!   month `YYYY-MM` for the caller's invoice of that month (a draft, empty
//!   when nothing was charged yet, until it is issued; its first part, when
//!   issued in parts: each part says `part` and `parts`, and is listed);
//! - `GET /v1/invoices/{id}/csv`: the same as CSV (`text/csv`);
//! - `GET /v1/charges?period=YYYY-MM`: every charge of a month, one line
//!   each, with a content hash (a statement of the charges, not an invoice);
//! - `GET /v1/reports/cost?week=YYYY-Www`: the tenant's spend by tier in an
//!   ISO week against the same usage at the on-demand price.

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::{ApiContext, ApiError, Caller, RPC_TIMEOUT};

use lh_rpc::charges::{ChargeStatement, ChargeStatementRequest};
use lh_rpc::cost_report::{CostReport, CostReportRequest};
use lh_rpc::invoice_document::{
    DocumentList, DocumentRequest, DocumentStatus, InvoiceDocument, ListRequest,
    DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT,
};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ChargesQuery {
    /// `YYYY-MM` (UTC calendar month).
    pub period: Option<String>,
    /// Admin only: whose charges.
    pub tenant_id: Option<Uuid>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only this month, `YYYY-MM`.
    pub period: Option<String>,
    /// `draft` or `issued`.
    pub status: Option<String>,
    /// Whose invoices: the admin may name any tenant (or none: all); a
    /// tenant only itself.
    pub tenant_id: Option<Uuid>,
    /// At most this many (1 to 500; 100 by default).
    pub limit: Option<u32>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct DocumentQuery {
    /// With a month as `{id}`: whose invoice (required for the admin).
    pub tenant_id: Option<Uuid>,
}

/// The tenant a tenant caller may see: its own, and nobody else's (another
/// tenant's is not found, so that its existence is not told).
fn own_tenant(caller: &Caller, asked: Option<Uuid>) -> Result<Option<Uuid>, ApiError> {
    match (caller, asked) {
        (Caller::Tenant { id, .. }, None) => Ok(Some(*id)),
        (Caller::Tenant { id, .. }, Some(asked)) if asked == *id => Ok(Some(*id)),
        (Caller::Tenant { .. }, Some(_)) => {
            Err(ApiError::not_found("no such tenant").field("tenant_id"))
        }
        (Caller::Operator(_), asked) => Ok(asked),
    }
}

fn check_period(period: &str, field: &str) -> Result<(), ApiError> {
    lh_rpc::charges::parse_period(period).map_err(|why| ApiError::unprocessable(why, field))?;
    Ok(())
}

#[utoipa::path(
    get, path = "/v1/charges", params(ChargesQuery),
    responses(
        (status = 200, body = ChargeStatement, description = "every charge of the month, one line each"),
        (status = 401, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn charges(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<ChargesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ChargeStatement>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let period = query
        .period
        .ok_or_else(|| ApiError::unprocessable("period is required (YYYY-MM)", "period"))?;
    check_period(&period, "period")?;
    let tenant_id = own_tenant(&caller, query.tenant_id)?.ok_or_else(|| {
        ApiError::unprocessable("tenant_id is required for the admin", "tenant_id")
    })?;
    let request = ChargeStatementRequest { tenant_id, period };
    let statement = lh_rpc::charges::call(&ctx.bus, &request, RPC_TIMEOUT).await?;
    Ok(Json(statement))
}

#[utoipa::path(
    get, path = "/v1/invoices", params(ListQuery),
    responses(
        (status = 200, body = DocumentList),
        (status = 401, body = super::Problem), (status = 404, body = super::Problem),
        (status = 422, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn list(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<DocumentList>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if let Some(period) = &query.period {
        check_period(period, "period")?;
    }
    let status = match query.status.as_deref() {
        None => None,
        Some("draft") => Some(DocumentStatus::Draft),
        Some("issued") => Some(DocumentStatus::Issued),
        Some(_) => {
            return Err(ApiError::unprocessable(
                "status must be draft or issued",
                "status",
            ))
        }
    };
    let limit = query.limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if limit == 0 || limit > MAX_LIST_LIMIT {
        return Err(ApiError::unprocessable(
            format!("limit must be 1 to {MAX_LIST_LIMIT}"),
            "limit",
        ));
    }
    let request = ListRequest {
        tenant_id: own_tenant(&caller, query.tenant_id)?,
        period: query.period,
        status,
        limit,
    };
    Ok(Json(
        lh_rpc::invoice_document::list(&ctx.bus, &request, RPC_TIMEOUT).await?,
    ))
}

async fn find(
    ctx: &ApiContext,
    caller: &Caller,
    id: &str,
    query: Result<Query<DocumentQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<InvoiceDocument, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let tenant = own_tenant(caller, query.tenant_id)?;
    let request = if let Ok(id) = Uuid::parse_str(id) {
        DocumentRequest::ById {
            id,
            tenant_id: tenant,
        }
    } else {
        check_period(id, "id").map_err(|_| {
            ApiError::unprocessable("id must be an invoice id or a month YYYY-MM", "id")
        })?;
        let tenant_id = tenant.ok_or_else(|| {
            ApiError::unprocessable("tenant_id is required for the admin", "tenant_id")
        })?;
        DocumentRequest::ByPeriod {
            tenant_id,
            period: id.to_string(),
        }
    };
    lh_rpc::invoice_document::document(&ctx.bus, &request, RPC_TIMEOUT)
        .await?
        .ok_or_else(|| ApiError::not_found("no such invoice").field("id"))
}

#[utoipa::path(
    get, path = "/v1/invoices/{id}", params(("id" = String, Path, description = "invoice or note id, or a month YYYY-MM"), DocumentQuery),
    responses(
        (status = 200, body = InvoiceDocument),
        (status = 401, body = super::Problem), (status = 404, body = super::Problem),
        (status = 422, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn show(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<DocumentQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<InvoiceDocument>, ApiError> {
    Ok(Json(find(&ctx, &caller, &id, query).await?))
}

#[utoipa::path(
    get, path = "/v1/invoices/{id}/csv", params(("id" = String, Path, description = "invoice or note id, or a month YYYY-MM"), DocumentQuery),
    responses(
        (status = 200, content_type = "text/csv", body = String,
         description = "a header row, one row per line and per credit, a total row"),
        (status = 401, body = super::Problem), (status = 404, body = super::Problem),
        (status = 422, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn csv(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<DocumentQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let document = find(&ctx, &caller, &id, query).await?;
    let file = format!(
        "attachment; filename=\"{}.csv\"",
        document
            .number
            .clone()
            .unwrap_or_else(|| format!("draft-{}", document.period))
    );
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
            (header::CONTENT_DISPOSITION, file),
        ],
        document.to_csv(),
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct CostQuery {
    /// ISO week, `YYYY-Www` (`2026-W49`).
    pub week: Option<String>,
    /// Whose (required for the admin; a tenant only itself).
    pub tenant_id: Option<Uuid>,
}

#[utoipa::path(
    get, path = "/v1/reports/cost", params(CostQuery),
    responses(
        (status = 200, body = CostReport,
         description = "spend by tier in the week, the same usage at the on-demand price, the saving"),
        (status = 401, body = super::Problem), (status = 404, body = super::Problem),
        (status = 422, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn cost_report(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<CostQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<CostReport>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let week = query
        .week
        .ok_or_else(|| ApiError::unprocessable("week is required (YYYY-Www)", "week"))?;
    lh_rpc::cost_report::parse_week(&week).map_err(|why| ApiError::unprocessable(why, "week"))?;
    let tenant_id = own_tenant(&caller, query.tenant_id)?.ok_or_else(|| {
        ApiError::unprocessable("tenant_id is required for the admin", "tenant_id")
    })?;
    let request = CostReportRequest { tenant_id, week };
    Ok(Json(
        lh_rpc::cost_report::call(&ctx.bus, &request, RPC_TIMEOUT).await?,
    ))
}
