//! `POST /v1/quotes` (a tenant) prices a request for a duration on the
//! price book in force and returns a quote valid for a configured time
//! (`LH_QUOTE_VALID_SECS` of pricing); `POST /v1/leases` with its
//! `quote_id` is billed on the quoted version. Pricing owns quotes (it
//! prices them and bills the lease): the gateway asks it over NATS
//! request/reply (`lh_rpc::quote`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use lh_events::{GpuFraction, LeaseRequested, QuoteIssued};
use lh_rpc::http::quotes::NewQuote;
use lh_rpc::quote::{GetRequest, QuoteReply, QuoteRequest};
use uuid::Uuid;

use super::{ApiContext, ApiError, ApiJson, Caller, RPC_TIMEOUT};

#[utoipa::path(
    post, path = "/v1/quotes", request_body = NewQuote,
    responses(
        (status = 201, body = Object, description = "The quote: quote_id, amount, price_book_version, expires_at, price_moves (spot)"),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn create(
    State(ctx): State<ApiContext>,
    caller: Caller,
    ApiJson(body): ApiJson<NewQuote>,
) -> Result<(StatusCode, Json<QuoteIssued>), ApiError> {
    let (tenant_id, _) = caller.tenant()?;
    let request = QuoteRequest {
        tenant_id,
        gpus: body.gpus,
        fraction: body.gpu_fraction.map(GpuFraction::from),
        mig_profile: body.mig_profile,
        gpu_model: body.gpu_model,
        tier: body.tier,
        duration_seconds: body.duration_seconds,
    };
    match lh_rpc::quote::issue(&ctx.bus, &request, RPC_TIMEOUT).await? {
        QuoteReply::Issued { quote } => Ok((StatusCode::CREATED, Json(quote))),
        QuoteReply::Refused { field, detail } => Err(ApiError::unprocessable(detail, &field)),
    }
}

/// Why `quote` cannot be used for `requested` at `now`, if it cannot.
pub fn refusal(
    quote: &QuoteIssued,
    requested: &LeaseRequested,
    now: DateTime<Utc>,
) -> Option<String> {
    if quote.tenant_id != requested.tenant_id {
        // Another tenant's quote is as good as none: ids do not leak.
        return Some(format!("no quote {}", quote.quote_id));
    }
    if quote.expires_at <= now {
        return Some(format!("the quote expired at {}", quote.expires_at));
    }
    let same_spec = quote.gpu_model == requested.gpu_model
        && quote.tier == requested.tier
        && quote.gpus == requested.gpus
        && quote.fraction == requested.fraction
        && quote.mig_profile == requested.mig_profile;
    (!same_spec).then(|| {
        "the quote is for other GPUs, model or tier than this request; ask for a quote of this one"
            .to_string()
    })
}

/// Checks that the tenant may ask for `requested` with quote `quote_id`.
pub async fn check_quote(
    ctx: &ApiContext,
    quote_id: Uuid,
    requested: &LeaseRequested,
    now: DateTime<Utc>,
) -> Result<(), ApiError> {
    let quote = lh_rpc::quote::get(&ctx.bus, &GetRequest { quote_id }, RPC_TIMEOUT).await?;
    let why = match &quote {
        Some(quote) => refusal(quote, requested, now),
        None => Some(format!("no quote {quote_id}")),
    };
    match why {
        Some(why) => Err(ApiError::unprocessable(why, "quote_id")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::Tier;

    const MODEL: &str = "A100-40GB";

    fn whole(tenant: Uuid, gpus: u32) -> LeaseRequested {
        serde_json::from_value(serde_json::json!({
            "lease_id": Uuid::from_u128(2), "tenant_id": tenant, "gpus": gpus,
            "gpu_model": MODEL, "tier": "basic"
        }))
        .expect("a lease request")
    }

    fn quote(tenant: Uuid, now: DateTime<Utc>) -> QuoteIssued {
        QuoteIssued {
            quote_id: Uuid::from_u128(9),
            tenant_id: tenant,
            gpu_model: MODEL.into(),
            tier: Tier::Basic,
            gpus: 1,
            fraction: None,
            mig_profile: None,
            vram_gb: 40,
            duration_seconds: 3600,
            price_book_version: 1,
            amount: rust_decimal::Decimal::new(20, 0),
            unit_price_cny_per_gb_hour: rust_decimal::Decimal::new(5, 1),
            currency: "CNY".into(),
            expires_at: now + chrono::Duration::minutes(15),
            price_moves: false,
        }
    }

    #[test]
    fn a_quote_serves_only_its_tenant_its_spec_and_until_it_expires() {
        let now = Utc::now();
        let tenant = Uuid::from_u128(1);
        let request = whole(tenant, 1);
        let q = quote(tenant, now);
        assert_eq!(refusal(&q, &request, now), None);
        assert!(refusal(&quote(Uuid::from_u128(3), now), &request, now).is_some());
        assert!(refusal(&q, &request, q.expires_at).is_some());
        let two = whole(tenant, 2);
        assert!(refusal(&q, &two, now).is_some());
        let spot = LeaseRequested {
            tier: Tier::Spot,
            ..request
        };
        assert!(refusal(&q, &spot, now).is_some());
    }
}
