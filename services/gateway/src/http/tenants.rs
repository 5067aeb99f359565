//! `POST /v1/tenants`: the admin creates a tenant and gets its API key once.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use lh_bus::{BusError, Expect};
use lh_events::{derived_id, Envelope, EventData, IdleAction, IdlePolicy, Quota, TenantCreated};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::{read_your_write, sha256_hex, ApiContext, ApiError, ApiJson, Caller};
use crate::seal;

/// Most GPUs a tenant's quota may allow.
pub const MAX_QUOTA_GPUS: u32 = 100_000;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    pub name: String,
    pub email: String,
    pub quota: QuotaBody,
    /// Weight in fair sharing across tenants, 1 to 1000 (default 1).
    pub weight: Option<u32>,
    /// What happens to a lease whose GPUs show zero utilisation for a
    /// while; the node-agents' default (5 minutes, notify) when absent.
    pub idle_policy: Option<IdlePolicyBody>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IdlePolicyBody {
    /// Seconds of zero utilisation, 1 to 604800 (a week).
    pub window_s: u64,
    /// `notify` (an event only), `stop` (the lease is stopped) or
    /// `suspend` (its GPUs are freed until `POST /v1/leases/{id}/resume`).
    #[schema(value_type = String, example = "notify")]
    pub action: IdleAction,
}

/// Longest idle window a tenant may set.
pub const MAX_IDLE_WINDOW_S: u64 = 7 * 24 * 3600;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaBody {
    pub max_gpus: u32,
    /// Most VRAM the tenant may hold at once, in GB; unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_vram_gb: Option<u32>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantCreatedResponse {
    pub id: Uuid,
    /// Shown once; only its SHA-256 is kept.
    pub api_key: String,
    pub name: String,
    pub quota: QuotaBody,
    pub weight: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_policy: Option<IdlePolicyBody>,
}

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
    if body.quota.max_gpus == 0 || body.quota.max_gpus > MAX_QUOTA_GPUS {
        return Err(ApiError::unprocessable(
            format!("quota.max_gpus must be 1 to {MAX_QUOTA_GPUS}"),
            "quota.max_gpus",
        ));
    }
    if body.quota.max_vram_gb == Some(0) {
        return Err(ApiError::unprocessable(
            "quota.max_vram_gb must be at least 1 when given",
            "quota.max_vram_gb",
        ));
    }
    if body.weight.is_some_and(|w| w == 0 || w > MAX_WEIGHT) {
        return Err(ApiError::unprocessable(
            format!("weight must be 1 to {MAX_WEIGHT}"),
            "weight",
        ));
    }
    if body
        .idle_policy
        .is_some_and(|p| p.window_s == 0 || p.window_s > MAX_IDLE_WINDOW_S)
    {
        return Err(ApiError::unprocessable(
            format!("idle_policy.window_s must be 1 to {MAX_IDLE_WINDOW_S}"),
            "idle_policy.window_s",
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
    let mut secret = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut secret);
    let api_key = format!("lh_{}", hex::encode(secret));
    let key = seal::new_key();
    seal::store_key(&ctx.pool, tenant_id, &key).await?;
    let data = EventData::TenantCreated(TenantCreated {
        tenant_id,
        name_sealed: seal::seal(&key, body.name.trim()),
        email_sealed: seal::seal(&key, body.email.trim()),
        api_key_sha256: sha256_hex(&api_key),
        quota: Quota {
            max_gpus: body.quota.max_gpus,
            max_vram_gb: body.quota.max_vram_gb,
        },
        weight: body.weight.unwrap_or(1),
        idle_policy: body.idle_policy.map(|p| IdlePolicy {
            window_s: p.window_s,
            action: p.action,
        }),
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
            api_key,
            name: body.name.trim().to_string(),
            quota: body.quota,
            weight: body.weight.unwrap_or(1),
            idle_policy: body.idle_policy,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_naming_an_unknown_field_is_refused_at_every_level() {
        let refused = |json: &str| serde_json::from_str::<CreateTenant>(json).is_err();
        let ok = r#"{"name":"a","email":"a@b.c","quota":{"max_gpus":1},"idle_policy":{"window_s":60,"action":"notify"}}"#;
        assert!(!refused(ok));
        assert!(refused(
            r#"{"name":"a","email":"a@b.c","quota":{"max_gpus":1},"colour":"red"}"#
        ));
        assert!(refused(
            r#"{"name":"a","email":"a@b.c","quota":{"max_gpus":1,"colour":"red"}}"#
        ));
        assert!(refused(
            r#"{"name":"a","email":"a@b.c","quota":{"max_gpus":1},"idle_policy":{"window_s":60,"action":"notify","colour":"red"}}"#
        ));
    }
}
