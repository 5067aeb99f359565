//! A lease's workload log, which only the node it runs on holds: the
//! gateway asks that node on its own subject ([`subject::rpc_lease_logs`]).
//!
//! Offsets count the bytes the workload wrote since it started (plus the
//! agent's own marker lines), so that cutting an old part off the file
//! shifts none of them: a reader that follows from `next_offset` never sees
//! a byte twice, and learns from `dropped_before` what it can no longer get.

use std::time::Duration;

use lh_bus::Bus;
use lh_events::subject;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Most bytes one read returns; a request for more gets this many.
pub const MAX_LEASE_LOG_READ_BYTES: u64 = 256 * 1024;
/// What a read returns when the request names no `max_bytes`.
pub const DEFAULT_LEASE_LOG_READ_BYTES: u64 = 64 * 1024;

/// Request on [`subject::rpc_lease_logs`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseLogsRequest {
    pub lease_id: Uuid,
    /// Where to read from; 0 reads from the start of what is kept.
    #[serde(default)]
    pub offset: u64,
    /// Read the last this many bytes instead (`offset` is then ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<u64>,
    /// At most this many bytes, clamped to [`MAX_LEASE_LOG_READ_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// The placement whose log to read: the stream sequence of the
    /// `lease.placed` (or `lease.migrated`) that put the lease on the node.
    /// A lease moved away and back, or to other GPUs of the node, has a log
    /// for each; without it the latest the node keeps is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<u64>,
}

impl LeaseLogsRequest {
    /// The bytes this request may read, within the limit whatever it asked.
    pub fn read_bytes(&self) -> u64 {
        self.max_bytes
            .unwrap_or(DEFAULT_LEASE_LOG_READ_BYTES)
            .min(MAX_LEASE_LOG_READ_BYTES)
    }
}

/// A part of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseLogs {
    /// The bytes read, as UTF-8 (invalid sequences replaced). A character
    /// cut at the end of the read is left for the next one.
    pub data: String,
    /// Where the next read continues.
    pub next_offset: u64,
    /// Bytes before this offset are no longer kept.
    pub dropped_before: u64,
    /// The offset of the end of the log now.
    pub size: u64,
    /// The workload ended: nothing more will be written.
    pub finished: bool,
}

/// The node's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum LeaseLogsReply {
    Logs(LeaseLogs),
    /// The node keeps no log of this lease: it never ran a workload for it
    /// here, or the log is past its keep time.
    NotFound {
        why: String,
    },
}

/// Asks node `node_id` for a part of `request.lease_id`'s log.
pub async fn fetch(
    bus: &Bus,
    node_id: &str,
    request: &LeaseLogsRequest,
    timeout: Duration,
) -> lh_bus::Result<LeaseLogsReply> {
    lh_bus::rpc::call(bus, &subject::rpc_lease_logs(node_id), request, timeout).await
}
