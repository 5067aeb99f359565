//! The audit chain's signed checkpoints and the prunes of its copy
//! (`lh.evt.audit.chain`).

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
