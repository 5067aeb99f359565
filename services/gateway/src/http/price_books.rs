//! `POST /v1/price-books` (admin) publishes a new price book version;
//! `GET /v1/price-books` lists every version. Pricing owns the books: the
//! gateway checks a book's shape itself (to name the field at fault before
//! a round trip) and asks pricing to publish it (`lh_rpc::price_book`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use lh_events::PriceBookPublished;
use lh_rpc::http::price_books::NewPriceBook;
use lh_rpc::price_book::{PriceBooks, PublishReply, PublishRequest, Published};

use super::{ApiContext, ApiError, ApiJson, Caller, RPC_TIMEOUT};

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
        storage_cny_per_gb_month: body.storage_cny_per_gb_month,
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
