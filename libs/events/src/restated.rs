//! Restatements: a long-lived aggregate's history carried forward on its own
//! subject before the log's age limit takes its first events
//! (docs/adr/011-a-year-of-history.md).
//!
//! A restatement holds the events of its aggregate's subject that a reader
//! needs to know the aggregate as it stands (for a node, compacted to the
//! latest of each kind), each with the sequence and time it was stored at.
//! Its owner appends it guarded by the subject's last sequence, so nothing
//! raced it. The rule for every reader:
//! - one that knows the aggregate already (it folded its first statement)
//!   takes only the restatement's sequence as the subject's newest;
//! - one that does not (its history expired before the reader started)
//!   folds the events carried, each at its own sequence, then the same.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{Envelope, EventData};

/// Most events one restatement carries: a stored message stays well under
/// NATS's 1 MiB payload limit (a lease's workload is at most 16 KiB).
pub const MAX_RESTATED_EVENTS: usize = 1_000;

/// One event of an aggregate's history as the log stored it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StatedEvent {
    /// Its stream sequence: the order readers keep (a lease's queue place is
    /// the sequence of its request).
    pub sequence: u64,
    /// When the server stored it.
    pub stored_at: DateTime<Utc>,
    /// The event as stored: an envelope (`envelope.v1.json`).
    #[schemars(with = "serde_json::Value")]
    pub envelope: Box<Envelope>,
}

/// A lease that has not ended, from its request on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseRestated {
    pub lease_id: Uuid,
    pub tenant_id: Uuid,
    pub history: Vec<StatedEvent>,
}

/// A tenant, from its creation on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TenantRestated {
    pub tenant_id: Uuid,
    pub history: Vec<StatedEvent>,
}

/// A node: its newest registration first, then the newest of each fact
/// that still holds (a cordon, a loss, each GPU's health and self-test).
/// What its GPUs hold is carried by the restatements of the leases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeRestated {
    pub node_id: String,
    pub history: Vec<StatedEvent>,
}

/// Every price book version published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PriceBookRestated {
    pub history: Vec<StatedEvent>,
}

impl EventData {
    /// The events a restatement carries; `None` for any other event.
    pub fn restated_history(&self) -> Option<&[StatedEvent]> {
        match self {
            EventData::LeaseRestated(r) => Some(&r.history),
            EventData::TenantRestated(r) => Some(&r.history),
            EventData::NodeRestated(r) => Some(&r.history),
            EventData::PriceBookRestated(r) => Some(&r.history),
            _ => None,
        }
    }

    /// [`EventData::restated_history`], to change.
    pub(crate) fn restated_history_mut(&mut self) -> Option<&mut Vec<StatedEvent>> {
        match self {
            EventData::LeaseRestated(r) => Some(&mut r.history),
            EventData::TenantRestated(r) => Some(&mut r.history),
            EventData::NodeRestated(r) => Some(&mut r.history),
            EventData::PriceBookRestated(r) => Some(&mut r.history),
            _ => None,
        }
    }

    /// Whether this event states its aggregate from the start: the event
    /// that creates it, or a restatement.
    pub fn is_full_statement(&self) -> bool {
        matches!(
            self,
            EventData::LeaseRequested(_)
                | EventData::TenantCreated(_)
                | EventData::NodeRegistered(_)
                | EventData::NodeEnrolled(_)
                | EventData::PriceBookPublished(_)
        ) || self.restated_history().is_some()
    }
}
