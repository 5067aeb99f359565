//! `GET /v1/audit/verify`: asks the audit service to recompute its hash
//! chain over the log.

use axum::extract::State;
use axum::Json;
use lh_rpc::audit::VerifyResponse;

use super::{ApiContext, ApiError, Caller, RPC_TIMEOUT};

#[utoipa::path(
    get, path = "/v1/audit/verify",
    responses(
        (status = 200, body = VerifyResponse),
        (status = 401, body = super::Problem), (status = 403, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn verify(
    State(ctx): State<ApiContext>,
    caller: Caller,
) -> Result<Json<VerifyResponse>, ApiError> {
    if !caller.is_operator() {
        return Err(ApiError::forbidden(
            "audit verification needs the admin or auditor token",
        ));
    }
    let answer = lh_rpc::audit::call(&ctx.bus, RPC_TIMEOUT).await?;
    Ok(Json(answer))
}
