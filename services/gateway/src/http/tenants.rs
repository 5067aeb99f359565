//! Tenants: the admin creates one and gets its first API key once
//! (`POST /v1/tenants`), suspends and resumes it, and changes its quota and
//! weight; the tenant and the operators read it. Its keys are in `keys.rs`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use lh_bus::{BusError, Expect};
use lh_events::{
    derived_id, subject, Envelope, EventData, IdlePolicy, Quota, TenantCreated, TenantErased,
    TenantQuotaChanged, TenantResumed, TenantSuspended,
};
use lh_rpc::http::tenants::{
    ChangeQuota, CreateTenant, QuotaBody, SuspendTenant, TenantChanged, TenantCreatedResponse,
    TenantPage, TenantView, ERASED_MARKER,
};
use serde::Deserialize;
use sqlx::FromRow;
use utoipa::IntoParams;
use uuid::Uuid;

use super::{read_your_write, ApiContext, ApiError, ApiJson, Caller};
use crate::seal;

/// Most GPUs a tenant's quota may allow.
pub const MAX_QUOTA_GPUS: u32 = 100_000;
/// Most storage a tenant's quota may allow, in GB: an exabyte, which the
/// read model's column holds.
pub const MAX_QUOTA_STORAGE_GB: u32 = 1_000_000_000;

/// Longest idle window a tenant may set.
pub const MAX_IDLE_WINDOW_SECS: u64 = 7 * 24 * 3600;

/// Largest fair-share weight.
pub const MAX_WEIGHT: u32 = 1000;

fn validate(body: &CreateTenant) -> Result<(), ApiError> {
    let name = body.name.trim();
    if name.is_empty() || name.len() > 200 {
        return Err(ApiError::unprocessable(
            "name must be 1 to 200 characters",
            "name",
        ));
    }
    let email = body.email.trim();
    let valid_email = email.len() <= 254
        && email
            .split_once('@')
            .is_some_and(|(local, domain)| !local.is_empty() && domain.contains('.'));
    if !valid_email {
        return Err(ApiError::unprocessable(
            "email must look like name@domain.tld",
            "email",
        ));
    }
    validate_quota(&body.quota, body.weight)?;
    if body
        .idle_policy
        .is_some_and(|p| p.window_seconds == 0 || p.window_seconds > MAX_IDLE_WINDOW_SECS)
    {
        return Err(ApiError::unprocessable(
            format!("idle_policy.window_seconds must be 1 to {MAX_IDLE_WINDOW_SECS}"),
            "idle_policy.window_seconds",
        ));
    }
    Ok(())
}

fn validate_quota(quota: &QuotaBody, weight: Option<u32>) -> Result<(), ApiError> {
    if quota.max_gpus == 0 || quota.max_gpus > MAX_QUOTA_GPUS {
        return Err(ApiError::unprocessable(
            format!("quota.max_gpus must be 1 to {MAX_QUOTA_GPUS}"),
            "quota.max_gpus",
        ));
    }
    if quota.max_vram_gb == Some(0) {
        return Err(ApiError::unprocessable(
            "quota.max_vram_gb must be at least 1 when given",
            "quota.max_vram_gb",
        ));
    }
    if quota
        .max_storage_gb
        .is_some_and(|gb| gb > MAX_QUOTA_STORAGE_GB)
    {
        return Err(ApiError::unprocessable(
            format!("quota.max_storage_gb must be at most {MAX_QUOTA_STORAGE_GB}"),
            "quota.max_storage_gb",
        ));
    }
    if weight.is_some_and(|w| w == 0 || w > MAX_WEIGHT) {
        return Err(ApiError::unprocessable(
            format!("weight must be 1 to {MAX_WEIGHT}"),
            "weight",
        ));
    }
    Ok(())
}

#[utoipa::path(
    post, path = "/v1/tenants", request_body = CreateTenant,
    responses(
        (status = 201, body = TenantCreatedResponse),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 422, body = super::Problem)
    )
)]
pub async fn create(
    State(ctx): State<ApiContext>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateTenant>,
) -> Result<(StatusCode, Json<TenantCreatedResponse>), ApiError> {
    caller.require_admin()?;
    validate(&body)?;
    let tenant_id = Uuid::now_v7();
    let first_key = super::auth::new_key();
    let key = seal::new_key();
    seal::store_key(&ctx.pool, ctx.keys.as_ref(), tenant_id, &key).await?;
    let data = EventData::TenantCreated(TenantCreated {
        tenant_id,
        name_sealed: seal::seal(&key, body.name.trim()),
        email_sealed: seal::seal(&key, body.email.trim()),
        api_key_sha256: first_key.sha256,
        api_key_prefix: first_key.prefix,
        quota: Quota {
            max_gpus: body.quota.max_gpus,
            max_vram_gb: body.quota.max_vram_gb,
            max_storage_gb: body.quota.max_storage_gb,
        },
        weight: body.weight.unwrap_or(1),
        idle_policy: body.idle_policy.map(|p| IdlePolicy {
            window_seconds: p.window_seconds,
            action: p.action,
        }),
        trusted: body.trusted,
    });
    let envelope = Envelope::new(caller.actor(), Utc::now(), data)
        .with_id(derived_id(&["tenant.created", &tenant_id.to_string()]));
    let appended = match ctx
        .bus
        .publish(&envelope, Expect::LastSubjectSequence(0))
        .await
    {
        Ok(a) => a,
        Err(BusError::Conflict(e)) => return Err(ApiError::conflict(e)),
        Err(e) => return Err(e.into()),
    };
    read_your_write(&ctx, appended.sequence).await?;
    metrics::counter!("lh_gateway_tenants_created_total").increment(1);
    Ok((
        StatusCode::CREATED,
        Json(TenantCreatedResponse {
            id: tenant_id,
            api_key: first_key.secret,
            name: body.name.trim().to_string(),
            quota: body.quota,
            weight: body.weight.unwrap_or(1),
            idle_policy: body.idle_policy,
        }),
    ))
}

/// Longest reason for a suspension, in characters.
pub const MAX_REASON_CHARS: usize = 500;

/// A tenant's row: its sealed fields as the log carries them, and the rest
/// as the API shows it.
#[derive(FromRow)]
struct TenantRow {
    id: Uuid,
    name_sealed: String,
    email_sealed: String,
    erased: bool,
    #[sqlx(try_from = "i32")]
    max_gpus: u32,
    max_vram_gb: Option<i32>,
    max_storage_gb: Option<i32>,
    #[sqlx(try_from = "i32")]
    weight: u32,
    suspended: bool,
    suspended_reason: Option<String>,
    suspended_reason_sealed: Option<String>,
    created_at: DateTime<Utc>,
}

pub(super) fn parse_tenant_id(raw: &str) -> Result<Uuid, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::not_found(format!("no tenant {raw}")).field("id"))
}

/// Operators read every tenant; a tenant reads only itself, and another
/// tenant's id is a 404 so that ids do not leak.
pub(super) fn require_reader(caller: &Caller, tenant_id: Uuid) -> Result<(), ApiError> {
    match caller {
        Caller::Operator(_) => Ok(()),
        Caller::Tenant { id, .. } if *id == tenant_id => Ok(()),
        Caller::Tenant { .. } => {
            Err(ApiError::not_found(format!("no tenant {tenant_id}")).field("id"))
        }
    }
}

const TENANT_COLUMNS: &str = "id, name_sealed, email_sealed, erased, max_gpus, max_vram_gb,
    max_storage_gb, weight, suspended, suspended_reason, suspended_reason_sealed, created_at";

async fn fetch_tenant(ctx: &ApiContext, tenant_id: Uuid) -> Result<TenantView, ApiError> {
    let row: TenantRow = sqlx::query_as(&format!(
        "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
    ))
    .bind(tenant_id)
    .fetch_optional(&ctx.pool)
    .await?
    .ok_or_else(|| ApiError::not_found(format!("no tenant {tenant_id}")).field("id"))?;
    view_of(ctx, row).await
}

/// A tenant's row as the API shows it, its sealed fields opened.
async fn view_of(ctx: &ApiContext, row: TenantRow) -> Result<TenantView, ApiError> {
    let key = seal::load_key(&ctx.pool, ctx.keys.as_ref(), row.id)
        .await
        .map_err(|e| ApiError::internal(format!("loading a tenant key: {e}")))?;
    // A missing key and a field that does not open read the same: the
    // read model may be rebuilt after the key is gone, and then it holds
    // only ciphertext nobody can open.
    let open = |sealed: &str| {
        key.as_ref()
            .and_then(|k| seal::open(k, sealed))
            .unwrap_or_else(|| ERASED_MARKER.to_string())
    };
    Ok(TenantView {
        id: row.id,
        name: open(&row.name_sealed),
        email: open(&row.email_sealed),
        erased: row.erased,
        max_gpus: row.max_gpus,
        max_vram_gb: row.max_vram_gb,
        max_storage_gb: row.max_storage_gb.map(|v| v.max(0) as u32),
        weight: row.weight,
        suspended: row.suspended,
        suspended_reason: match &row.suspended_reason_sealed {
            Some(sealed) => Some(open(sealed)),
            None => row.suspended_reason,
        },
        created_at: row.created_at,
    })
}

/// The tenant's data key to seal a new field with, made now if the tenant
/// has none ([`seal::ensure_key`]), so that an operator's text never has to
/// enter the log in clear; 409 for an erased tenant.
async fn sealing_key(ctx: &ApiContext, tenant: &TenantView) -> Result<[u8; 32], ApiError> {
    refuse_erased(tenant)?;
    seal::ensure_key(&ctx.pool, ctx.keys.as_ref(), tenant.id)
        .await
        .map_err(|e| ApiError::internal(format!("loading a tenant key: {e}")))?
        .ok_or_else(|| erased_conflict(tenant.id))
}

/// 409 for a write to an erased tenant: nothing may be added to it.
pub(super) fn refuse_erased(tenant: &TenantView) -> Result<(), ApiError> {
    if tenant.erased {
        return Err(erased_conflict(tenant.id));
    }
    Ok(())
}

fn erased_conflict(tenant_id: Uuid) -> ApiError {
    ApiError::conflict(format!(
        "tenant {tenant_id} is erased; it takes no further changes"
    ))
}

/// The tenant once the read model shows everything on its subject, and
/// that subject's last sequence, which the next write expects; 404 when
/// the log has no such tenant.
pub(super) async fn tenant_now(
    ctx: &ApiContext,
    tenant_id: Uuid,
) -> Result<(TenantView, u64), ApiError> {
    let last = ctx
        .bus
        .subject_last_sequence(&subject::tenant(tenant_id))
        .await?;
    if last == 0 {
        return Err(ApiError::not_found(format!("no tenant {tenant_id}")).field("id"));
    }
    read_your_write(ctx, last).await?;
    Ok((fetch_tenant(ctx, tenant_id).await?, last))
}

/// Appends `data` to its tenant's subject, expecting it still ends at
/// `last` (what the decision was made on), and waits for the read model.
pub(super) async fn append_to_tenant(
    ctx: &ApiContext,
    caller: &Caller,
    last: u64,
    data: EventData,
) -> Result<u64, ApiError> {
    let envelope = Envelope::new(caller.actor(), Utc::now(), data);
    let appended = match ctx
        .bus
        .publish(&envelope, Expect::LastSubjectSequence(last))
        .await
    {
        Ok(a) => a,
        Err(BusError::Conflict(_)) => {
            return Err(ApiError::conflict(
                "the tenant changed while this call was decided; retry",
            ))
        }
        Err(e) => return Err(e.into()),
    };
    read_your_write(ctx, appended.sequence).await?;
    Ok(appended.sequence)
}

#[utoipa::path(
    get, path = "/v1/tenants/{id}", params(("id" = Uuid, Path)),
    responses(
        (status = 200, body = TenantView),
        (status = 401, body = super::Problem), (status = 404, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn get(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<TenantView>, ApiError> {
    let tenant_id = parse_tenant_id(&id)?;
    require_reader(&caller, tenant_id)?;
    Ok(Json(fetch_tenant(&ctx, tenant_id).await?))
}

/// Most tenants one page of `GET /v1/tenants` holds.
pub const MAX_TENANTS_PER_PAGE: u32 = 500;
/// Tenants in a page when the caller does not say.
pub const DEFAULT_TENANTS_PER_PAGE: u32 = 100;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct TenantListQuery {
    /// Page size, 1 to 500 (default 100).
    pub limit: Option<u32>,
    /// `next_after` of the previous page: the tenants after that one.
    pub after: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/tenants", params(TenantListQuery),
    responses(
        (status = 200, body = TenantPage),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "A tenant: it reads only itself"),
        (status = 422, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
/// Every tenant, oldest first (ids are UUIDv7, so their order is the order
/// they were created in), a page at a time.
pub async fn list(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<TenantListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<TenantPage>, ApiError> {
    if !caller.is_operator() {
        return Err(ApiError::forbidden(
            "the list of tenants is the operators'; a tenant reads itself at /v1/tenants/{id}",
        ));
    }
    let query = super::query_of(query)?;
    let limit = query.limit.unwrap_or(DEFAULT_TENANTS_PER_PAGE);
    if limit == 0 || limit > MAX_TENANTS_PER_PAGE {
        return Err(ApiError::unprocessable(
            format!("limit must be 1 to {MAX_TENANTS_PER_PAGE}"),
            "limit",
        ));
    }
    let after = match query.after.as_deref() {
        None => Uuid::nil(),
        Some(raw) => raw.parse().map_err(|_| {
            ApiError::unprocessable("after must be a tenant id, as next_after gave it", "after")
        })?,
    };
    // One row more than the page says whether another page follows.
    let mut rows: Vec<TenantRow> = sqlx::query_as(&format!(
        "SELECT {TENANT_COLUMNS} FROM tenants WHERE id > $1 ORDER BY id LIMIT $2"
    ))
    .bind(after)
    .bind(i64::from(limit) + 1)
    .fetch_all(&ctx.pool)
    .await?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next_after = more.then(|| rows.last().map(|r| r.id)).flatten();
    let mut items = Vec::with_capacity(rows.len());
    for row in rows {
        items.push(view_of(&ctx, row).await?);
    }
    Ok(Json(TenantPage { items, next_after }))
}

#[utoipa::path(
    post, path = "/v1/tenants/{id}/suspend", params(("id" = Uuid, Path)), request_body = SuspendTenant,
    responses(
        (status = 202, body = TenantChanged),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 404, body = super::Problem),
        (status = 409, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn suspend(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<SuspendTenant>,
) -> Result<(StatusCode, Json<TenantChanged>), ApiError> {
    caller.require_admin()?;
    let tenant_id = parse_tenant_id(&id)?;
    let reason = body
        .reason
        .unwrap_or_else(|| "suspended by the operator".into());
    if reason.chars().count() > MAX_REASON_CHARS {
        return Err(ApiError::unprocessable(
            format!("reason must be at most {MAX_REASON_CHARS} characters"),
            "reason",
        ));
    }
    let (tenant, last) = tenant_now(&ctx, tenant_id).await?;
    if !tenant.suspended {
        let key = sealing_key(&ctx, &tenant).await?;
        let data = EventData::TenantSuspended(TenantSuspended {
            tenant_id,
            reason_sealed: seal::seal(&key, &reason),
            stop_leases: body.stop_leases,
        });
        append_to_tenant(&ctx, &caller, last, data).await?;
    }
    let mut leases_stopping = 0;
    if body.stop_leases {
        let (asked, sequence) = super::leases::stop_all_of(&ctx, &caller, tenant_id).await?;
        if asked > 0 {
            read_your_write(&ctx, sequence).await?;
        }
        leases_stopping = asked;
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(TenantChanged {
            tenant: fetch_tenant(&ctx, tenant_id).await?,
            leases_stopping,
        }),
    ))
}

#[utoipa::path(
    post, path = "/v1/tenants/{id}/resume", params(("id" = Uuid, Path)),
    responses(
        (status = 202, body = TenantChanged),
        (status = 401, body = super::Problem), (status = 403, body = super::Problem),
        (status = 404, body = super::Problem), (status = 409, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn resume(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<TenantChanged>), ApiError> {
    caller.require_admin()?;
    let tenant_id = parse_tenant_id(&id)?;
    let (tenant, last) = tenant_now(&ctx, tenant_id).await?;
    refuse_erased(&tenant)?;
    if tenant.suspended {
        let data = EventData::TenantResumed(TenantResumed { tenant_id });
        append_to_tenant(&ctx, &caller, last, data).await?;
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(TenantChanged {
            tenant: fetch_tenant(&ctx, tenant_id).await?,
            leases_stopping: 0,
        }),
    ))
}

#[utoipa::path(
    post, path = "/v1/tenants/{id}/erase", params(("id" = Uuid, Path)),
    responses(
        (status = 200, body = TenantView, description = "The tenant is erased: now, or already before this call"),
        (status = 401, body = super::Problem), (status = 403, body = super::Problem),
        (status = 404, body = super::Problem),
        (status = 409, body = super::Problem, description = "The tenant is not suspended, or has leases that have not ended"),
        (status = 503, body = super::Problem)
    )
)]
/// Destroys the tenant's data key, so that its sealed name and e-mail can
/// never be opened again, and records `tenant.erased`. Refused unless the
/// tenant is suspended (so that no lease can be requested between the
/// check below and the erasure) and every lease of it has ended: a running
/// lease still accrues charges for a tenant that is gone, and its node
/// still holds its spec.
pub async fn erase(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<TenantView>, ApiError> {
    caller.require_admin()?;
    let tenant_id = parse_tenant_id(&id)?;
    let (tenant, last) = tenant_now(&ctx, tenant_id).await?;
    if tenant.erased {
        // Idempotent: the key is gone already; the row is deleted again in
        // case an earlier call died between the event and the delete.
        seal::destroy_key(&ctx.pool, tenant_id).await?;
        erase_storage(&ctx, &caller, tenant_id).await?;
        return Ok(Json(tenant));
    }
    if !tenant.suspended {
        return Err(ApiError::conflict(format!(
            "tenant {tenant_id} is not suspended; suspend it first \
             (POST /v1/tenants/{tenant_id}/suspend with stop_leases)"
        )));
    }
    let open_leases: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM leases WHERE tenant_id = $1 AND state NOT IN ('ended', 'rejected')",
    )
    .bind(tenant_id)
    .fetch_one(&ctx.pool)
    .await?;
    if open_leases > 0 {
        return Err(ApiError::conflict(format!(
            "tenant {tenant_id} has {open_leases} lease(s) that have not ended; stop them first \
             (POST /v1/tenants/{tenant_id}/suspend with stop_leases) and erase once they ended"
        )));
    }
    // The event first: were the key deleted first and the publish then
    // failed, the log would name a tenant whose data reads as erased with no
    // record of who erased it. A retry finishes the delete.
    let data = EventData::TenantErased(TenantErased { tenant_id });
    append_to_tenant(&ctx, &caller, last, data).await?;
    seal::destroy_key(&ctx.pool, tenant_id).await?;
    erase_storage(&ctx, &caller, tenant_id).await?;
    metrics::counter!("lh_gateway_tenants_erased_total").increment(1);
    Ok(Json(fetch_tenant(&ctx, tenant_id).await?))
}

/// Deletes the tenant's objects, snapshots and identity on the object
/// store, where there is one. After the tenant's erasure is recorded: a
/// store out of reach fails the call, and calling again finishes it.
async fn erase_storage(ctx: &ApiContext, caller: &Caller, tenant_id: Uuid) -> Result<(), ApiError> {
    if let Some(storage) = &ctx.storage {
        storage.erase(&ctx.bus, caller.actor(), tenant_id).await?;
    }
    Ok(())
}

#[utoipa::path(
    put, path = "/v1/tenants/{id}/quota", params(("id" = Uuid, Path)), request_body = ChangeQuota,
    responses(
        (status = 200, body = TenantView),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem), (status = 404, body = super::Problem),
        (status = 409, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn set_quota(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ChangeQuota>,
) -> Result<Json<TenantView>, ApiError> {
    caller.require_admin()?;
    let tenant_id = parse_tenant_id(&id)?;
    validate_quota(&body.quota, body.weight)?;
    let (tenant, last) = tenant_now(&ctx, tenant_id).await?;
    refuse_erased(&tenant)?;
    let data = EventData::TenantQuotaChanged(TenantQuotaChanged {
        tenant_id,
        quota: Quota {
            max_gpus: body.quota.max_gpus,
            max_vram_gb: body.quota.max_vram_gb,
            max_storage_gb: body.quota.max_storage_gb,
        },
        weight: body.weight.unwrap_or(tenant.weight),
    });
    append_to_tenant(&ctx, &caller, last, data).await?;
    if let Some(storage) = &ctx.storage {
        crate::storage::measure::lift_if_under(
            storage,
            &ctx.pool,
            tenant_id,
            body.quota.max_storage_gb,
        )
        .await;
    }
    Ok(Json(fetch_tenant(&ctx, tenant_id).await?))
}
