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
    /// Whether the node needs the tenant's storage too: the workload mounts
    /// datasets or workspaces (docs/adr/031).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub storage: bool,
}

/// The lease's tenant's own identity on the object store, which may use the
/// tenant's bucket and nothing else: what the node stages datasets and
/// syncs workspaces with. Never logged, never written to disk.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageGrant {
    pub endpoint: String,
    pub region: String,
    pub bucket: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Plain HTTP to an endpoint off loopback, as the platform is set up.
    #[serde(default)]
    pub allow_http: bool,
}

impl std::fmt::Debug for StorageGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageGrant")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
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
        /// When asked for: the tenant's storage.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        storage: Option<StorageGrant>,
    },
    /// Not now: the gateway's view does not show the lease on this node
    /// yet, or the values are not stored yet (the request that stores them
    /// is still under way). Worth asking again.
    NotYet { why: String },
    /// Never: the lease is on another node or has ended, or its tenant is
    /// erased. The workload cannot start.
    Refused { why: String },
}

/// Asks the gateway, as node `node_id`, for `lease_id`'s environment, and
/// its tenant's storage when `storage`.
pub async fn fetch(
    bus: &Bus,
    node_id: &str,
    lease_id: Uuid,
    storage: bool,
    timeout: Duration,
) -> lh_bus::Result<WorkloadEnvReply> {
    lh_bus::rpc::call(
        bus,
        &subject::rpc_workload_env(node_id),
        &WorkloadEnvRequest { lease_id, storage },
        timeout,
    )
    .await
}
