//! The tenant aggregate (`lh.evt.tenant.<id>`).

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A tenant came into being. Personal fields are encrypted with the tenant's
/// own key, which lives outside the log (crypto-shredding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TenantCreated {
    pub tenant_id: Uuid,
    /// Base64 of nonce ‖ ChaCha20-Poly1305 ciphertext of the name.
    pub name_sealed: String,
    /// Base64 of nonce ‖ ChaCha20-Poly1305 ciphertext of the e-mail address.
    pub email_sealed: String,
    /// Hex SHA-256 of the API key; the key itself is shown once and never stored.
    /// This key is the tenant's key 1.
    pub api_key_sha256: String,
    /// The key's visible beginning (`lh_` and 8 characters), by which the
    /// tenant tells its keys apart.
    pub api_key_prefix: String,
    pub quota: Quota,
    /// Weight in fair sharing across tenants (default 1).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// What node-agents do with this tenant's idle leases; the agent's
    /// default (`--idle-window-secs`, `--idle-action`) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_policy: Option<IdlePolicy>,
    /// An operator vouches for the tenant: its leases may also run on nodes
    /// that do not isolate workloads (process runtime). Absent means not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trusted: bool,
}

/// A tenant's rule for leases whose GPUs do nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IdlePolicy {
    /// Seconds of zero GPU utilisation before the lease counts as idle.
    pub window_seconds: u64,
    pub action: IdleAction,
}

// On a command line the values are listed bare: their docs speak of the
// events, and the flag's help says what each does there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Only `lease.idle_detected`: the tenant is told, the lease runs on.
    #[cfg_attr(feature = "clap", value(help = None::<&str>))]
    Notify,
    /// `lease.idle_detected`, then the node-agent asks for the lease to stop
    /// (`lease.stop_requested` by the node), which ends it as a stop does.
    #[cfg_attr(feature = "clap", value(help = None::<&str>))]
    Stop,
    /// `lease.idle_detected`, then the node-agent stops the workload and
    /// reports `lease.suspended`: its GPUs are freed and billing stops, the
    /// lease is kept; `POST /v1/leases/{id}/resume` queues it again.
    #[cfg_attr(feature = "clap", value(help = None::<&str>))]
    Suspend,
}

impl IdleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Notify => "notify",
            IdleAction::Stop => "stop",
            IdleAction::Suspend => "suspend",
        }
    }
}

fn default_weight() -> u32 {
    1
}

/// Per-tenant limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Quota {
    /// Most GPUs the tenant may hold at once, across all its leases. A
    /// fraction or MIG slice counts by its size (milli-GPU / 1000).
    pub max_gpus: u32,
    /// Most VRAM (GB) the tenant may hold at once; no limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_vram_gb: Option<u32>,
    /// Most object storage the tenant may hold, in GB (10^9 bytes); no
    /// limit when absent. 0 allows none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_storage_gb: Option<u32>,
}

/// Id of a tenant's first key, the one given at its creation.
pub const FIRST_API_KEY_ID: u32 = 1;

/// A tenant got another API key (`POST /v1/tenants/{id}/keys`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TenantApiKeyIssued {
    pub tenant_id: Uuid,
    /// Numbered per tenant from 2 up (key 1 came with `tenant.created`).
    pub key_id: u32,
    /// The key's visible beginning (`lh_` and 8 characters).
    pub prefix: String,
    /// Hex SHA-256 of the key; the key itself is shown once and never stored.
    pub sha256: String,
    /// From then on the key is refused; never when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

/// One of a tenant's API keys is refused from now on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TenantApiKeyRevoked {
    pub tenant_id: Uuid,
    pub key_id: u32,
}

/// A tenant may read but not change anything until `tenant.resumed`; its
/// waiting leases wait. Its running leases run on unless the admin asked
/// to stop them (each then gets its own `lease.stop_requested`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TenantSuspended {
    pub tenant_id: Uuid,
    /// Base64 of nonce ‖ ChaCha20-Poly1305 ciphertext of the operator's
    /// reason, sealed with the tenant's key like its name: free text may
    /// name a person, and the log can never forget it.
    pub reason_sealed: String,
    pub stop_leases: bool,
}

/// A suspended tenant may act again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TenantResumed {
    pub tenant_id: Uuid,
}

/// A tenant's quota and fair-share weight from now on; leases placed
/// already keep their GPUs, new placements follow the new quota.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TenantQuotaChanged {
    pub tenant_id: Uuid,
    pub quota: Quota,
    pub weight: u32,
}

/// The tenant's data key was destroyed: the sealed fields of its events
/// (name, e-mail) can no longer be opened by anyone, while the events
/// themselves, their hashes and the money they carry stay as they were.
/// The tenant is refused every write from then on; it is never resumed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TenantErased {
    pub tenant_id: Uuid,
}
