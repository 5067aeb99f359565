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
    /// Its GPUs' last readings, for the fleet's view; none before the
    /// first sample (and from agents older than them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuReading>,
}

/// Most GPU readings a heartbeat's reader keeps of one node.
pub const MOST_GPU_READINGS: usize = 256;

/// One GPU's last reading, as a heartbeat carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuReading {
    pub index: u32,
    /// `None` where the device cannot tell (MIG mode, some boards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_pct: Option<u32>,
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
    pub temperature_c: u32,
}

/// What one lease used of its GPUs over the last sample, every
/// `LH_USAGE_INTERVAL_SECS` (5 s by default) on [`crate::subject::usage`], under the node that reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseUsage {
    pub lease_id: uuid::Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<uuid::Uuid>,
    pub node_id: String,
    /// The node's clock at the sample.
    pub at: DateTime<Utc>,
    pub gpus: Vec<LeaseGpuUsage>,
}

/// One GPU of a lease in a [`LeaseUsage`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseGpuUsage {
    pub index: u32,
    pub uuid: String,
    /// The device's utilisation: leases that share a GPU all see the whole
    /// device's figure (NVML does not split it by process cheaply). `None`
    /// where the device cannot tell (MIG mode, some boards).
    pub utilization_pct: Option<u32>,
    /// Memory in use on the device that is this lease's: all of it for a
    /// whole GPU; for a shared GPU its processes' memory when the backend
    /// reports processes of the lease, else a share of the device's in
    /// proportion to the VRAM each lease holds.
    pub memory_used_mib: u64,
    /// Other leases hold part of this GPU.
    pub shared: bool,
    /// The device's temperature (°C), the same for every lease on it.
    /// Absent in samples of older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<u32>,
    /// The device's power draw (W), the same for every lease on it: NVML
    /// cannot split it by process. Absent where the board does not report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_w: Option<f64>,
}
