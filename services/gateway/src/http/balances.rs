//! `POST /v1/tenants/{id}/balance/top-ups` (admin) adds prepaid money to a
//! tenant's balance (`balance.topped_up`, which the gateway writes for the
//! admin); `GET /v1/tenants/{id}/balance` reads it (the admin, or the
//! tenant its own). Pricing decides what a balance calls for (a warning,
//! stopping the leases, restoring them) and answers it over NATS
//! request/reply (`lh_rpc::balance`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use lh_bus::Expect;
use lh_events::{BalanceToppedUp, Envelope, EventData};
use lh_rpc::balance::{Balance, BalanceRequest, MAX_TOP_UP_CNY};
use lh_rpc::http::balances::{NewTopUp, TopUp};
use rust_decimal::Decimal;
use uuid::Uuid;

use super::tenants::{parse_tenant_id, require_reader};
use super::{read_your_write, ApiContext, ApiError, ApiJson, Caller, RPC_TIMEOUT};

/// The top-up `amount` asks for, or why not.
pub fn valid_amount(amount: Decimal) -> Result<Decimal, ApiError> {
    if amount <= Decimal::ZERO || amount > MAX_TOP_UP_CNY {
        return Err(ApiError::unprocessable(
            format!("a top-up is above 0 and at most {MAX_TOP_UP_CNY} CNY"),
            "amount",
        ));
    }
    if amount.normalize().scale() > lh_domain::rating::AMOUNT_SCALE {
        return Err(ApiError::unprocessable(
            "a top-up has at most 2 decimal places (fen)",
            "amount",
        ));
    }
    let mut amount = amount;
    amount.rescale(lh_domain::rating::AMOUNT_SCALE);
    Ok(amount)
}

#[utoipa::path(
    post, path = "/v1/tenants/{id}/balance/top-ups", params(("id" = Uuid, Path)),
    request_body = NewTopUp,
    responses(
        (status = 201, body = TopUp),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 404, body = super::Problem),
        (status = 422, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn top_up(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<NewTopUp>,
) -> Result<(StatusCode, Json<TopUp>), ApiError> {
    caller.require_admin()?;
    let tenant_id = parse_tenant_id(&id)?;
    let amount = valid_amount(body.amount)?;
    let known: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM tenants WHERE id = $1")
        .bind(tenant_id)
        .fetch_optional(&ctx.pool)
        .await?;
    if known.is_none() {
        return Err(ApiError::not_found(format!("no tenant {tenant_id}")).field("id"));
    }
    let top_up = BalanceToppedUp {
        top_up_id: Uuid::now_v7(),
        tenant_id,
        amount,
        currency: lh_domain::rating::CURRENCY.to_string(),
        requested_by: Some(caller.actor()),
    };
    tracing::info!(%tenant_id, %amount, "topping up a prepaid balance");
    let envelope = Envelope::new(
        caller.actor(),
        Utc::now(),
        EventData::BalanceToppedUp(top_up.clone()),
    )
    .with_id(top_up.top_up_id);
    let appended = ctx.bus.publish(&envelope, Expect::Any).await?;
    read_your_write(&ctx, appended.sequence).await?;
    Ok((
        StatusCode::CREATED,
        Json(TopUp {
            top_up_id: top_up.top_up_id,
            tenant_id,
            amount,
            currency: top_up.currency,
        }),
    ))
}

#[utoipa::path(
    get, path = "/v1/tenants/{id}/balance", params(("id" = Uuid, Path)),
    responses(
        (status = 200, body = Balance),
        (status = 401, body = super::Problem), (status = 404, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn get(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Balance>, ApiError> {
    let tenant_id = parse_tenant_id(&id)?;
    require_reader(&caller, tenant_id)?;
    let request = BalanceRequest { tenant_id };
    Ok(Json(
        lh_rpc::balance::get(&ctx.bus, &request, RPC_TIMEOUT).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_top_up_is_positive_bounded_and_in_fen() {
        let ok = |s: &str| valid_amount(s.parse().unwrap()).map(|d| d.to_string());
        assert_eq!(ok("10").unwrap(), "10.00");
        assert_eq!(ok("0.01").unwrap(), "0.01");
        assert_eq!(ok("5.50").unwrap(), "5.50");
        assert_eq!(ok("5.5000").unwrap(), "5.50");
        assert!(ok("0").is_err());
        assert!(ok("-1").is_err());
        assert!(ok("0.001").is_err());
        assert!(ok("10000000.01").is_err());
    }
}
