//! What leases used of their GPUs (`GET /v1/usage`,
//! `GET /v1/leases/{id}/usage`): per lease and GPU, one point per step
//! that had a sample.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub step_seconds: u32,
    /// Ordered by node, GPU index and lease.
    pub series: Vec<UsageSeries>,
}

/// One GPU of one lease.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageSeries {
    pub lease_id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub node_id: String,
    pub gpu_index: u32,
    pub gpu_uuid: String,
    /// Oldest first.
    pub points: Vec<UsagePoint>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsagePoint {
    /// Start of the step.
    pub at: DateTime<Utc>,
    /// Samples in the step.
    pub samples: u64,
    /// Minutes of the step that had a sample. The averages are over those
    /// minutes: `memory_used_mib_avg × minutes ÷ (step in minutes)` is the
    /// step's mean, counting minutes without samples as nothing used.
    pub minutes: u32,
    /// Null when no sample of the step told it (MIG mode).
    pub utilization_pct_avg: Option<f64>,
    pub memory_used_mib_avg: f64,
    pub memory_used_mib_max: u64,
    /// Null when no sample of the step told it.
    pub temperature_c_max: Option<u32>,
    /// Null when no sample of the step told it.
    pub power_w_avg: Option<f64>,
}
