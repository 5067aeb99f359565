//! A tenant's SSH public keys (`/v1/ssh-keys`): added by the tenant with
//! its own API key, listed and removed by the tenant or an admin. The
//! gateway's SSH endpoint lets a person into the tenant's leases with any
//! of them (`crate::ssh_keys`). Each key is an aggregate of its own
//! (`lh.evt.ssh_key.<id>`), its id derived from the tenant and the key's
//! fingerprint: one key added twice at once lands on one subject, where
//! the guard lets only the first through. Every write waits for the read
//! model, so a removed key lets nobody in once the DELETE returns.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use lh_events::{derived_id, subject, EventData, SshKeyAdded, SshKeyRemoved};
use lh_rpc::http::ssh_keys::{AddSshKey, SshKeyList, SshKeyView};
use serde::Deserialize;
use sqlx::FromRow;
use utoipa::IntoParams;
use uuid::Uuid;

use super::{
    append_guarded, query_of, read_your_write, whose, ApiContext, ApiError, ApiJson, Caller,
};
use crate::ssh_keys::{check_name, parse_public_key, MAX_SSH_KEYS_PER_TENANT};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SshKeysQuery {
    /// Whose keys: required of an operator; a tenant may name only itself.
    pub tenant_id: Option<Uuid>,
}

#[derive(FromRow)]
struct SshKeyRow {
    key_id: Uuid,
    tenant_id: Uuid,
    name: String,
    fingerprint: String,
    public_key: String,
    created_at: DateTime<Utc>,
}

impl From<SshKeyRow> for SshKeyView {
    fn from(row: SshKeyRow) -> Self {
        SshKeyView {
            id: row.key_id,
            name: row.name,
            fingerprint: row.fingerprint,
            public_key: row.public_key,
            created_at: row.created_at,
        }
    }
}

const COLUMNS: &str = "key_id, tenant_id, name, fingerprint, public_key, created_at";
const KEY_CHANGED: &str = "this key was added or removed while this call was decided; retry";

/// The key's row once the read model shows everything on its subject, and
/// that subject's last sequence, which the next write expects.
async fn key_now(ctx: &ApiContext, key_id: Uuid) -> Result<(Option<SshKeyRow>, u64), ApiError> {
    let last = ctx
        .bus
        .subject_last_sequence(&subject::ssh_key(key_id))
        .await?;
    if last > 0 {
        read_your_write(ctx, last).await?;
    }
    Ok((fetch_key(ctx, key_id).await?, last))
}

async fn fetch_key(ctx: &ApiContext, key_id: Uuid) -> Result<Option<SshKeyRow>, ApiError> {
    let row = sqlx::query_as(&format!("SELECT {COLUMNS} FROM ssh_keys WHERE key_id = $1"))
        .bind(key_id)
        .fetch_optional(&ctx.pool)
        .await?;
    Ok(row)
}

#[utoipa::path(
    post, path = "/v1/ssh-keys", request_body = AddSshKey,
    responses(
        (status = 201, body = SshKeyView),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "An operator (a key is added with the tenant's own API key), or a suspended tenant"),
        (status = 409, body = super::Problem, description = "The tenant has this key already"),
        (status = 422, body = super::Problem, description = "`name`, or `public_key`: not one OpenSSH public key, an algorithm or size not accepted, over 8 KiB, or the tenant has 16 keys already"),
        (status = 429, body = super::Problem), (status = 503, body = super::Problem)
    )
)]
pub async fn add(
    State(ctx): State<ApiContext>,
    caller: Caller,
    ApiJson(body): ApiJson<AddSshKey>,
) -> Result<(StatusCode, Json<SshKeyView>), ApiError> {
    caller.require_writer()?;
    let Caller::Tenant { id: tenant_id, .. } = &caller else {
        return Err(ApiError::forbidden(
            "an SSH key is added by its tenant, with one of the tenant's API keys",
        ));
    };
    let name = check_name(&body.name).map_err(|why| ApiError::unprocessable(why, "name"))?;
    let (public_key, fingerprint) = parse_public_key(&body.public_key)
        .map_err(|why| ApiError::unprocessable(why, "public_key"))?;
    let tenant_id = *tenant_id;
    let key_id = derived_id(&["ssh_key", &tenant_id.to_string(), &fingerprint]);
    let (existing, last) = key_now(&ctx, key_id).await?;
    if let Some(existing) = existing {
        return Err(ApiError::conflict(format!(
            "this key ({fingerprint}) is registered already, as {:?} ({})",
            existing.name, existing.key_id
        ))
        .field("public_key"));
    }
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM ssh_keys WHERE tenant_id = $1")
        .bind(tenant_id)
        .fetch_one(&ctx.pool)
        .await?;
    if held >= MAX_SSH_KEYS_PER_TENANT {
        return Err(ApiError::unprocessable(
            format!(
                "this tenant has {held} SSH keys, the most allowed; remove one first \
                 (DELETE /v1/ssh-keys/{{id}})"
            ),
            "public_key",
        ));
    }
    let data = EventData::SshKeyAdded(SshKeyAdded {
        key_id,
        tenant_id,
        name,
        public_key,
        fingerprint,
    });
    append_guarded(&ctx, &caller, last, data, KEY_CHANGED).await?;
    metrics::counter!("lh_gateway_ssh_keys_added_total").increment(1);
    let row = fetch_key(&ctx, key_id).await?;
    // None only when the tenant was erased while this was decided: the
    // read model then takes no key of it.
    let row = row.ok_or_else(|| {
        ApiError::conflict(format!(
            "tenant {tenant_id} is erased; it takes no further changes"
        ))
    })?;
    Ok((StatusCode::CREATED, Json(row.into())))
}

#[utoipa::path(
    get, path = "/v1/ssh-keys", params(SshKeysQuery),
    responses(
        (status = 200, body = SshKeyList),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 404, body = super::Problem), (status = 422, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn list(
    State(ctx): State<ApiContext>,
    caller: Caller,
    query: Result<Query<SshKeysQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<SshKeyList>, ApiError> {
    let tenant_id = whose(&caller, query_of(query)?.tenant_id)?;
    let rows: Vec<SshKeyRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM ssh_keys WHERE tenant_id = $1 ORDER BY created_at, key_id"
    ))
    .bind(tenant_id)
    .fetch_all(&ctx.pool)
    .await?;
    Ok(Json(SshKeyList {
        ssh_keys: rows.into_iter().map(SshKeyView::from).collect(),
    }))
}

#[utoipa::path(
    delete, path = "/v1/ssh-keys/{id}", params(("id" = Uuid, Path), SshKeysQuery),
    responses(
        (status = 204, description = "Removed: the key lets nobody in from now on"),
        (status = 400, body = super::Problem), (status = 401, body = super::Problem),
        (status = 403, body = super::Problem, description = "An auditor"),
        (status = 404, body = super::Problem, description = "No such key, or another tenant's"),
        (status = 409, body = super::Problem), (status = 429, body = super::Problem),
        (status = 503, body = super::Problem)
    )
)]
pub async fn remove(
    State(ctx): State<ApiContext>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<SshKeysQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode, ApiError> {
    caller.require_writer()?;
    let asked = query_of(query)?.tenant_id;
    let not_found = || ApiError::not_found(format!("no SSH key {id}")).field("id");
    let key_id: Uuid = id.parse().map_err(|_| not_found())?;
    let (row, last) = key_now(&ctx, key_id).await?;
    let row = row.ok_or_else(not_found)?;
    let allowed = match &caller {
        Caller::Tenant { id, .. } => *id == row.tenant_id && asked.is_none_or(|t| t == *id),
        Caller::Operator(_) => asked.is_none_or(|t| t == row.tenant_id),
    };
    if !allowed {
        return Err(not_found());
    }
    let data = EventData::SshKeyRemoved(SshKeyRemoved {
        key_id,
        tenant_id: row.tenant_id,
    });
    append_guarded(&ctx, &caller, last, data, KEY_CHANGED).await?;
    metrics::counter!("lh_gateway_ssh_keys_removed_total").increment(1);
    Ok(StatusCode::NO_CONTENT)
}
