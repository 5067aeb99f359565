//! Tenants (`/v1/tenants`): a new one and its first API key, a tenant as
//! the read model shows it, its suspension and its quota.

use chrono::{DateTime, Utc};
use lh_events::IdleAction;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    pub name: String,
    pub email: String,
    pub quota: QuotaBody,
    /// Weight in fair sharing across tenants, 1 to 1000 (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// What happens to a lease whose GPUs show zero utilisation for a
    /// while; the node-agents' default (5 minutes, notify) when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_policy: Option<IdlePolicyBody>,
    /// The operator vouches for the tenant: its leases may also run on
    /// nodes that do not isolate workloads (process runtime). Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trusted: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IdlePolicyBody {
    /// Seconds of zero utilisation, 1 to 604800 (a week).
    pub window_seconds: u64,
    /// `notify` (an event only), `stop` (the lease is stopped) or
    /// `suspend` (its GPUs are freed until `POST /v1/leases/{id}/resume`).
    #[schema(value_type = String, example = "notify")]
    pub action: IdleAction,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaBody {
    pub max_gpus: u32,
    /// Most VRAM the tenant may hold at once, in GB; unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_vram_gb: Option<u32>,
    /// Most object storage (datasets, workspaces) the tenant may hold, in
    /// GB of 10^9 bytes; unlimited when absent, none at 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_storage_gb: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
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

/// What a sealed field shows once its tenant's key is destroyed.
pub const ERASED_MARKER: &str = "[erased]";

/// A tenant as the read model shows it. The name, e-mail and suspension
/// reason are opened with the tenant's key on each read; once that key is
/// destroyed they show [`ERASED_MARKER`].
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantView {
    pub id: Uuid,
    pub name: String,
    pub email: String,
    /// The tenant's data key was destroyed (`POST /v1/tenants/{id}/erase`).
    pub erased: bool,
    pub max_gpus: u32,
    pub max_vram_gb: Option<i32>,
    /// Most object storage the tenant may hold, in GB; unlimited when absent.
    #[serde(default)]
    pub max_storage_gb: Option<u32>,
    pub weight: u32,
    pub suspended: bool,
    /// Why the operator suspended it, opened with the tenant's key
    /// (`[erased]` once the key is gone); `erased` for a tenant erased
    /// after a suspension logged before reasons were sealed.
    pub suspended_reason: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// `GET /v1/tenants`: a page of tenants, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantPage {
    pub items: Vec<TenantView>,
    /// Pass as `after` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<Uuid>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SuspendTenant {
    /// Why, up to 500 characters; kept in the log sealed with the
    /// tenant's key, so an erasure makes it unreadable too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Also ask every lease of the tenant that has not ended to stop;
    /// otherwise running leases run on (and are billed) and waiting ones
    /// wait until the tenant is resumed.
    #[serde(default)]
    pub stop_leases: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantChanged {
    pub tenant: TenantView,
    /// Leases asked to stop by this call.
    #[serde(default)]
    pub leases_stopping: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangeQuota {
    pub quota: QuotaBody,
    /// Weight in fair sharing, 1 to 1000; unchanged when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_naming_an_unknown_field_is_refused_at_every_level() {
        let refused = |json: &str| serde_json::from_str::<CreateTenant>(json).is_err();
        let ok = r#"{"name":"a","email":"a@b.c","quota":{"max_gpus":1},"idle_policy":{"window_seconds":60,"action":"notify"}}"#;
        assert!(!refused(ok));
        assert!(refused(
            r#"{"name":"a","email":"a@b.c","quota":{"max_gpus":1},"colour":"red"}"#
        ));
        assert!(refused(
            r#"{"name":"a","email":"a@b.c","quota":{"max_gpus":1,"colour":"red"}}"#
        ));
        assert!(refused(
            r#"{"name":"a","email":"a@b.c","quota":{"max_gpus":1},"idle_policy":{"window_seconds":60,"action":"notify","colour":"red"}}"#
        ));
    }
}
