//! `GET /v1/invoices?period=YYYY-MM`: the tenant's invoice for a month,
//! answered by the pricing service from its invoice projection.

use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::{ApiContext, ApiError, Caller, RPC_TIMEOUT};

use lh_rpc::invoice::{Invoice, InvoiceRequest};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct InvoiceQuery {
    /// `YYYY-MM` (UTC calendar month).
    pub period: Option<String>,
    /// Admin only: whose invoice.
    pub tenant_id: Option<Uuid>,
}

#[utoipa::path(
    get, path = "/v1/invoices", params(InvoiceQuery),
    responses(
        (status = 200, body = Invoice),
        (status = 401, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn show(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<InvoiceQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Invoice>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let period = query
        .period
        .ok_or_else(|| ApiError::unprocessable("period is required (YYYY-MM)", "period"))?;
    lh_rpc::invoice::parse_period(&period).map_err(|why| ApiError::unprocessable(why, "period"))?;
    let tenant_id = match (&caller, query.tenant_id) {
        (Caller::Tenant { id, .. }, None) => *id,
        (Caller::Tenant { id, .. }, Some(asked)) if asked == *id => *id,
        (Caller::Tenant { .. }, Some(_)) => {
            return Err(ApiError::not_found("no such tenant").field("tenant_id"))
        }
        (Caller::Operator(_), Some(asked)) => asked,
        (Caller::Operator(_), None) => {
            return Err(ApiError::unprocessable(
                "tenant_id is required for the admin",
                "tenant_id",
            ))
        }
    };
    let invoice =
        lh_rpc::invoice::call(&ctx.bus, &InvoiceRequest { tenant_id, period }, RPC_TIMEOUT).await?;
    Ok(Json(invoice))
}
