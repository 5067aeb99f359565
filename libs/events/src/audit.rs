//! The audit chain's signed checkpoints, the prunes of its copy and the
//! divergences verification found, the reads of the trail (`lh.evt.audit.chain`), the summaries of refused requests (`lh.evt.access.refusals`),
//! and the summaries of events the platform refused to obey
//! (`lh.evt.security.refusals`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A signed statement of the audit chain's head at a stream sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AuditCheckpoint {
    pub sequence: u64,
    pub head: String,
    pub events: u64,
    /// Hex ed25519 public key that signed `head`.
    pub public_key: String,
    /// Hex ed25519 signature over the checkpoint statement (see schemas/audit-chain.md).
    pub signature: String,
}

/// The audit copy in PostgreSQL dropped the rows the log no longer holds:
/// the log's first sequence was `below_sequence`, and verification now rests
/// on the signed checkpoint at `anchor_checkpoint` (the sequence it covers).
/// Rows from the anchor on are kept: they link the anchor to the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AuditPruned {
    pub below_sequence: u64,
    pub anchor_checkpoint: u64,
}

/// What verification found wrong, as far as it can tell the cases apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DivergenceKind {
    /// The copy holds the sequence, but its subject, payload or link is
    /// not what the stream (or, for an expired event, the chain) says.
    CopyRowDiffers,
    /// The stream holds the sequence, the copy does not.
    MissingFromCopy,
    /// The copy holds the sequence, the stream (which still should) does not.
    MissingFromStream,
    /// Stream and copy agree, but a checkpoint does not hold: a stored one
    /// that does not verify, or one on the stream not signed by a pinned key.
    CheckpointFails,
}

impl DivergenceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DivergenceKind::CopyRowDiffers => "copy_row_differs",
            DivergenceKind::MissingFromCopy => "missing_from_copy",
            DivergenceKind::MissingFromStream => "missing_from_stream",
            DivergenceKind::CheckpointFails => "checkpoint_fails",
        }
    }
}

/// A verification run found the log and the audit copy in PostgreSQL (or
/// a checkpoint) disagreeing. Recorded once per finding: the same first
/// sequence and kind found again is not recorded again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AuditDivergenceDetected {
    /// The first sequence found wrong: the first mismatching row, or for
    /// `checkpoint_fails` the sequence the failing checkpoint signs.
    pub first_sequence: u64,
    pub kind: DivergenceKind,
    /// The run checked the sequences from `checked_from` to `checked_to`,
    /// both included.
    pub checked_from: u64,
    pub checked_to: u64,
    /// Hex chain head the run recomputed at `checked_to`.
    pub head: String,
    /// True for a full run (from the genesis or the anchor), false for an
    /// incremental one.
    pub full: bool,
}

/// An operator read the audit trail through the gateway. The envelope's
/// actor says who; this says what they asked and how much they were given,
/// so that reading the trail leaves a trace in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AuditAccessed {
    /// The route read, e.g. `/v1/audit/events`.
    pub route: String,
    /// The filter as asked: each query parameter given, by name.
    pub filter: BTreeMap<String, String>,
    /// Records answered.
    pub records: u64,
}

/// Requests the gateway refused (401, 403, 429) from one principal or
/// source in one interval, summed: a flood of bad keys becomes one event
/// per source and interval instead of one per request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AccessRefused {
    /// Who was refused: `ip:<network>` (the address's /24 or /48) when the
    /// request named no known principal, else the principal
    /// (`tenant:<id>`, `auditor:<name>`, ...);
    /// `others` for the sources past the per-interval limit, summed.
    pub source: String,
    /// Start of the interval (UTC).
    pub from: DateTime<Utc>,
    /// End of the interval (UTC), exclusive.
    pub to: DateTime<Utc>,
    /// Refused requests in the interval.
    pub refused: u64,
    /// Refused requests by HTTP status (`"401"`, `"403"`, `"429"`).
    pub by_status: BTreeMap<String, u64>,
    /// Refused requests by route template (`GET /v1/leases`, ...); routes
    /// past the per-source limit are summed under `others`.
    pub by_route: BTreeMap<String, u64>,
}

/// Events on the log that every reader refused to obey, from one
/// publisher for one reason in one interval, summed: what an operator
/// sees of a node (or any credential) that acts beyond what it holds.
/// The events themselves stay in the trail, each with its reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SecurityEventsRefused {
    /// The publisher as the subject's last token names it, which the NATS
    /// permissions hold each user to (`node-<id>`, `scheduler`,
    /// `gateway`, ...); `others` for the publishers past the per-interval
    /// limit, summed.
    pub publisher: String,
    /// Why (`not_authorized`, `not_enrolled`, `stale_report`,
    /// `not_owner`, `wrong_subject`).
    pub reason: String,
    /// Start of the interval (UTC).
    pub from: DateTime<Utc>,
    /// End of the interval (UTC), exclusive.
    pub to: DateTime<Utc>,
    /// Events refused in the interval.
    pub refused: u64,
    /// The log sequences of the first and the last of them.
    pub first_sequence: u64,
    pub last_sequence: u64,
    /// Refused events by type; types past the limit are summed under
    /// `others`.
    pub by_event_type: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_divergence_kind_is_named_as_it_is_stored() {
        for kind in [
            DivergenceKind::CopyRowDiffers,
            DivergenceKind::MissingFromCopy,
            DivergenceKind::MissingFromStream,
            DivergenceKind::CheckpointFails,
        ] {
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::from(kind.as_str())
            );
        }
    }
}
