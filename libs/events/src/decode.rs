//! Forward-compatible decoding of a stored message.
//!
//! The log outlives every binary that reads it: a newer writer may add an
//! optional field, a new event type or a new version of a type during a
//! rolling upgrade, and anyone who can publish on `lh.evt.>` can store junk.
//! None of that may stop a reader, because a stored message cannot be
//! removed (the stream denies deletes) and would stop it again on every
//! restart. So decoding never fails hard: it either yields an [`Envelope`]
//! the reader fully understands, or an [`Undecodable`] saying why not, which
//! the reader counts, records and steps over.
//!
//! Unknown fields are ignored everywhere (no `deny_unknown_fields` on the
//! envelope or on any payload). The envelope's `type` and `version` decide
//! whether the payload is one this code knows: a type missing from the
//! event table, or a version above the table's, is never decoded into the
//! current struct, even where its fields would happen to fit.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{Envelope, EVENT_TYPES};

/// Why a stored message was stepped over; the `reason` label of
/// `lh_events_skipped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// Not a JSON envelope at all: no `type` string and `version` number.
    Junk,
    /// An envelope of a type this code does not know.
    UnknownType,
    /// A known type at a version above the one this code knows.
    FutureVersion,
    /// A known type and version whose envelope or payload does not decode.
    BadPayload,
    /// An event stored on a subject other than the one its envelope
    /// computes: someone published it where its type or actor say it does
    /// not belong.
    WrongSubject,
    /// An event whose actor is not among the publishers the owner table
    /// allows for its type (`subject::OWNERS`).
    NotOwner,
    /// An event its publisher may write in general but not here and now:
    /// a node's report on a lease not placed on it, a tenant's request on
    /// another's lease (`lh_domain::authority`).
    NotAuthorized,
    /// The registration of a node no operator enrolled: refused like one
    /// beyond its enrollment, counted apart (a new node may start before
    /// its enrollment).
    NotEnrolled,
    /// A node's late report on a lease it held until it was moved or
    /// suspended: refused like any report on a lease not placed on it,
    /// counted apart (a node back from a failover sends them).
    StaleReport,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Junk => "junk",
            SkipReason::UnknownType => "unknown_type",
            SkipReason::FutureVersion => "future_version",
            SkipReason::BadPayload => "bad_payload",
            SkipReason::WrongSubject => "wrong_subject",
            SkipReason::NotOwner => "not_owner",
            SkipReason::NotAuthorized => "not_authorized",
            SkipReason::NotEnrolled => "not_enrolled",
            SkipReason::StaleReport => "stale_report",
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whatever could be read of an envelope that did not decode, each field
/// only where it had the right shape (the audit copy keeps them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvelopeHead {
    pub id: Option<Uuid>,
    pub event_type: Option<String>,
    pub version: Option<u64>,
    pub occurred_at: Option<DateTime<Utc>>,
}

/// A stored message this code cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {detail}")]
pub struct Undecodable {
    pub reason: SkipReason,
    /// What exactly was wrong, for the log.
    pub detail: String,
    pub head: EnvelopeHead,
}

/// The version of `event_type` this code reads and writes, if it knows the type.
pub fn known_version(event_type: &str) -> Option<u16> {
    EVENT_TYPES
        .iter()
        .find(|(known, _, _)| *known == event_type)
        .map(|(_, version, _)| *version)
}

impl Envelope {
    /// Decodes a stored message forward-compatibly (see the module
    /// documentation of `decode.rs`).
    pub fn decode(bytes: &[u8]) -> Result<Envelope, Undecodable> {
        match serde_json::from_slice::<Envelope>(bytes) {
            // The common case pays for one parse; the checks below only
            // compare the envelope's type and version with the table.
            Ok(envelope) => check_known(envelope, bytes),
            Err(error) => Err(classify(bytes, error.to_string())),
        }
    }
}

impl Envelope {
    /// Decodes a message stored on `subject` (see [`Envelope::decode`]) and
    /// checks that it is where its envelope says it belongs: on the
    /// subject the envelope computes, published by one of its type's
    /// owners.
    pub fn decode_stored(subject: &str, bytes: &[u8]) -> Result<Envelope, Undecodable> {
        let envelope = Envelope::decode(bytes)?;
        let refuse = |reason, detail: String| Undecodable {
            reason,
            detail,
            head: head_of(bytes),
        };
        let expected = envelope.subject();
        if subject != expected {
            return Err(refuse(
                SkipReason::WrongSubject,
                format!(
                    "{} by {:?} belongs on {expected}, not {subject}",
                    envelope.event_type, envelope.actor
                ),
            ));
        }
        if !crate::subject::may_publish(&envelope.actor, &envelope.event_type) {
            return Err(refuse(
                SkipReason::NotOwner,
                format!(
                    "{:?} may not publish {}",
                    envelope.actor, envelope.event_type
                ),
            ));
        }
        Ok(envelope)
    }
}

fn check_known(envelope: Envelope, bytes: &[u8]) -> Result<Envelope, Undecodable> {
    let refuse = |reason, detail: String| Undecodable {
        reason,
        detail,
        head: head_of(bytes),
    };
    let Some(known) = known_version(&envelope.event_type) else {
        return Err(refuse(
            SkipReason::UnknownType,
            format!("unknown event type {:?}", envelope.event_type),
        ));
    };
    if envelope.version > known {
        return Err(refuse(
            SkipReason::FutureVersion,
            format!(
                "{} version {} is newer than the known {known}",
                envelope.event_type, envelope.version
            ),
        ));
    }
    if envelope.version != known || envelope.data.event_type() != envelope.event_type {
        return Err(refuse(
            SkipReason::BadPayload,
            format!(
                "envelope says {} version {}, payload is {} version {known}",
                envelope.event_type,
                envelope.version,
                envelope.data.event_type()
            ),
        ));
    }
    Ok(envelope)
}

/// Says why `bytes` did not decode, dispatching on the envelope's type and
/// version before blaming the payload.
fn classify(bytes: &[u8], error: String) -> Undecodable {
    let head = head_of(bytes);
    let (reason, detail) = match (&head.event_type, head.version) {
        (Some(event_type), Some(version)) => match known_version(event_type) {
            None => (
                SkipReason::UnknownType,
                format!("unknown event type {event_type:?}"),
            ),
            Some(known) if version > u64::from(known) => (
                SkipReason::FutureVersion,
                format!("{event_type} version {version} is newer than the known {known}"),
            ),
            Some(_) => (SkipReason::BadPayload, error),
        },
        _ => (SkipReason::Junk, format!("not an event envelope: {error}")),
    };
    Undecodable {
        reason,
        detail,
        head,
    }
}

fn head_of(bytes: &[u8]) -> EnvelopeHead {
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(bytes) else {
        return EnvelopeHead::default();
    };
    let text = |name: &str| fields.get(name).and_then(|v| v.as_str());
    EnvelopeHead {
        id: text("id").and_then(|s| s.parse().ok()),
        event_type: text("type").map(str::to_string),
        version: fields.get("version").and_then(|v| v.as_u64()),
        occurred_at: text("occurred_at").and_then(|s| s.parse().ok()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Actor, EventData, LeaseStopRequested};

    fn stop_request() -> serde_json::Value {
        let envelope = Envelope::new(
            Actor::Admin,
            Utc::now(),
            EventData::LeaseStopRequested(LeaseStopRequested {
                lease_id: Uuid::from_u128(5),
            }),
        );
        serde_json::to_value(&envelope).unwrap()
    }

    fn reason_of(json: &serde_json::Value) -> SkipReason {
        Envelope::decode(json.to_string().as_bytes())
            .expect_err("refused")
            .reason
    }

    #[test]
    fn a_known_event_decodes() {
        let json = stop_request();
        let envelope = Envelope::decode(json.to_string().as_bytes()).unwrap();
        assert_eq!(envelope.event_type, "lease.stop_requested");
    }

    #[test]
    fn unknown_fields_in_the_payload_and_the_envelope_are_ignored() {
        let mut json = stop_request();
        json["data"]["added_later"] = serde_json::json!({"any": [1, 2]});
        json["added_later_too"] = serde_json::json!("x");
        let envelope = Envelope::decode(json.to_string().as_bytes()).unwrap();
        assert_eq!(
            envelope.data,
            EventData::LeaseStopRequested(LeaseStopRequested {
                lease_id: Uuid::from_u128(5)
            })
        );
    }

    #[test]
    fn an_unknown_type_is_unknown_type() {
        let mut json = stop_request();
        json["type"] = "lease.teleported".into();
        json["data"]["type"] = "lease.teleported".into();
        assert_eq!(reason_of(&json), SkipReason::UnknownType);
        // Even when the payload itself would decode as a known type.
        json["data"]["type"] = "lease.stop_requested".into();
        assert_eq!(reason_of(&json), SkipReason::UnknownType);
    }

    #[test]
    fn a_version_above_the_known_one_is_future_version() {
        let mut json = stop_request();
        json["version"] = 2.into();
        // Its fields would fit the version 1 struct; it is still not read.
        assert_eq!(reason_of(&json), SkipReason::FutureVersion);
        json["data"] = serde_json::json!({"type": "lease.stop_requested", "renamed": 1});
        let refused = Envelope::decode(json.to_string().as_bytes()).unwrap_err();
        assert_eq!(refused.reason, SkipReason::FutureVersion);
        assert_eq!(
            refused.head.event_type.as_deref(),
            Some("lease.stop_requested")
        );
        assert_eq!(refused.head.version, Some(2));
        assert!(refused.head.id.is_some() && refused.head.occurred_at.is_some());
    }

    #[test]
    fn a_stored_event_must_be_on_its_subject_and_by_an_owner() {
        let stop = |actor| {
            Envelope::new(
                actor,
                Utc::now(),
                EventData::LeaseStopRequested(LeaseStopRequested {
                    lease_id: Uuid::from_u128(5),
                }),
            )
        };
        let by_admin = stop(Actor::Admin);
        let subject = by_admin.subject();
        assert_eq!(
            subject,
            format!("lh.evt.lease.{}.stop_requested.gateway", Uuid::from_u128(5))
        );
        assert!(Envelope::decode_stored(&subject, &by_admin.to_json()).is_ok());
        // Nothing belongs on the bare aggregate subject.
        let aggregate = by_admin.data.aggregate_subject();
        let bare = Envelope::decode_stored(&aggregate, &by_admin.to_json()).unwrap_err();
        assert_eq!(bare.reason, SkipReason::WrongSubject);

        let by_node = stop(Actor::Node("n1".into()));
        let on_gateways = Envelope::decode_stored(&subject, &by_node.to_json()).unwrap_err();
        assert_eq!(on_gateways.reason, SkipReason::WrongSubject);
        let elsewhere = format!("{aggregate}.started.node-n1");
        let refused = Envelope::decode_stored(&elsewhere, &by_node.to_json()).unwrap_err();
        assert_eq!(refused.reason, SkipReason::WrongSubject);

        // On its own subject, but of a service that owns nothing.
        let stranger = stop(Actor::Service("lh-stranger".into()));
        let refused =
            Envelope::decode_stored(&stranger.subject(), &stranger.to_json()).unwrap_err();
        assert_eq!(refused.reason, SkipReason::NotOwner);
        // And junk is still junk, wherever it is.
        let refused = Envelope::decode_stored(&subject, b"junk").unwrap_err();
        assert_eq!(refused.reason, SkipReason::Junk);
    }

    #[test]
    fn junk_is_junk() {
        for junk in [
            &b"junk"[..],
            b"",
            b"\xff\xfe",
            b"[1,2]",
            b"{\"type\":7}",
            b"{}",
        ] {
            let refused = Envelope::decode(junk).unwrap_err();
            assert_eq!(refused.reason, SkipReason::Junk, "{junk:?}");
            assert_eq!(refused.head.id, None);
        }
    }

    #[test]
    fn a_known_type_that_does_not_decode_is_bad_payload() {
        let mut json = stop_request();
        json["data"]["lease_id"] = "not a uuid".into();
        assert_eq!(reason_of(&json), SkipReason::BadPayload);
        let mut json = stop_request();
        json["version"] = 0.into();
        assert_eq!(reason_of(&json), SkipReason::BadPayload);
        let mut json = stop_request();
        json["type"] = "lease.started".into();
        assert_eq!(reason_of(&json), SkipReason::BadPayload);
    }
}
