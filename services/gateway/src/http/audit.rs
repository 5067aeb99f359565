//! `GET /v1/audit/verify`: asks the audit service to recompute its hash
//! chain over the log.

use axum::extract::State;
use axum::Json;
use lh_events::subject;

use super::{ApiContext, ApiError, Caller, RPC_TIMEOUT};

#[utoipa::path(
    get, path = "/v1/audit/verify",
    responses(
        (status = 200, description = "`{ok, events, head, ...}` from the audit service"),
        (status = 401, body = super::Problem), (status = 403, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn verify(
    State(ctx): State<ApiContext>,
    caller: Caller,
) -> Result<Json<serde_json::Value>, ApiError> {
    if !matches!(caller, Caller::Admin | Caller::Auditor) {
        return Err(ApiError::forbidden(
            "audit verification needs the admin or auditor token",
        ));
    }
    let answer: serde_json::Value = lh_bus::rpc::call(
        &ctx.bus,
        subject::RPC_AUDIT_VERIFY,
        &serde_json::json!({}),
        RPC_TIMEOUT,
    )
    .await?;
    Ok(Json(answer))
}
