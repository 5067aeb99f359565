//! Nodes (`/v1/nodes/{id}/enroll`, `/drain` and `/uncordon`): the operator
//! vouches for a node, takes it out of placement and back in.

use lh_events::{DrainMode, GpuSharing, Isolation};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainNode {
    /// `finish`: running leases end where they are; `move`: the scheduler
    /// moves them to other nodes now.
    #[schema(value_type = String, example = "move")]
    pub mode: DrainMode,
    /// Why, for the log (up to 500 characters).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeCordonView {
    pub node_id: String,
    pub cordoned: bool,
    /// How running leases leave, while cordoned.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub drain: Option<DrainMode>,
    /// Stream sequence of the event that recorded it.
    pub sequence: u64,
}

/// What an operator vouches a node may claim when it registers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnrollNode {
    /// The zone it is in (1 to 64 characters).
    pub zone: String,
    /// Most GPUs it may register (1 to 1024).
    pub max_gpus: u32,
    /// The GPU models it may register, each one the catalog knows.
    pub gpu_models: Vec<String>,
    /// The strongest isolation it may claim: `none`, `cgroup` or
    /// `container` (default `none`).
    #[serde(default, skip_serializing_if = "Isolation::is_none")]
    #[schema(value_type = String, example = "container")]
    pub max_isolation: Isolation,
    /// How it may share GPUs besides not at all: `mig`, `hami-core`, `mps`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<String>, example = json!(["hami-core"]))]
    pub gpu_sharing: Vec<GpuSharing>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeEnrollmentView {
    pub node_id: String,
    pub zone: String,
    pub max_gpus: u32,
    pub gpu_models: Vec<String>,
    #[schema(value_type = String)]
    pub max_isolation: Isolation,
    #[schema(value_type = Vec<String>)]
    pub gpu_sharing: Vec<GpuSharing>,
    /// Stream sequence of the `node.enrolled` that recorded it.
    pub sequence: u64,
}

/// `GET /v1/gpus`: what may be rented now, by GPU model and zone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GpuCatalogue {
    /// When the scheduler last renewed the fleet this counts.
    pub as_of: Option<chrono::DateTime<chrono::Utc>>,
    /// Ordered by model, then zone.
    pub offers: Vec<GpuOffer>,
}

/// GPUs of one model in one zone, on nodes that take leases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GpuOffer {
    pub gpu_model: String,
    /// Memory of one GPU, GB.
    pub vram_gb: u32,
    pub zone: String,
    /// GPUs of the model in the zone, on nodes that take leases.
    pub gpus_total: u32,
    /// Healthy GPUs no lease holds, whole or in part: what `--gpus N` takes.
    pub gpus_free: u32,
    /// Compute free for shares (`--gpu-fraction`), in thousandths of a GPU,
    /// over the healthy GPUs that are not in MIG mode.
    pub free_milli: u64,
    /// Of `gpus_total`, those in MIG mode (`--mig-profile`).
    pub mig_gpus: u32,
    /// Price of one whole GPU for an hour on each tier of the book in
    /// force, CNY; none while pricing does not answer.
    pub prices: Vec<TierOffer>,
    /// The spot price of one whole GPU for an hour now, CNY; none while the
    /// spot market has published none for the zone and model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "3.20")]
    #[serde(with = "rust_decimal::serde::str_option")]
    pub spot_cny_per_gpu_hour: Option<rust_decimal::Decimal>,
}

/// One tier's price of a whole GPU for an hour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TierOffer {
    #[schema(value_type = String, example = "basic")]
    pub tier: lh_events::Tier,
    /// CNY, as a decimal string.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "4.80")]
    pub cny_per_gpu_hour: rust_decimal::Decimal,
}
