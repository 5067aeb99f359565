//! The envelope every event travels in, who caused it, its id, and what a
//! writer expects of the aggregate's subject when it appends.

use chrono::{DateTime, SubsecRound, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::EventData;

/// Namespace for deterministic (UUIDv5) event ids: a retried or replayed
/// handler derives the same id for the same cause, and JetStream's duplicate
/// window drops the second copy.
pub const ID_NAMESPACE: Uuid = Uuid::from_u128(0x6c68_2d65_7665_6e74_2d69_6473_2d76_3100);

/// Derives a deterministic id from a cause (for example `lease_id` and a step name).
pub fn derived_id(parts: &[&str]) -> Uuid {
    Uuid::new_v5(&ID_NAMESPACE, parts.join("\u{1f}").as_bytes())
}

/// Who caused an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum Actor {
    Tenant(Uuid),
    /// The one shared admin token of older logs: nobody in particular.
    /// Writers name the operator instead ([`Actor::Operator`]).
    Admin,
    /// The shared auditor token of older logs; see [`Actor::Admin`].
    Auditor,
    Service(String),
    Node(String),
    /// A named person or credential acting as admin or auditor.
    Operator(Operator),
}

/// A named operator: who signed in, and in which role.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct Operator {
    /// The principal's name: a named key's name, an OIDC subject, or
    /// `bootstrap` for the bootstrap admin token.
    pub name: String,
    pub role: OperatorRole,
}

/// What an operator may do: an admin acts, an auditor only reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OperatorRole {
    Admin,
    Auditor,
}

impl OperatorRole {
    pub fn as_str(self) -> &'static str {
        match self {
            OperatorRole::Admin => "admin",
            OperatorRole::Auditor => "auditor",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "admin" => Some(OperatorRole::Admin),
            "auditor" => Some(OperatorRole::Auditor),
            _ => None,
        }
    }
}

/// The envelope every event travels in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Envelope {
    pub id: Uuid,
    /// Event type, for example `lease.placed`; mirrors the `type` tag of `data`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// Version of the payload's type (each event type has its own).
    pub version: u16,
    /// UTC, truncated to microseconds.
    pub occurred_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<Uuid>,
    pub actor: Actor,
    pub correlation_id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causation_id: Option<Uuid>,
    pub data: EventData,
}

impl Envelope {
    /// A new event with a fresh UUIDv7 id that starts its own correlation.
    pub fn new(actor: Actor, occurred_at: DateTime<Utc>, data: EventData) -> Self {
        Self::new_with_id(Uuid::now_v7(), actor, occurred_at, data)
    }

    /// As [`Envelope::new`] with `id` (a [`derived_id`]) for its id and
    /// correlation: what `new(..).with_id(id)` gives, without drawing an id
    /// to throw away (a draw from the system's generator each).
    pub fn new_with_id(
        id: Uuid,
        actor: Actor,
        occurred_at: DateTime<Utc>,
        data: EventData,
    ) -> Self {
        Self {
            id,
            event_type: data.event_type().to_string(),
            version: data.version(),
            occurred_at: occurred_at.trunc_subsecs(6),
            tenant_id: data.tenant_id(),
            actor,
            correlation_id: id,
            causation_id: None,
            data,
        }
    }

    /// An event caused by `cause`: same correlation, causation set.
    pub fn caused_by(mut self, cause: &Envelope) -> Self {
        self.correlation_id = cause.correlation_id;
        self.causation_id = Some(cause.id);
        if self.tenant_id.is_none() {
            self.tenant_id = cause.tenant_id;
        }
        self
    }

    /// Replaces the id with a deterministic one (see [`derived_id`]).
    pub fn with_id(mut self, id: Uuid) -> Self {
        if self.causation_id.is_none() {
            self.correlation_id = id;
        }
        self.id = id;
        self
    }

    /// The subject this event is stored on: its aggregate's, then its
    /// verb and its publisher (see [`crate::subject`]).
    pub fn subject(&self) -> String {
        crate::subject::event(
            &self.data.aggregate_subject(),
            &self.event_type,
            &self.actor,
        )
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an envelope always serialises")
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// What a writer expects of the aggregate before its write: the
/// optimistic-concurrency guard that every decision carries (see
/// docs/adr/002).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// No expectation.
    Any,
    /// The aggregate's last message (under `<aggregate>.>`) is at this
    /// stream sequence (0: there is none).
    LastSubjectSequence(u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stored before operators were named: the bare shared-token actors.
    const OLD_STOP_BY_ADMIN: &str = r#"{"id":"0190d1c4-7f3a-7000-8000-000000000001","type":"lease.stop_requested","version":1,"occurred_at":"2026-11-01T10:00:00Z","tenant_id":"0190d1c4-7f3a-7000-8000-000000000002","actor":{"kind":"admin"},"correlation_id":"0190d1c4-7f3a-7000-8000-000000000001","data":{"type":"lease.stop_requested","lease_id":"0190d1c4-7f3a-7000-8000-000000000003"}}"#;

    #[test]
    fn an_old_envelope_with_the_bare_admin_or_auditor_still_decodes() {
        let admin = Envelope::decode(OLD_STOP_BY_ADMIN.as_bytes()).unwrap();
        assert_eq!(admin.actor, Actor::Admin);
        let auditor = OLD_STOP_BY_ADMIN.replace(r#"{"kind":"admin"}"#, r#"{"kind":"auditor"}"#);
        assert_eq!(
            Envelope::decode(auditor.as_bytes()).unwrap().actor,
            Actor::Auditor
        );
    }

    #[test]
    fn a_named_operator_round_trips_with_its_role() {
        let actor = Actor::Operator(Operator {
            name: "alice".into(),
            role: OperatorRole::Auditor,
        });
        let json = serde_json::to_value(&actor).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "operator", "id": {"name": "alice", "role": "auditor"}})
        );
        assert_eq!(serde_json::from_value::<Actor>(json).unwrap(), actor);
    }
}
