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
