//! What the audit service answers on NATS:
//!
//! * chain verification on [`RPC_AUDIT_VERIFY`]; the gateway serves the same
//!   report on `GET /v1/audit/verify` over [`call`];
//! * a filtered page of its copy of the log on [`RPC_AUDIT_EVENTS`]; the
//!   gateway serves it on `GET /v1/audit/events` over [`call_events`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::Bus;
use lh_events::trail::Outcome;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// The subjects live with the other subject names in `lh_events::subject`;
/// they are re-exported here so that a caller finds the contract in one place.
pub use lh_events::subject::{RPC_AUDIT_EVENTS, RPC_AUDIT_VERIFY};

/// Records in a page when the request names no limit.
pub const DEFAULT_AUDIT_PAGE_RECORDS: u32 = 100;
/// Most records in one page.
pub const MAX_AUDIT_PAGE_RECORDS: u32 = 1000;
/// Longest text filter (actor, event type) accepted, in characters.
pub const MAX_AUDIT_FILTER_CHARS: usize = 200;

/// Request on [`RPC_AUDIT_EVENTS`]: which records of the audit copy, in
/// stream order. Every filter given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EventsRequest {
    /// Only events of this tenant (the envelope's `tenant_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<Uuid>,
    /// Only events caused by this principal, as records name it
    /// (`tenant:<id>`, `admin:<name>`, `auditor:<name>`, `service:<name>`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// Only events of this type, e.g. `lease.placed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// Only events that occurred at or after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<DateTime<Utc>>,
    /// Only events that occurred before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<DateTime<Utc>>,
    /// Only events after this stream sequence: the previous page's `next`.
    #[serde(default)]
    pub after: u64,
    /// Most records in the page, 1 to [`MAX_AUDIT_PAGE_RECORDS`].
    pub limit: u32,
}

impl EventsRequest {
    /// What is wrong with the request, naming the field; `None` when it
    /// can be answered.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if !(1..=MAX_AUDIT_PAGE_RECORDS).contains(&self.limit) {
            return Some((
                "limit",
                format!("limit must be 1 to {MAX_AUDIT_PAGE_RECORDS}"),
            ));
        }
        for (field, text) in [("actor", &self.actor), ("type", &self.event_type)] {
            if text
                .as_ref()
                .is_some_and(|t| t.is_empty() || t.chars().count() > MAX_AUDIT_FILTER_CHARS)
            {
                return Some((
                    field,
                    format!("{field} must be 1 to {MAX_AUDIT_FILTER_CHARS} characters"),
                ));
            }
        }
        if let (Some(from), Some(to)) = (self.from, self.to) {
            if from >= to {
                return Some(("to", "to must be after from".to_string()));
            }
        }
        None
    }
}

/// One event as the audit trail records it: when, who, what, to what, with
/// which outcome, and the event itself. A stored message that could not be
/// decoded is a record too, with what could be read of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditRecord {
    /// Stream sequence in the business log.
    pub sequence: u64,
    /// When the event occurred (UTC).
    pub occurred_at: Option<DateTime<Utc>>,
    /// The principal that caused it, e.g. `tenant:<id>` or `auditor:alice`.
    pub actor: Option<String>,
    /// Event type, e.g. `lease.placed`.
    pub event_type: Option<String>,
    /// What it is about: its aggregate, e.g. `lease.<id>` or `tenant.<id>`.
    pub object: Option<String>,
    /// The tenant it belongs to, where it names one.
    pub tenant_id: Option<Uuid>,
    /// `failure` for a refusal (refused requests, rejected leases),
    /// `success` otherwise.
    pub outcome: Option<Outcome>,
    /// Subject it is stored on.
    pub subject: String,
    /// Why the message was not decoded, for one that was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<String>,
    /// The stored envelope as JSON (a string when the bytes are no JSON).
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
}

/// Reply on [`RPC_AUDIT_EVENTS`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventsPage {
    pub events: Vec<AuditRecord>,
    /// Pass as `after` for the next page; null when this page is the last.
    pub next: Option<u64>,
}

/// Request on [`RPC_AUDIT_VERIFY`]: `{}` verifies incrementally, from the
/// last verified checkpoint to the head.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VerifyRequest {
    /// Re-verify everything from the genesis or the anchor, bypassing the
    /// cached result and the last verified checkpoint: it replays the whole
    /// log, so only admins may ask for it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub full: bool,
}

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
    /// Events chained by the run that produced this report: the ones after
    /// the checkpoint it resumed from (all of them for a full run).
    #[serde(default)]
    pub events_checked_this_run: u64,
    /// The checkpoint an earlier run verified, where this run resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<VerifyAnchor>,
    /// The first checkpoint on the stream that did not hold: not signed by
    /// a pinned key, a bad signature, or a head the stream contradicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_bad_checkpoint: Option<VerifyBadCheckpoint>,
    /// Number of the verification run (since the service started) that
    /// produced this report: calls that shared a run, or got its cached
    /// result, carry the same number.
    #[serde(default)]
    pub run: u64,
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

/// A checkpoint on the stream that did not hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VerifyBadCheckpoint {
    /// The sequence the checkpoint signs.
    pub sequence: u64,
    /// The stream sequence of the checkpoint message itself.
    pub checkpoint_at: u64,
    /// Why, in the words of `lh audit verify`: `key_not_pinned`,
    /// `bad_signature`, `events_mismatch`, `head_mismatch`, ...
    pub reason: String,
}

/// A report from before anchors were verified from 1.
fn genesis_next() -> u64 {
    1
}

/// Asks a running audit service to verify the chain (what the gateway calls).
/// The first run after a start may replay the whole log, so give it a
/// generous `timeout`.
pub async fn call(bus: &Bus, timeout: Duration) -> lh_bus::Result<VerifyResponse> {
    call_with(bus, &VerifyRequest::default(), timeout).await
}

/// [`call`] with a request, e.g. a full re-verification.
pub async fn call_with(
    bus: &Bus,
    request: &VerifyRequest,
    timeout: Duration,
) -> lh_bus::Result<VerifyResponse> {
    lh_bus::rpc::call(bus, RPC_AUDIT_VERIFY, request, timeout).await
}

/// Asks the audit service for a page of its copy of the log.
pub async fn call_events(
    bus: &Bus,
    request: &EventsRequest,
    timeout: Duration,
) -> lh_bus::Result<EventsPage> {
    lh_bus::rpc::call(bus, RPC_AUDIT_EVENTS, request, timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_object_is_a_request_and_the_report_has_the_documented_fields() {
        let _: VerifyRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(
            serde_json::to_string(&VerifyRequest::default()).unwrap(),
            "{}"
        );
        let full: VerifyRequest = serde_json::from_str(r#"{"full":true}"#).unwrap();
        assert!(full.full);
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
            events_checked_this_run: 0,
            resumed_from: None,
            first_bad_checkpoint: None,
            run: 0,
            problem: None,
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "ok": false, "events": 3, "head": "ab", "sequence": 3,
                "first_mismatch": 2, "checkpoints_verified": 0, "checkpoints": 1,
                "checked_from": 1, "events_checked_this_run": 0, "run": 0
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
