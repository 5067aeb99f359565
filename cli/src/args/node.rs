//! The flags of `lh node ...`: a node taken out of placement and back.

use clap::{Args, Subcommand};
use lh_events::DrainMode;

/// `lh node ...`
#[derive(Debug, Clone, Subcommand)]
pub enum NodeCommand {
    /// Place nothing new on a node; its running leases finish or move.
    Drain(NodeDrain),
    /// Let a drained node take new leases again.
    Uncordon(NodeId),
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

/// `lh node uncordon`
#[derive(Debug, Clone, Args)]
pub struct NodeId {
    /// Node id.
    pub id: String,
}
