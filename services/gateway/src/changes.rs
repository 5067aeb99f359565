//! Lease and node changes as they reach the log, for the callers of
//! `GET /v1/events/stream` (server-sent events): one feed per gateway
//! replica, from the log's head when it starts, each change told once to
//! every stream open on the replica, which passes on what its caller may
//! read ([`Change::visible_to`]).
//!
//! The last changes are kept too, so that a stream opened again with the
//! last sequence it heard (`Last-Event-ID`) is told what it missed between,
//! or, where that reaches past what is kept, that it missed some.
//!
//! A change names its event's type, sequence and time and the lease or
//! node it is about, nothing of the payload: a client reads the lease or
//! the node again, through the routes that say what it may see. Whose lease
//! a change is about comes from the lease's request (the tenant that asked
//! for it), never from the envelope a node wrote.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use lh_bus::{Bus, FeedItem};
use lh_events::{subject, EventData};
use serde::Serialize;
use sqlx::PgPool;
use tokio::sync::broadcast;
use uuid::Uuid;

/// Changes a stream may fall behind by before it is told it missed some.
pub const CHANGES_BUFFERED: usize = 4096;
/// Leases whose tenant is remembered; past this the memory starts afresh
/// (a lease forgotten is looked up in the read model once more).
const MOST_LEASES_REMEMBERED: usize = 100_000;
/// Longest a lease's change waits for the read model to show it.
const READ_MODEL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long the feed waits before it opens again after it failed.
const REOPEN_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// One change, as a stream sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// The event's type: `lease.started`, `node.cordoned`, ...
    #[serde(rename = "type")]
    pub event_type: String,
    /// Its sequence on the log.
    pub sequence: u64,
    pub occurred_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// Whose lease it is about, where it is about a lease.
    #[serde(skip)]
    pub tenant_id: Option<Uuid>,
}

/// Who reads a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// Every lease's changes and every node's.
    Operator,
    /// Its own leases' changes, nothing of nodes.
    Tenant(Uuid),
}

impl Change {
    /// Whether `reader` may be told of it.
    pub fn visible_to(&self, reader: Reader) -> bool {
        match reader {
            Reader::Operator => true,
            Reader::Tenant(tenant) => self.lease_id.is_some() && self.tenant_id == Some(tenant),
        }
    }
}

/// Changes kept for streams that open again after a break.
pub const CHANGES_KEPT: usize = 4096;

/// What streams subscribe to: the changes as they come, and the last
/// [`CHANGES_KEPT`] of them.
#[derive(Clone)]
pub struct Changes(Arc<Shared>);

struct Shared {
    sender: broadcast::Sender<Change>,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    changes: VecDeque<Change>,
    /// Every change from this sequence on is in `changes`; none before the
    /// feed's first is known at all.
    whole_from: Option<u64>,
}

/// What a stream opened again missed, as far as this replica can tell.
#[derive(Debug, PartialEq, Eq)]
pub enum Missed {
    /// The changes after the last one it heard, oldest first.
    These(Vec<Change>),
    /// More than is kept: it reads again what it shows.
    Unknown,
}

impl Default for Changes {
    fn default() -> Self {
        Self::new()
    }
}

impl Changes {
    /// No change comes through until [`follow`] runs with it.
    pub fn new() -> Self {
        Changes(Arc::new(Shared {
            sender: broadcast::channel(CHANGES_BUFFERED).0,
            kept: Mutex::new(Kept::default()),
        }))
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.0.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The feed starts at `sequence`: changes from there on are whole.
    fn starts_at(&self, sequence: u64) {
        let mut kept = self.kept();
        if kept.whole_from.is_none() {
            kept.whole_from = Some(sequence);
        }
    }

    /// Tells every stream of `change`, and keeps it.
    pub fn tell(&self, change: Change) {
        let mut kept = self.kept();
        if kept.changes.len() >= CHANGES_KEPT {
            if let Some(dropped) = kept.changes.pop_front() {
                kept.whole_from = Some(dropped.sequence + 1);
            }
        }
        kept.changes.push_back(change.clone());
        // Nobody listening is no error; sent under the lock, so that a
        // stream opening meanwhile hears it once, here or in what it missed.
        let _ = self.0.sender.send(change);
    }

    /// A stream's changes from now on, and, for one that heard up to
    /// `after` before, what it missed since.
    pub fn subscribe(&self, after: Option<u64>) -> (broadcast::Receiver<Change>, Missed) {
        let kept = self.kept();
        let receiver = self.0.sender.subscribe();
        let Some(after) = after else {
            return (receiver, Missed::These(Vec::new()));
        };
        let whole = kept
            .whole_from
            .is_some_and(|from| after.saturating_add(1) >= from);
        let missed = if whole {
            Missed::These(
                kept.changes
                    .iter()
                    .filter(|c| c.sequence > after)
                    .cloned()
                    .collect(),
            )
        } else {
            Missed::Unknown
        };
        (receiver, missed)
    }
}

/// Tells `changes` of every lease and node event from the log's head on,
/// for as long as the gateway runs; a lost feed is opened again after the
/// last change told. A lease's change is told once this replica's read
/// model shows it (`progress`), or after [`READ_MODEL_WAIT`]: a client that
/// reads the lease again on hearing of it finds what changed.
pub async fn follow(
    bus: Bus,
    pool: PgPool,
    progress: lh_projection::Progress,
    changes: Changes,
) -> std::convert::Infallible {
    let mut owners = Owners::default();
    let mut next = None;
    loop {
        let from = match next {
            Some(from) => from,
            None => match bus.last_sequence().await {
                Ok(head) => {
                    changes.starts_at(head + 1);
                    head + 1
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the change stream cannot find the log's head");
                    tokio::time::sleep(REOPEN_AFTER).await;
                    continue;
                }
            },
        };
        let mut feed = match bus
            .feed(&[subject::LEASES_ALL, subject::NODES_ALL], from)
            .await
        {
            Ok(feed) => feed,
            Err(e) => {
                tracing::warn!(error = %e, "the change stream cannot read the log");
                tokio::time::sleep(REOPEN_AFTER).await;
                continue;
            }
        };
        next = Some(from);
        while let Some(item) = feed.next_item().await {
            let stored = match item {
                Ok(FeedItem::Event(stored)) => stored,
                Ok(FeedItem::Skipped(skipped)) => {
                    next = Some(skipped.sequence + 1);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the change stream lost the log; opening it again");
                    break;
                }
            };
            next = Some(stored.sequence + 1);
            let data = &stored.envelope.data;
            let lease_id = data.lease_id();
            let node_id = match lease_id {
                Some(_) => None,
                None => data
                    .aggregate_subject()
                    .strip_prefix("lh.evt.node.")
                    .map(str::to_string),
            };
            if lease_id.is_none() && node_id.is_none() {
                continue;
            }
            let tenant_id = match (lease_id, data) {
                (Some(lease), EventData::LeaseRequested(r)) => {
                    Some(owners.remember(lease, r.tenant_id))
                }
                (Some(lease), _) => owners.of(&pool, lease).await,
                (None, _) => None,
            };
            if lease_id.is_some() {
                progress.wait_for(stored.sequence, READ_MODEL_WAIT).await;
            }
            changes.tell(Change {
                event_type: stored.envelope.event_type.clone(),
                sequence: stored.sequence,
                occurred_at: stored.envelope.occurred_at,
                lease_id,
                node_id,
                tenant_id,
            });
        }
        tokio::time::sleep(REOPEN_AFTER).await;
    }
}

/// Whose each lease is, as its request says.
#[derive(Default)]
struct Owners(HashMap<Uuid, Uuid>);

impl Owners {
    fn remember(&mut self, lease: Uuid, tenant: Uuid) -> Uuid {
        if self.0.len() >= MOST_LEASES_REMEMBERED {
            self.0.clear();
        }
        self.0.insert(lease, tenant);
        tenant
    }

    /// The tenant of `lease`, from memory or the read model; `None` for a
    /// lease neither knows (its change then reaches operators only).
    async fn of(&mut self, pool: &PgPool, lease: Uuid) -> Option<Uuid> {
        if let Some(tenant) = self.0.get(&lease) {
            return Some(*tenant);
        }
        let found: Option<Uuid> = sqlx::query_scalar("SELECT tenant_id FROM leases WHERE id = $1")
            .bind(lease)
            .fetch_optional(pool)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(lease = %lease, error = %e, "cannot tell whose lease a change is about");
                None
            });
        found.map(|tenant| self.remember(lease, tenant))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(sequence: u64) -> Change {
        Change {
            event_type: "lease.started".into(),
            sequence,
            occurred_at: Utc::now(),
            lease_id: Some(Uuid::from_u128(9)),
            node_id: None,
            tenant_id: Some(Uuid::from_u128(1)),
        }
    }

    #[test]
    fn a_stream_opened_again_hears_what_it_missed_or_that_it_missed_too_much() {
        let changes = Changes::new();
        changes.starts_at(10);
        for sequence in [10, 12, 15] {
            changes.tell(at(sequence));
        }
        let sequences = |missed: Missed| match missed {
            Missed::These(c) => Some(c.iter().map(|c| c.sequence).collect::<Vec<_>>()),
            Missed::Unknown => None,
        };
        assert_eq!(sequences(changes.subscribe(None).1), Some(vec![]));
        assert_eq!(sequences(changes.subscribe(Some(11)).1), Some(vec![12, 15]));
        assert_eq!(
            sequences(changes.subscribe(Some(9)).1),
            Some(vec![10, 12, 15])
        );
        assert_eq!(sequences(changes.subscribe(Some(15)).1), Some(vec![]));
        // Before this replica's feed began: it cannot tell.
        assert_eq!(sequences(changes.subscribe(Some(3)).1), None);
        // Past what is kept: the oldest are gone, and it says so.
        for sequence in 16..16 + CHANGES_KEPT as u64 {
            changes.tell(at(sequence));
        }
        assert_eq!(sequences(changes.subscribe(Some(11)).1), None);
        let recent = sequences(changes.subscribe(Some(4100)).1).unwrap();
        assert_eq!(recent.first(), Some(&4101));
        // What is told after a subscription comes through it, once.
        let (mut receiver, missed) = changes.subscribe(Some(20_000));
        assert_eq!(missed, Missed::These(vec![]));
        changes.tell(at(20_001));
        assert_eq!(receiver.try_recv().unwrap().sequence, 20_001);
    }

    #[test]
    fn a_tenant_is_told_of_its_own_leases_only_and_of_no_node() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let lease = |tenant: Option<Uuid>| Change {
            event_type: "lease.started".into(),
            sequence: 1,
            occurred_at: Utc::now(),
            lease_id: Some(Uuid::from_u128(9)),
            node_id: None,
            tenant_id: tenant,
        };
        let node = Change {
            event_type: "node.cordoned".into(),
            sequence: 2,
            occurred_at: Utc::now(),
            lease_id: None,
            node_id: Some("node-a".into()),
            tenant_id: None,
        };
        assert!(lease(Some(a)).visible_to(Reader::Tenant(a)));
        assert!(!lease(Some(a)).visible_to(Reader::Tenant(b)));
        assert!(!lease(None).visible_to(Reader::Tenant(a)));
        assert!(!node.visible_to(Reader::Tenant(a)));
        assert!(node.visible_to(Reader::Operator));
        assert!(lease(Some(b)).visible_to(Reader::Operator));
        // What a stream sends names no tenant.
        let sent = serde_json::to_value(lease(Some(a))).unwrap();
        assert!(sent.get("tenant_id").is_none(), "{sent}");
        assert_eq!(sent["type"], "lease.started");
    }
}
