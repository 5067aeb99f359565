//! `POST /v1/leases/{id}/web`: a ticket into a running lease's web page
//! (its notebook, its dashboard), at an origin of the lease's own
//! (`crate::lease_web`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use lh_domain::lease::LeaseState;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::leases::{parse_id, visible};
use super::{ApiContext, ApiError, ApiJson, Caller};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebTicketRequest {
    /// The TCP port inside the lease (on its 127.0.0.1).
    pub port: u16,
    /// Where on it to land, e.g. `/tree?token=…`; `/` by default.
    #[serde(default)]
    pub path: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebTicket {
    /// Open it in a browser, once, before `expires_at`.
    pub url: String,
    /// The page's origin, the lease's and the port's alone.
    pub origin: String,
    pub expires_at: DateTime<Utc>,
}

#[utoipa::path(
    post, path = "/v1/leases/{id}/web", request_body = WebTicketRequest,
    params(("id" = String, Path, description = "lease id")),
    responses(
        (status = 201, body = WebTicket),
        (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "Operators do not open tenants' pages"),
        (status = 404, body = super::Problem, description = "No such lease, or this gateway serves no lease web pages"),
        (status = 409, body = super::Problem, description = "The lease is not running"),
        (status = 422, body = super::Problem)
    )
)]
pub async fn ticket(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<WebTicketRequest>,
) -> Result<(StatusCode, Json<WebTicket>), ApiError> {
    let Caller::Tenant {
        id: tenant,
        credential,
        ..
    } = caller
    else {
        return Err(ApiError::forbidden(
            "a lease's web page is its tenant's: operators enter leases by exec with a reason",
        ));
    };
    let lease = visible(&ctx, &caller, parse_id(&id)?).await?;
    let web = ctx.lease_web.as_ref().ok_or_else(|| {
        ApiError::not_found(
            "this gateway serves no lease web pages (LH_LEASE_WEB_ADDR and LH_LEASE_WEB_BASE); `lh lease open` reaches them",
        )
    })?;
    if body.port == 0 {
        return Err(ApiError::unprocessable("port is 1 to 65535", "port"));
    }
    let path = body.path.unwrap_or_else(|| "/".into());
    if !crate::lease_web::next_path_ok(&path) {
        return Err(ApiError::unprocessable(
            format!(
                "a path on the page itself, starting with one /, of at most {} bytes, without spaces",
                crate::lease_web::MAX_NEXT_PATH_BYTES
            ),
            "path",
        ));
    }
    if lease.view.state != LeaseState::Running {
        return Err(ApiError::conflict(format!(
            "lease {} is {}, not running",
            lease.view.id,
            lease.view.state.as_str()
        )));
    }
    let (url, expires_at) = web
        .ticket(
            &ctx.pool,
            (tenant, credential),
            lease.view.id,
            body.port,
            &path,
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(WebTicket {
            url,
            origin: web.origin(lease.view.id, body.port),
            expires_at,
        }),
    ))
}
