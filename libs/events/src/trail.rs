//! What the audit trail says of each stored event, beyond its payload: who
//! did it (the principal), to what (the object) and whether it succeeded
//! (the outcome). The audit service records these next to its copy of each
//! event so that auditors can filter on them; they are derived from the
//! envelope and its subject alone, so a copy can always be filled again.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{subject, Actor};

/// Whether what an event records succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Success,
    Failure,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failure => "failure",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "success" => Some(Outcome::Success),
            "failure" => Some(Outcome::Failure),
            _ => None,
        }
    }
}

/// Event types that record a refusal (a request the platform turned down)
/// or a failed integrity check of the trail itself. Every other event
/// records something that was done.
pub const FAILURE_EVENT_TYPES: &[&str] = &[
    "access.refused",
    "security.events_refused",
    "lease.rejected",
    "audit.divergence_detected",
];

/// The outcome an event of `event_type` records.
pub fn outcome(event_type: &str) -> Outcome {
    if FAILURE_EVENT_TYPES.contains(&event_type) {
        Outcome::Failure
    } else {
        Outcome::Success
    }
}

impl Actor {
    /// The principal as the audit trail names it: `tenant:<id>`,
    /// `admin:<name>` or `auditor:<name>` for a named operator, `admin` or
    /// `auditor` for the shared tokens of older logs, `service:<name>`,
    /// `node:<id>`.
    pub fn principal(&self) -> String {
        match self {
            Actor::Tenant(id) => format!("tenant:{id}"),
            Actor::Admin => "admin".to_string(),
            Actor::Auditor => "auditor".to_string(),
            Actor::Service(name) => format!("service:{name}"),
            Actor::Node(id) => format!("node:{id}"),
            Actor::Operator(o) => format!("{}:{}", o.role.as_str(), o.name),
        }
    }
}

/// The object an event stored on `stored_subject` is about: its aggregate
/// subject without the `lh.evt.` prefix (`lease.<id>`, `tenant.<id>`,
/// `node.<id>`, ...); `None` outside the business log.
pub fn object(stored_subject: &str) -> Option<&str> {
    subject::aggregate_of(stored_subject).and_then(|a| a.strip_prefix("lh.evt."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Operator, OperatorRole};
    use uuid::Uuid;

    #[test]
    fn principals_objects_and_outcomes_are_named_as_documented() {
        let id = Uuid::from_u128(7);
        assert_eq!(Actor::Tenant(id).principal(), format!("tenant:{id}"));
        let alice = Actor::Operator(Operator {
            name: "alice".into(),
            role: OperatorRole::Auditor,
        });
        assert_eq!(alice.principal(), "auditor:alice");
        assert_eq!(Actor::Admin.principal(), "admin");
        assert_eq!(
            Actor::Service("lh-scheduler".into()).principal(),
            "service:lh-scheduler"
        );
        assert_eq!(Actor::Node("n1".into()).principal(), "node:n1");
        let placed = format!("{}.placed.scheduler", subject::lease(id));
        assert_eq!(object(&placed), Some(format!("lease.{id}").as_str()));
        assert_eq!(
            object("lh.evt.spot.z.m.price_set.spot-broker"),
            Some("spot.z.m")
        );
        assert_eq!(object("lh.tel.heartbeat.n1"), None);
        assert_eq!(outcome("lease.rejected"), Outcome::Failure);
        assert_eq!(outcome("audit.divergence_detected"), Outcome::Failure);
        assert_eq!(outcome("lease.placed"), Outcome::Success);
        for o in [Outcome::Success, Outcome::Failure] {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
        }
    }
}
