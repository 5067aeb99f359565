//! Telemetry samples on `LH_TELEMETRY` (not business events: losing one is
//! harmless, and they are kept 48 hours, not 365 days).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A node-agent's sign of life, every `LH_HEARTBEAT_MS` (1 s by default) on
/// [`crate::subject::heartbeat`]. The scheduler declares a node lost after a
/// silence of `LH_NODE_LOST_AFTER_MS`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub node_id: String,
    /// The node's clock when it sent this.
    pub at: DateTime<Utc>,
    pub running_leases: usize,
}
