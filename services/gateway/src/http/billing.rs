//! `POST /v1/billing/what-if` (admin): a past month's charges priced again
//! on another price book, per tenant, before that book is published.
//! Pricing answers it from its charges (`lh_rpc::what_if`); the gateway
//! checks the book and the period itself, to name the field at fault
//! before a round trip that may be long.

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use lh_events::{Actor, PriceBookPublished};
use lh_rpc::http::billing::WhatIf;
use lh_rpc::what_if::{WhatIfReply, WhatIfReport, WhatIfRequest, DRAFT_BOOK_VERSION};

use super::{ApiContext, ApiError, ApiJson, Caller};

#[utoipa::path(
    post, path = "/v1/billing/what-if", request_body = WhatIf,
    responses(
        (status = 200, body = WhatIfReport),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn what_if(
    State(ctx): State<ApiContext>,
    caller: Caller,
    ApiJson(body): ApiJson<WhatIf>,
) -> Result<Json<WhatIfReport>, ApiError> {
    caller.require_admin()?;
    let request = request_of(body, caller.actor(), Utc::now())?;
    match lh_rpc::what_if::call(&ctx.bus, &request, lh_rpc::what_if::WHAT_IF_TIMEOUT).await? {
        WhatIfReply::Report(report) => Ok(Json(report)),
        WhatIfReply::Refused { field, detail } => Err(ApiError::unprocessable(detail, &field)),
    }
}

/// The request for pricing, once the book and the period are checked.
fn request_of(body: WhatIf, actor: Actor, now: DateTime<Utc>) -> Result<WhatIfRequest, ApiError> {
    let book = PriceBookPublished {
        version: body.book.version.unwrap_or(DRAFT_BOOK_VERSION),
        currency: body
            .book
            .currency
            .unwrap_or_else(|| lh_domain::rating::CURRENCY.to_string()),
        effective_from: body.book.effective_from.unwrap_or(now),
        tiers: body.book.tiers,
        storage_cny_per_gb_month: body.book.storage_cny_per_gb_month,
        requested_by: Some(actor),
    };
    lh_rpc::what_if::check_book(&book)
        .map_err(|e| ApiError::unprocessable(e.detail, &format!("book.{}", e.field)))?;
    lh_rpc::charges::parse_period(&body.period)
        .map_err(|detail| ApiError::unprocessable(detail, "period"))?;
    Ok(WhatIfRequest {
        book,
        period: body.period,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(value: serde_json::Value) -> Result<WhatIf, serde_json::Error> {
        serde_json::from_value(value)
    }

    fn refused_field(value: serde_json::Value) -> Option<String> {
        request_of(body(value).unwrap(), Actor::Admin, Utc::now())
            .unwrap_err()
            .field
    }

    #[test]
    fn a_book_without_a_version_is_a_draft() {
        let request = request_of(
            body(json!({"period": "2026-11", "book": {"tiers": [
                {"tier": "basic", "price_cny_per_gb_hour": "0.6"}
            ]}}))
            .unwrap(),
            Actor::Admin,
            Utc::now(),
        )
        .unwrap();
        assert_eq!(request.book.version, DRAFT_BOOK_VERSION);
        assert_eq!(request.book.currency, "CNY");
        assert_eq!(request.period, "2026-11");
    }

    #[test]
    fn the_field_at_fault_is_named_from_the_body() {
        let ladder = json!({"period": "2026-11", "book": {"version": 3, "tiers": [
            {"tier": "performance", "price_cny_per_gb_hour": "2.0",
             "model": {"kind": "graduated", "steps": [
                {"from_hour": 1, "price_cny_per_gb_hour": "2.0"}]}}
        ]}});
        assert_eq!(
            refused_field(ladder).as_deref(),
            Some("book.tiers[0].model.steps[0].from_hour")
        );
        let period = json!({"period": "2026-13", "book": {"tiers": [
            {"tier": "basic", "price_cny_per_gb_hour": "0.6"}
        ]}});
        assert_eq!(refused_field(period).as_deref(), Some("period"));
        // Unknown fields, in the body or the book, are refused.
        assert!(body(json!({"period": "2026-11", "book": {"tiers": []}, "x": 1})).is_err());
        assert!(
            body(json!({"period": "2026-11", "book": {"tiers": [], "requested_by": "x"}})).is_err()
        );
    }
}
