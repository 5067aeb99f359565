//! `POST /v1/reservations` (admin) commits a tenant to GPUs of a model in a
//! zone for a term; `GET /v1/reservations` lists them (a tenant its own).
//! Pricing owns reservations (it bills them): the gateway asks it over
//! NATS request/reply (`lh_rpc::reservation`).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use lh_rpc::http::reservations::NewReservation;
use lh_rpc::reservation::{CommitReply, CommitRequest, ListRequest, Reservations};
use serde::Deserialize;
use utoipa::IntoParams;
use uuid::Uuid;

use super::{ApiContext, ApiError, ApiJson, Caller, RPC_TIMEOUT};

#[utoipa::path(
    post, path = "/v1/reservations", request_body = NewReservation,
    responses(
        (status = 201, body = Object),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn commit(
    State(ctx): State<ApiContext>,
    caller: Caller,
    ApiJson(body): ApiJson<NewReservation>,
) -> Result<(StatusCode, Json<lh_events::ReservationCommitted>), ApiError> {
    caller.require_admin()?;
    let known: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM tenants WHERE id = $1")
        .bind(body.tenant_id)
        .fetch_optional(&ctx.pool)
        .await
        .map_err(ApiError::internal)?;
    if known.is_none() {
        return Err(ApiError::unprocessable("no such tenant", "tenant_id"));
    }
    let request = CommitRequest {
        tenant_id: body.tenant_id,
        gpu_model: body.gpu_model,
        zone: body.zone,
        gpus: body.gpus,
        term_days: body.term_days,
        starts_at: body.starts_at,
        requested_by: Some(caller.actor()),
    };
    match lh_rpc::reservation::commit(&ctx.bus, &request, RPC_TIMEOUT).await? {
        CommitReply::Committed { reservation } => Ok((StatusCode::CREATED, Json(reservation))),
        CommitReply::Refused { field, detail } => Err(ApiError::unprocessable(detail, &field)),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ReservationQuery {
    /// Operators only: one tenant's reservations.
    pub tenant_id: Option<Uuid>,
}

#[utoipa::path(
    get, path = "/v1/reservations", params(ReservationQuery),
    responses(
        (status = 200, body = Reservations),
        (status = 401, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn list(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<ReservationQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Reservations>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let tenant_id = match &caller {
        // A tenant sees its own, whatever it asks for.
        Caller::Tenant { id, .. } => Some(*id),
        Caller::Operator(_) => query.tenant_id,
    };
    let request = ListRequest { tenant_id };
    Ok(Json(
        lh_rpc::reservation::list(&ctx.bus, &request, RPC_TIMEOUT).await?,
    ))
}
