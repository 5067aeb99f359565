//! The tenant aggregate (`lh.evt.tenant.<id>`).

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
    pub api_key_sha256: String,
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
    pub window_s: u64,
    pub action: IdleAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Only `lease.idle_detected`: the tenant is told, the lease runs on.
    Notify,
    /// `lease.idle_detected`, then the node-agent asks for the lease to stop
    /// (`lease.stop_requested` by the node), which ends it as a stop does.
    Stop,
    /// `lease.idle_detected`, then the node-agent stops the workload and
    /// reports `lease.suspended`: its GPUs are freed and billing stops, the
    /// lease is kept; `POST /v1/leases/{id}/resume` queues it again.
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
}
