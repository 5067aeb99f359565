//! Chain verification, as the audit service answers it on [`RPC_AUDIT_VERIFY`].
//!
//! The gateway serves the same report on `GET /v1/audit/verify` over [`call`].

use std::time::Duration;

use lh_bus::Bus;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The subject lives with the other subject names in `lh_events::subject`;
/// it is re-exported here so that a caller finds the contract in one place.
pub use lh_events::subject::RPC_AUDIT_VERIFY;

/// Request on [`RPC_AUDIT_VERIFY`]: an empty JSON object, `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VerifyRequest {}

/// Result of a verification run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VerifyResponse {
    /// True when every link, stored row and stored checkpoint agrees.
    pub ok: bool,
    /// Events chained (stream messages up to `sequence`, checkpoints included).
    pub events: u64,
    /// Hex SHA-256 chain head recomputed from the stream at `sequence`.
    pub head: String,
    /// Last stream sequence verified: the last one the audit copy held.
    pub sequence: u64,
    /// First stream sequence at which the stream, the stored copy or the
    /// stored hash disagree; null when none does.
    pub first_mismatch: Option<u64>,
    /// Stored checkpoints up to `sequence` whose signature verifies and whose
    /// head and event count match the recomputed chain.
    pub checkpoints_verified: u64,
    /// Stored checkpoints up to `sequence`, verified or not (from the
    /// anchor on when verification started from one).
    pub checkpoints: u64,
    /// The signed checkpoint verification started from, once the log's
    /// oldest events have expired; null while the log starts at sequence 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<VerifyAnchor>,
    /// First sequence whose link was recomputed: 1, or the one after the
    /// anchor.
    #[serde(default = "genesis_next")]
    pub checked_from: u64,
    /// Why verification could not be done at all (no anchor precedes the
    /// log's first sequence, or the anchor is not signed by the pinned key);
    /// `ok` is false when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The checkpoint a verification rests on: its head, pinned by its
/// signature, stands in for the expired events before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VerifyAnchor {
    /// Stream sequence the checkpoint covers.
    pub sequence: u64,
    /// Events chained up to and including `sequence`.
    pub events: u64,
    /// Hex chain head at `sequence`.
    pub head: String,
}

/// A report from before anchors were verified from 1.
fn genesis_next() -> u64 {
    1
}

/// Asks a running audit service to verify the chain (what the gateway calls).
/// Verification replays the whole log, so give it a generous `timeout`.
pub async fn call(bus: &Bus, timeout: Duration) -> lh_bus::Result<VerifyResponse> {
    lh_bus::rpc::call(bus, RPC_AUDIT_VERIFY, &VerifyRequest {}, timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_object_is_a_request_and_the_report_has_the_documented_fields() {
        let _: VerifyRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(serde_json::to_string(&VerifyRequest {}).unwrap(), "{}");
        let report = VerifyResponse {
            ok: false,
            events: 3,
            head: "ab".into(),
            sequence: 3,
            first_mismatch: Some(2),
            checkpoints_verified: 0,
            checkpoints: 1,
            anchor: None,
            checked_from: 1,
            problem: None,
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "ok": false, "events": 3, "head": "ab", "sequence": 3,
                "first_mismatch": 2, "checkpoints_verified": 0, "checkpoints": 1,
                "checked_from": 1
            })
        );
        let older: VerifyResponse = serde_json::from_value(serde_json::json!({
            "ok": false, "events": 3, "head": "ab", "sequence": 3,
            "first_mismatch": 2, "checkpoints_verified": 0, "checkpoints": 1
        }))
        .unwrap();
        assert_eq!(
            older, report,
            "a report without the anchor fields still reads"
        );
    }
}
