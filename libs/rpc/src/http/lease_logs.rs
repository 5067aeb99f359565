//! A lease's workload log (`GET /v1/leases/{id}/logs`), a part at a time,
//! as the gateway relays it from the node that holds it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A part of a lease's workload log.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LeaseLogsView {
    /// What the workload wrote (stdout and stderr interleaved), as UTF-8.
    pub data: String,
    /// Where the next read continues.
    pub next_offset: u64,
    /// Bytes before this offset are no longer kept (the file outgrew its
    /// limit); a line `[leasehold: N bytes of older output dropped]` marks
    /// the gap.
    pub dropped_before: u64,
    /// The offset of the end of the log now.
    pub size: u64,
    /// The workload ended: once `next_offset` reaches `size`, nothing more
    /// will come.
    pub finished: bool,
    /// The node whose log this is; null while the lease is on none.
    pub node_id: Option<String>,
    /// The placement whose log this is (the stream sequence of the
    /// `lease.placed` or `lease.migrated` that put the lease there): a new
    /// one, on the same node or another, starts a new log from offset 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<u64>,
    /// Why there is nothing to read, where that is so: the lease is on no
    /// node (yet), or runs no workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// A lease across nodes: every member, in node-rank order; each keeps
    /// the log of its own part (`?node=` reads it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
}
