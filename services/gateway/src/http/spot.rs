//! `GET /v1/spot/prices`: the current spot price of each (zone, GPU model)
//! and its recent history, answered by the spot-broker.
//!
//! The broker folds every `spot.price_set` to decide the next one, so it
//! answers from memory over request/reply: the gateway keeps no projection
//! of prices (no table, no migration, no second fold to keep in step), at
//! the cost of answering 503 while no broker runs.

use axum::extract::{Query, State};
use axum::Json;
use lh_rpc::spot::{SpotPrices, SpotPricesRequest, MAX_FILTER_LEN, MAX_HISTORY_POINTS};
use serde::Deserialize;
use utoipa::IntoParams;

use super::{ApiContext, ApiError, Caller, RPC_TIMEOUT};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SpotPricesQuery {
    /// Only this zone.
    pub zone: Option<String>,
    /// Only this GPU model.
    pub gpu_model: Option<String>,
    /// Past prices per market, 0 to 60 (default 60).
    pub history: Option<u32>,
}

#[utoipa::path(
    get, path = "/v1/spot/prices", params(SpotPricesQuery),
    responses(
        (status = 200, body = SpotPrices),
        (status = 401, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn prices(
    State(ctx): State<ApiContext>,
    _caller: Caller,
    query: Result<Query<SpotPricesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<SpotPrices>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    for (field, value) in [("zone", &query.zone), ("gpu_model", &query.gpu_model)] {
        if value
            .as_ref()
            .is_some_and(|v| v.is_empty() || v.len() > MAX_FILTER_LEN)
        {
            return Err(ApiError::unprocessable(
                format!("{field} must be 1 to {MAX_FILTER_LEN} bytes"),
                field,
            ));
        }
    }
    if query
        .history
        .is_some_and(|h| h as usize > MAX_HISTORY_POINTS)
    {
        return Err(ApiError::unprocessable(
            format!("history must be 0 to {MAX_HISTORY_POINTS}"),
            "history",
        ));
    }
    let request = SpotPricesRequest {
        zone: query.zone,
        gpu_model: query.gpu_model,
        history: query.history,
    };
    let prices = lh_rpc::spot::call(&ctx.bus, &request, RPC_TIMEOUT).await?;
    Ok(Json(prices))
}
