//! A lease's environment, which the log does not hold: the node the lease
//! is placed on asks the gateway for it on its own subject
//! ([`subject::rpc_workload_env`]) when it starts the workload.

use std::collections::BTreeMap;
use std::time::Duration;

use lh_bus::Bus;
use lh_events::subject;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Request on [`subject::rpc_workload_env`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadEnvRequest {
    /// The lease whose workload is starting on the asking node.
    pub lease_id: Uuid,
}

/// The gateway's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum WorkloadEnvReply {
    /// The values, with the hex salt they hash with
    /// (`lh_domain::workload::env_digest`).
    Values {
        values: BTreeMap<String, String>,
        salt: String,
    },
    /// Not now: the gateway's view does not show the lease on this node
    /// yet, or the values are not stored yet (the request that stores them
    /// is still under way). Worth asking again.
    NotYet { why: String },
    /// Never: the lease is on another node or has ended, or its tenant is
    /// erased. The workload cannot start.
    Refused { why: String },
}

/// Asks the gateway, as node `node_id`, for `lease_id`'s environment.
pub async fn fetch(
    bus: &Bus,
    node_id: &str,
    lease_id: Uuid,
    timeout: Duration,
) -> lh_bus::Result<WorkloadEnvReply> {
    lh_bus::rpc::call(
        bus,
        &subject::rpc_workload_env(node_id),
        &WorkloadEnvRequest { lease_id },
        timeout,
    )
    .await
}
