//! The flags of `lh node ...`: a node taken out of placement and back.

use clap::{Args, Subcommand};
use lh_events::{DrainMode, GpuSharing, Isolation};

/// `lh node ...`
#[derive(Debug, Clone, Subcommand)]
pub enum NodeCommand {
    /// Vouch for a node: what its registration may claim. A node no
    /// operator enrolled is in no fleet, whatever it says of itself.
    Enroll(NodeEnroll),
    /// Place nothing new on a node; its running leases finish or move.
    Drain(NodeDrain),
    /// Let a drained node take new leases again.
    Uncordon(NodeId),
    /// List the fleet: each node's zone, state, GPUs in use, their health
    /// and its last heartbeat.
    Ls,
    /// One node: its state and each GPU's model, health and holders.
    Get(NodeId),
}

/// `lh node drain`
#[derive(Debug, Clone, Args)]
pub struct NodeDrain {
    /// Node id.
    pub id: String,
    /// `finish`: running leases end where they are; `move`: moved now.
    #[arg(long, value_enum)]
    pub mode: DrainMode,
    /// Why, for the log.
    #[arg(long)]
    pub reason: Option<String>,
}

/// `lh node enroll`
#[derive(Debug, Clone, Args)]
pub struct NodeEnroll {
    /// Node id: letters, digits, `-` and `_` (its NATS user's name).
    pub id: String,
    /// The zone it is in.
    #[arg(long)]
    pub zone: String,
    /// Most GPUs it may register.
    #[arg(long)]
    pub max_gpus: u32,
    /// A GPU model it may register; repeat for several.
    #[arg(long = "gpu-model", required = true)]
    pub gpu_models: Vec<String>,
    /// The strongest isolation it may claim.
    #[arg(long, value_enum, default_value = "none")]
    pub max_isolation: Isolation,
    /// A way it may share GPUs; repeat for several.
    #[arg(long = "gpu-sharing", value_enum)]
    pub gpu_sharing: Vec<GpuSharing>,
}

/// `lh node uncordon`, `lh node get`
#[derive(Debug, Clone, Args)]
pub struct NodeId {
    /// Node id.
    pub id: String,
}
