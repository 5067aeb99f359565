//! The fleet as the scheduler folds it, answered on [`RPC_SCHEDULER_FLEET`]:
//! each node's zone, state, GPUs, their health and what holds them.
//!
//! The scheduler folds every node and lease event to place leases, so it
//! answers from memory (a view it renews at most every
//! [`FLEET_VIEW_EVERY_MS`] of its decision passes); the gateway serves
//! `GET /v1/nodes` and the catalogue of `GET /v1/gpus` from it and keeps no
//! copy, at the cost of answering 503 while no scheduler runs.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::Bus;
use lh_events::{DrainMode, GpuHealth, GpuSharing, Isolation};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

pub use lh_events::subject::RPC_SCHEDULER_FLEET;

/// How often, at most, the scheduler renews the view it answers from.
pub const FLEET_VIEW_EVERY_MS: i64 = 500;
/// Longest node id a request may name, in bytes.
pub const MAX_NODE_ID_LEN: usize = 128;

/// Request on [`RPC_SCHEDULER_FLEET`]: every node, or the one named.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
}

/// The answer: nodes ordered by id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FleetView {
    /// When the scheduler last renewed the view.
    pub as_of: Option<DateTime<Utc>>,
    pub nodes: Vec<NodeView>,
}

/// Where a node stands for placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Takes leases.
    Ready,
    /// Takes no new lease (`drain_mode` says what becomes of its own).
    Draining,
    /// Not heard within the loss window: its leases moved or ended.
    Lost,
}

/// One node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub id: String,
    pub zone: String,
    pub state: NodeState,
    /// How it is being drained, while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub drain_mode: Option<DrainMode>,
    /// Its last heartbeat before it was found lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_since: Option<DateTime<Utc>>,
    /// When the scheduler last heard its heartbeat (the scheduler's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    #[schema(value_type = String)]
    pub isolation: Isolation,
    #[schema(value_type = String)]
    pub gpu_sharing: GpuSharing,
    /// The interconnect it declared it shares with other nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<String>,
    pub gpus: Vec<GpuView>,
}

/// One GPU of a node, and what holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub vram_gb: u32,
    #[schema(value_type = String)]
    pub health: GpuHealth,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_since: Option<DateTime<Utc>>,
    /// In MIG mode.
    pub mig: bool,
    /// The lease holding it whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<Uuid>,
    /// The leases sharing it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ShareView>,
    /// Thousandths of its compute held (1000: whole).
    pub used_milli: u32,
    pub used_vram_gb: u32,
    /// Its node's last reading, from its last heartbeat: busy percent
    /// (none where the device cannot tell), memory in use, temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_pct: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<u32>,
}

/// A lease's share of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ShareView {
    pub lease_id: Uuid,
    pub milli: u32,
    pub vram_gb: u32,
    /// The MIG profile, for a MIG instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
}

/// Asks the scheduler for the fleet, or one node of it.
pub async fn call(
    bus: &Bus,
    request: &FleetRequest,
    timeout: Duration,
) -> lh_bus::Result<FleetView> {
    lh_bus::rpc::call(bus, RPC_SCHEDULER_FLEET, request, timeout).await
}
