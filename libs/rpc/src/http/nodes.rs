//! Nodes (`/v1/nodes/{id}/drain` and `/uncordon`): the operator takes a
//! node out of placement and back in.

use lh_events::DrainMode;
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
