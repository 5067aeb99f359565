//! `GET /v1/invoices?period=YYYY-MM`: the tenant's invoice for a month,
//! answered by the pricing service from its invoice projection.

use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::{ApiContext, ApiError, Caller, RPC_TIMEOUT};

/// Subject on which pricing answers invoice requests.
pub const INVOICE_SUBJECT: &str = "lh.rpc.pricing.invoice";

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct InvoiceQuery {
    /// `YYYY-MM` (UTC calendar month).
    pub period: Option<String>,
    /// Admin only: whose invoice.
    pub tenant_id: Option<Uuid>,
}

pub fn valid_period(period: &str) -> bool {
    let b = period.as_bytes();
    b.len() == 7
        && b[4] == b'-'
        && b[..4].iter().chain(&b[5..]).all(u8::is_ascii_digit)
        && matches!(period[5..].parse::<u32>(), Ok(1..=12))
}

#[utoipa::path(
    get, path = "/v1/invoices", params(InvoiceQuery),
    responses(
        (status = 200, description = "`{tenant_id, period, currency, lines[], total, content_hash}`"),
        (status = 401, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn show(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<InvoiceQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let period = query
        .period
        .ok_or_else(|| ApiError::unprocessable("period is required (YYYY-MM)", "period"))?;
    if !valid_period(&period) {
        return Err(ApiError::unprocessable("period must be YYYY-MM", "period"));
    }
    let tenant_id = match (&caller, query.tenant_id) {
        (Caller::Tenant { id, .. }, None) => *id,
        (Caller::Tenant { id, .. }, Some(asked)) if asked == *id => *id,
        (Caller::Tenant { .. }, Some(_)) => {
            return Err(ApiError::not_found("no such tenant").field("tenant_id"))
        }
        (Caller::Admin | Caller::Auditor, Some(asked)) => asked,
        (Caller::Admin | Caller::Auditor, None) => {
            return Err(ApiError::unprocessable(
                "tenant_id is required for the admin",
                "tenant_id",
            ))
        }
    };
    let invoice: serde_json::Value = lh_bus::rpc::call(
        &ctx.bus,
        INVOICE_SUBJECT,
        &serde_json::json!({ "tenant_id": tenant_id, "period": period }),
        RPC_TIMEOUT,
    )
    .await?;
    Ok(Json(invoice))
}

#[cfg(test)]
mod tests {
    #[test]
    fn periods() {
        assert!(super::valid_period("2026-12"));
        assert!(!super::valid_period("2026-13"));
        assert!(!super::valid_period("2026-1"));
        assert!(!super::valid_period("26-12-1"));
    }
}
