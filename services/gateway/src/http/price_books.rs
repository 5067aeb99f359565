//! `POST /v1/price-books` (admin) publishes a new price book version;
//! `GET /v1/price-books` lists every version. Pricing owns the books: the
//! gateway checks a book's shape itself (to name the field at fault before
//! a round trip) and asks pricing to publish it (`lh_rpc::price_book`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use lh_events::{PriceBookPublished, TierPrice};
use serde::Deserialize;
use utoipa::ToSchema;

use super::{ApiContext, ApiError, ApiJson, Caller, RPC_TIMEOUT};

use lh_rpc::price_book::{PriceBooks, PublishReply, PublishRequest, Published};

/// A new price book version.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewPriceBook {
    /// Greater than every version published before.
    pub version: u32,
    /// `CNY`, the only currency (the default).
    pub currency: Option<String>,
    /// When it applies to leases that start from then on; now by default,
    /// never in the past.
    pub effective_from: Option<DateTime<Utc>>,
    /// One entry per tier: `{"tier": "performance", "price_cny_per_gb_hour":
    /// "2.0", "model": {"kind": "graduated", "steps": [{"from_hour": 0,
    /// "price_cny_per_gb_hour": "2.0"}, ...]}}`. Models: `flat`,
    /// `graduated`, `volume`, `package`, `market` (spot only); see
    /// docs/pricing.md.
    #[schema(value_type = Vec<Object>)]
    pub tiers: Vec<TierPrice>,
}

#[utoipa::path(
    post, path = "/v1/price-books", request_body = NewPriceBook,
    responses(
        (status = 201, body = Published),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 409, body = super::Problem),
        (status = 422, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn publish(
    State(ctx): State<ApiContext>,
    caller: Caller,
    ApiJson(body): ApiJson<NewPriceBook>,
) -> Result<(StatusCode, Json<Published>), ApiError> {
    caller.require_admin()?;
    let book = PriceBookPublished {
        version: body.version,
        currency: body
            .currency
            .unwrap_or_else(|| lh_domain::rating::CURRENCY.to_string()),
        effective_from: body.effective_from.unwrap_or_else(Utc::now),
        tiers: body.tiers,
        requested_by: Some(caller.actor()),
    };
    lh_domain::rating::validate_book(&book)
        .map_err(|e| ApiError::unprocessable(e.detail, &e.field))?;
    let effective_from = book.effective_from;
    match lh_rpc::price_book::publish(&ctx.bus, &PublishRequest { book }, RPC_TIMEOUT).await? {
        PublishReply::Published { version, .. } => Ok((
            StatusCode::CREATED,
            Json(Published {
                version,
                effective_from,
            }),
        )),
        PublishReply::Refused { field, detail } if field == "version" => {
            Err(ApiError::conflict(detail).field(field))
        }
        PublishReply::Refused { field, detail } => Err(ApiError::unprocessable(detail, &field)),
    }
}

#[utoipa::path(
    get, path = "/v1/price-books",
    responses(
        (status = 200, body = PriceBooks),
        (status = 401, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn list(
    State(ctx): State<ApiContext>,
    _caller: Caller,
) -> Result<Json<PriceBooks>, ApiError> {
    // Prices are what every tenant is charged: any caller may read them.
    Ok(Json(lh_rpc::price_book::list(&ctx.bus, RPC_TIMEOUT).await?))
}
