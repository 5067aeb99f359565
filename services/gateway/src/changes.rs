//! Lease and node changes as they reach the log, for the callers of
//! `GET /v1/events/stream` (server-sent events): one feed per gateway
//! replica, from the log's head when it starts, each change told once to
//! every stream open on the replica, which passes on what its caller may
//! read ([`Change::visible_to`]).
//!
//! A change names its event's type, sequence and time and the lease or
//! node it is about, nothing of the payload: a client reads the lease or
//! the node again, through the routes that say what it may see. Whose lease
//! a change is about comes from the lease's request (the tenant that asked
//! for it), never from the envelope a node wrote.

use std::collections::HashMap;

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

/// What streams subscribe to.
pub type Changes = broadcast::Sender<Change>;

/// A sender no change comes through until [`follow`] runs with it.
pub fn channel() -> Changes {
    broadcast::channel(CHANGES_BUFFERED).0
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
                Ok(head) => head + 1,
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
            // Nobody listening is no error.
            let _ = changes.send(Change {
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
