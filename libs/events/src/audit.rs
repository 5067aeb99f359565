//! The audit chain's signed checkpoints (`lh.evt.audit.chain`).

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
