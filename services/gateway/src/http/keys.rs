//! A tenant's API keys: issued, listed and revoked by the admin or the
//! tenant itself (`/v1/tenants/{id}/keys`). A key is shown once, when it
//! is issued; the log and the read model keep only its SHA-256 and its
//! visible prefix. A revoked key is refused as soon as the DELETE returns,
//! because the DELETE waits for the read model to show the revocation.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use lh_events::{EventData, TenantApiKeyIssued, TenantApiKeyRevoked};
use lh_rpc::http::keys::{IssueKey, IssuedKey, KeyList, KeyView};
use sqlx::FromRow;
use uuid::Uuid;

use super::tenants::{append_to_tenant, parse_tenant_id, tenant_now};
use super::{ApiContext, ApiError, ApiJson, Caller};

pub use super::auth::{new_key, NewKey};

/// Most keys of one tenant that are neither revoked nor expired.
pub const MAX_LIVE_KEYS_PER_TENANT: i64 = 20;
/// Furthest ahead a key's expiry may be set, in days.
pub const MAX_KEY_LIFETIME_DAYS: i64 = 3 * 366;
/// A key's row, as the API shows it.
#[derive(FromRow)]
struct KeyRow {
    #[sqlx(try_from = "i32")]
    key_id: u32,
    prefix: String,
    created_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
    revoked_at: Option<DateTime<Utc>>,
    state: String,
}

impl From<KeyRow> for KeyView {
    fn from(row: KeyRow) -> Self {
        KeyView {
            key_id: row.key_id,
            prefix: row.prefix,
            created_at: row.created_at,
            expires_at: row.expires_at,
            revoked_at: row.revoked_at,
            state: row.state,
        }
    }
}

const KEY_COLUMNS: &str = "key_id, prefix, created_at, expires_at, revoked_at,
    CASE WHEN revoked_at IS NOT NULL THEN 'revoked'
         WHEN expires_at <= now() THEN 'expired' ELSE 'active' END AS state";

fn parse_key_id(raw: &str) -> Result<u32, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::not_found(format!("no key {raw}")).field("key_id"))
}

#[utoipa::path(
    post, path = "/v1/tenants/{id}/keys", params(("id" = Uuid, Path)), request_body = IssueKey,
    responses(
        (status = 201, body = IssuedKey),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "An auditor (a suspended tenant may revoke its own keys)"),
        (status = 404, body = super::Problem), (status = 409, body = super::Problem),
        (status = 422, body = super::Problem), (status = 429, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn issue(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<IssueKey>,
) -> Result<(StatusCode, Json<IssuedKey>), ApiError> {
    let tenant_id = parse_tenant_id(&id)?;
    caller.require_admin_or_tenant(tenant_id)?;
    if let Some(at) = body.expires_at {
        let now = Utc::now();
        if at <= now || at > now + chrono::Duration::days(MAX_KEY_LIFETIME_DAYS) {
            return Err(ApiError::unprocessable(
                format!("expires_at must be in the future and at most {MAX_KEY_LIFETIME_DAYS} days ahead"),
                "expires_at",
            ));
        }
    }
    let (tenant, last) = tenant_now(&ctx, tenant_id).await?;
    super::tenants::refuse_erased(&tenant)?;
    let (live, newest): (i64, Option<i32>) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())),
                max(key_id)
         FROM tenant_keys WHERE tenant_id = $1",
    )
    .bind(tenant_id)
    .fetch_one(&ctx.pool)
    .await?;
    if live >= MAX_LIVE_KEYS_PER_TENANT {
        return Err(ApiError::conflict(format!(
            "this tenant has {live} live keys, the most allowed; revoke one first"
        )));
    }
    let key_id = newest.unwrap_or(0).max(0) as u32 + 1;
    let key = new_key();
    let data = EventData::TenantApiKeyIssued(TenantApiKeyIssued {
        tenant_id,
        key_id,
        prefix: key.prefix.clone(),
        sha256: key.sha256,
        expires_at: body.expires_at,
    });
    append_to_tenant(&ctx, &caller, last, data).await?;
    metrics::counter!("lh_gateway_api_keys_issued_total").increment(1);
    Ok((
        StatusCode::CREATED,
        Json(IssuedKey {
            key_id,
            api_key: key.secret,
            prefix: key.prefix,
            expires_at: body.expires_at,
        }),
    ))
}

#[utoipa::path(
    get, path = "/v1/tenants/{id}/keys", params(("id" = Uuid, Path)),
    responses(
        (status = 200, body = KeyList),
        (status = 401, body = super::Problem), (status = 404, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn list(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<KeyList>, ApiError> {
    let tenant_id = parse_tenant_id(&id)?;
    super::tenants::require_reader(&caller, tenant_id)?;
    let rows: Vec<KeyRow> = sqlx::query_as(&format!(
        "SELECT {KEY_COLUMNS} FROM tenant_keys WHERE tenant_id = $1 ORDER BY key_id"
    ))
    .bind(tenant_id)
    .fetch_all(&ctx.pool)
    .await?;
    let items: Vec<KeyView> = rows.into_iter().map(KeyView::from).collect();
    if items.is_empty() {
        return Err(ApiError::not_found(format!("no tenant {tenant_id}")).field("id"));
    }
    Ok(Json(KeyList { items }))
}

#[utoipa::path(
    delete, path = "/v1/tenants/{id}/keys/{key_id}",
    params(("id" = Uuid, Path), ("key_id" = u32, Path)),
    responses(
        (status = 200, body = KeyView, description = "Revoked (again, when it was already)"),
        (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "An auditor, or a suspended tenant"),
        (status = 404, body = super::Problem), (status = 409, body = super::Problem),
        (status = 429, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn revoke(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path((id, key_id)): Path<(String, String)>,
) -> Result<Json<KeyView>, ApiError> {
    let tenant_id = parse_tenant_id(&id)?;
    caller.require_admin_or_tenant(tenant_id)?;
    let key_id = parse_key_id(&key_id)?;
    let (_, last) = tenant_now(&ctx, tenant_id).await?;
    let key = fetch_key(&ctx, tenant_id, key_id).await?;
    if key.revoked_at.is_some() {
        return Ok(Json(key));
    }
    let data = EventData::TenantApiKeyRevoked(TenantApiKeyRevoked { tenant_id, key_id });
    append_to_tenant(&ctx, &caller, last, data).await?;
    metrics::counter!("lh_gateway_api_keys_revoked_total").increment(1);
    Ok(Json(fetch_key(&ctx, tenant_id, key_id).await?))
}

async fn fetch_key(ctx: &ApiContext, tenant_id: Uuid, key_id: u32) -> Result<KeyView, ApiError> {
    sqlx::query_as::<_, KeyRow>(&format!(
        "SELECT {KEY_COLUMNS} FROM tenant_keys WHERE tenant_id = $1 AND key_id = $2"
    ))
    .bind(tenant_id)
    .bind(key_id as i32)
    .fetch_optional(&ctx.pool)
    .await?
    .map(KeyView::from)
    .ok_or_else(|| {
        ApiError::not_found(format!("tenant {tenant_id} has no key {key_id}")).field("key_id")
    })
}
