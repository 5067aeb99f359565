//! Each node's own view of the log (docs/adr/027): a node reads only what
//! this writer relays to `lh.evt.node_view.<node>`, so that one
//! compromised node learns nothing of other nodes' leases, of tenants, or
//! of money. Lease subjects do not name the node a lease is placed on, so
//! no subject filter or permission can select a node's leases; the
//! scheduler, which places them, can.
//!
//! What is relayed to node N, each event at the sequence the log stored it
//! at, in log order:
//! - N's own enrollment, registrations, GPU health and restatements;
//! - for a lease placed on N (or moved to it): its request, then every
//!   event on its subject until it leaves N (moved away, suspended,
//!   ended), the node's own reports included. The node guards its start
//!   and suspension by the lease subject's last sequence as before: it
//!   knows every event stored there while the lease is its own.
//!
//! A pure fold and decision, like the scheduler's own: relays waiting to be
//! written are part of the state (and of its snapshot), and the fold reads
//! its own relays back from the log, so a crash between the two never
//! loses one, and a restart never writes one twice. A lease that leaves a
//! node before its placement there was relayed is never relayed there: the
//! node never knew of it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use lh_events::{
    derived_id, subject, Actor, Envelope, EventData, Expect, IdlePolicy, NodeViewRelayed,
    StatedEvent, TenantIdlePolicy,
};
use lh_service::decider::{Batch, Decider};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::state::SERVICE;

/// Most bytes of events one relay carries (a single event larger than this
/// goes alone: a stored event, a restatement included, is well under the
/// log's 1 MiB message cap).
pub const MAX_RELAY_BYTES: usize = 256 * 1024;
/// Most events one relay carries.
pub const MAX_RELAY_EVENTS: usize = 256;
/// Most relays one decision pass writes; the rest wait for the next pass.
pub const MAX_RELAYS_PER_PASS: usize = 256;

/// A lease that has not ended, as far as the views go.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ViewedLease {
    tenant_id: Uuid,
    /// Its request (or the restatement that carries it): what a node it is
    /// placed on needs to run it.
    request: Option<StatedEvent>,
    /// The node it holds GPUs on now (a gang's first member).
    node: Option<String>,
    /// A gang's other members: each reads the lease as `node` does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    members: Vec<String>,
}

/// One event waiting to be relayed to a node.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Waiting {
    lease: Option<Uuid>,
    /// This event places the lease on the node: until it is relayed, the
    /// node knows nothing of the lease.
    places: bool,
    event: StatedEvent,
}

/// The writer of the nodes' views.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct NodeViews {
    leases: HashMap<Uuid, ViewedLease>,
    idle_policies: HashMap<Uuid, IdlePolicy>,
    /// Per node, oldest first.
    waiting: BTreeMap<String, Vec<Waiting>>,
    #[serde(skip)]
    node_clock_skew: Option<chrono::Duration>,
}

impl NodeViews {
    pub fn new(node_clock_skew: chrono::Duration) -> Self {
        Self {
            node_clock_skew: Some(node_clock_skew),
            ..Self::default()
        }
    }

    /// Events waiting to be relayed, over all nodes.
    pub fn waiting_events(&self) -> usize {
        self.waiting.values().map(Vec::len).sum()
    }

    fn relay(&mut self, node: &str, lease: Option<Uuid>, places: bool, event: StatedEvent) {
        self.waiting
            .entry(node.to_string())
            .or_default()
            .push(Waiting {
                lease,
                places,
                event,
            });
    }

    /// `event` takes `lease` away from `node`: relayed, unless the node
    /// never learnt of the lease (its placement there still waits), when
    /// nothing of it is relayed there at all.
    fn leaves(&mut self, node: &str, lease: Uuid, event: StatedEvent) {
        let waiting = self.waiting.entry(node.to_string()).or_default();
        let unknown_there = waiting.iter().any(|w| w.lease == Some(lease) && w.places);
        if unknown_there {
            waiting.retain(|w| w.lease != Some(lease));
            if waiting.is_empty() {
                self.waiting.remove(node);
            }
        } else {
            waiting.push(Waiting {
                lease: Some(lease),
                places: false,
                event,
            });
        }
    }

    /// Relays `event`, which places `lease` on `node`, after its request.
    /// `new_there`: the node knew nothing of the lease before (not a move
    /// to other GPUs of the same node), so that until this is relayed an
    /// end need not be.
    fn placed(&mut self, node: &str, lease: Uuid, event: StatedEvent, new_there: bool) {
        let request = self.leases.get_mut(&lease).and_then(|l| {
            l.node = Some(node.to_string());
            l.request.clone()
        });
        if let Some(request) = request {
            self.relay(node, Some(lease), false, request);
        }
        self.relay(node, Some(lease), new_there, event);
    }

    /// Relays a gang's placement to one of its other members, after the
    /// lease's request.
    fn relay_placement(&mut self, node: &str, lease: Uuid, event: StatedEvent) {
        if let Some(request) = self.leases.get(&lease).and_then(|l| l.request.clone()) {
            self.relay(node, Some(lease), false, request);
        }
        self.relay(node, Some(lease), true, event);
    }

    fn fold(&mut self, sequence: u64, stored_at: DateTime<Utc>, envelope: &Envelope) {
        let stated = || StatedEvent {
            sequence,
            stored_at,
            envelope: Box::new(envelope.clone()),
        };
        match &envelope.data {
            EventData::NodeViewRelayed(r) => {
                let relayed: BTreeSet<u64> = r.events.iter().map(|e| e.sequence).collect();
                if let Some(waiting) = self.waiting.get_mut(&r.node_id) {
                    waiting.retain(|w| !relayed.contains(&w.event.sequence));
                    if waiting.is_empty() {
                        self.waiting.remove(&r.node_id);
                    }
                }
            }
            EventData::NodeEnrolled(e) => self.relay(&e.node_id, None, false, stated()),
            EventData::NodeRegistered(e) => self.relay(&e.node_id, None, false, stated()),
            EventData::NodeGpuHealthChanged(e) => self.relay(&e.node_id, None, false, stated()),
            EventData::NodeRestated(e) => self.relay(&e.node_id, None, false, stated()),
            EventData::TenantCreated(e) => {
                if let Some(policy) = e.idle_policy {
                    self.idle_policies.insert(e.tenant_id, policy);
                }
            }
            EventData::TenantRestated(r) => {
                for e in &r.history {
                    self.fold(e.sequence, e.stored_at, &e.envelope);
                }
            }
            EventData::LeaseRequested(e) => {
                self.leases.entry(e.lease_id).or_insert(ViewedLease {
                    tenant_id: e.tenant_id,
                    request: Some(stated()),
                    node: None,
                    members: Vec::new(),
                });
            }
            EventData::LeaseRestated(r) => {
                // Unknown here (its history expired before this fold
                // began): its history tells where it is. Either way, the
                // restatement is an event on its subject.
                if !self.leases.contains_key(&r.lease_id) {
                    for e in &r.history {
                        self.fold(e.sequence, e.stored_at, &e.envelope);
                    }
                }
                for node in self.nodes_of(r.lease_id) {
                    self.relay(&node, Some(r.lease_id), false, stated());
                }
            }
            EventData::LeasePlaced(e) => {
                self.placed(&e.node_id, e.lease_id, stated(), true);
                let members: Vec<String> = e.nodes().skip(1).map(str::to_string).collect();
                for member in &members {
                    self.relay_placement(member, e.lease_id, stated());
                }
                if let Some(l) = self.leases.get_mut(&e.lease_id) {
                    l.members = members;
                }
            }
            EventData::LeaseMigrated(e) => {
                // Moved to other GPUs of the same node, it does not leave:
                // the node gets the move once, as its new placement.
                let stays = e.to.as_ref().is_some_and(|to| to.node_id == e.from_node_id);
                if !stays {
                    self.leaves(&e.from_node_id, e.lease_id, stated());
                }
                // A gang leaves every member.
                let members = self
                    .leases
                    .get_mut(&e.lease_id)
                    .map(|l| std::mem::take(&mut l.members))
                    .unwrap_or_default();
                for member in members.iter().filter(|m| **m != e.from_node_id) {
                    self.leaves(member, e.lease_id, stated());
                }
                match &e.to {
                    Some(to) => self.placed(&to.node_id, e.lease_id, stated(), !stays),
                    None => {
                        if let Some(l) = self.leases.get_mut(&e.lease_id) {
                            l.node = None;
                        }
                    }
                }
            }
            EventData::LeaseSuspended(e) => {
                for node in self.nodes_of(e.lease_id) {
                    self.leaves(&node, e.lease_id, stated());
                }
                if let Some(l) = self.leases.get_mut(&e.lease_id) {
                    l.node = None;
                    l.members.clear();
                }
            }
            EventData::LeaseEnded(e) => {
                for node in self.nodes_of(e.lease_id) {
                    self.leaves(&node, e.lease_id, stated());
                }
                self.leases.remove(&e.lease_id);
            }
            EventData::LeaseRejected(e) => {
                self.leases.remove(&e.lease_id);
            }
            other => {
                // Every other event on the subject of a lease placed on a
                // node: the node counts them all for its guard.
                if let Some(lease) = other.lease_id() {
                    for node in self.nodes_of(lease) {
                        self.relay(&node, Some(lease), false, stated());
                    }
                }
            }
        }
    }

    /// Every node that reads `lease` now: the one it is placed on, and a
    /// gang's other members.
    fn nodes_of(&self, lease: Uuid) -> Vec<String> {
        match self.leases.get(&lease) {
            Some(l) => l.node.iter().chain(&l.members).cloned().collect(),
            None => Vec::new(),
        }
    }

    /// The relays due now, each node's events in log order, in as few
    /// relays as the limits allow; at most [`MAX_RELAYS_PER_PASS`].
    pub fn relays(&self, now: DateTime<Utc>) -> Vec<Envelope> {
        let mut relays = Vec::new();
        for (node, waiting) in &self.waiting {
            let mut rest = waiting.as_slice();
            while !rest.is_empty() {
                if relays.len() == MAX_RELAYS_PER_PASS {
                    return relays;
                }
                let mut bytes = 0;
                let mut take = 0;
                // One lease (or the node itself) a relay: it continues that
                // lease's trace and belongs to its tenant.
                let lease = rest[0].lease;
                for w in rest.iter().take(MAX_RELAY_EVENTS) {
                    let size = serde_json::to_vec(&w.event).map_or(0, |b| b.len());
                    if take > 0 && (bytes + size > MAX_RELAY_BYTES || w.lease != lease) {
                        break;
                    }
                    bytes += size;
                    take += 1;
                }
                let (chunk, after) = rest.split_at(take);
                relays.push(self.relay_event(node, chunk, now));
                rest = after;
            }
        }
        relays
    }

    fn relay_event(&self, node: &str, chunk: &[Waiting], now: DateTime<Utc>) -> Envelope {
        // A chunk is of one lease, or of the node itself.
        let tenant_id = chunk[0]
            .lease
            .and_then(|lease| Some(self.leases.get(&lease)?.tenant_id));
        let placing = chunk.iter().any(|w| w.places);
        let idle_policies = tenant_id
            .filter(|_| placing)
            .and_then(|tenant_id| {
                let policy = *self.idle_policies.get(&tenant_id)?;
                Some(TenantIdlePolicy { tenant_id, policy })
            })
            .into_iter()
            .collect();
        let sequences: Vec<String> = chunk.iter().map(|w| w.event.sequence.to_string()).collect();
        let id = derived_id(&["node_view.relayed", node, &sequences.join(",")]);
        let newest = &chunk[chunk.len() - 1].event.envelope;
        let mut relay = Envelope::new(
            Actor::Service(SERVICE.into()),
            now,
            EventData::NodeViewRelayed(NodeViewRelayed {
                node_id: node.to_string(),
                events: chunk.iter().map(|w| w.event.clone()).collect(),
                idle_policies,
            }),
        )
        .caused_by(newest)
        .with_id(id);
        relay.tenant_id = tenant_id.or(newest.tenant_id);
        relay
    }
}

impl Decider for NodeViews {
    type Signal = std::convert::Infallible;

    fn name(&self) -> &'static str {
        "lh-scheduler-node-views"
    }

    fn filters(&self) -> &[&'static str] {
        &[
            subject::LEASES_ALL,
            subject::NODES_ALL,
            subject::TENANTS_ALL,
            // Its own relays: what no longer waits.
            subject::NODE_VIEWS_ALL,
        ]
    }

    /// Its own relays, as soon as they are stored.
    fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        self.fold(sequence, envelope.occurred_at, envelope);
    }

    fn apply_stored(&mut self, sequence: u64, stored_at: DateTime<Utc>, envelope: &Envelope) {
        self.fold(sequence, stored_at, envelope);
    }

    /// Nodes get the times the scheduler folds: held to the log's clock.
    fn node_clock_skew(&self) -> Option<chrono::Duration> {
        self.node_clock_skew
    }

    fn decide(&mut self, now: DateTime<Utc>) -> Vec<Batch> {
        metrics::gauge!("lh_scheduler_node_view_waiting_events").set(self.waiting_events() as f64);
        self.relays(now)
            .into_iter()
            .map(|relay| vec![(relay, Expect::Any)])
            .collect()
    }

    fn snapshot(&self) -> Option<Box<serde_json::value::RawValue>> {
        lh_service::decider::snapshot_of(self)
    }

    fn restore(&mut self, state: &serde_json::value::RawValue) -> bool {
        let Some(restored) = lh_service::decider::restored::<NodeViews>(state) else {
            return false;
        };
        *self = NodeViews {
            node_clock_skew: self.node_clock_skew,
            ..restored
        };
        true
    }

    fn appended(&mut self, batch: &Batch) {
        metrics::counter!("lh_scheduler_node_view_relays_total").increment(batch.len() as u64);
    }
}

/// Writes the nodes' views until `shutdown`, starting over after a
/// failure (its own fold and snapshot, beside the scheduler's), and keeps
/// the mirror each node reads its view in.
pub async fn run(
    bus: lh_bus::Bus,
    node_clock_skew: chrono::Duration,
    shutdown: lh_service::CancellationToken,
) {
    tokio::join!(
        write(bus.clone(), node_clock_skew, shutdown.clone()),
        mirrors::keep(bus, shutdown),
    );
}

async fn write(
    bus: lh_bus::Bus,
    node_clock_skew: chrono::Duration,
    shutdown: lh_service::CancellationToken,
) {
    restarted("the nodes' views", &shutdown, || {
        let bus = bus.clone();
        let shutdown = shutdown.clone();
        async move {
            let mut views = NodeViews::new(node_clock_skew);
            lh_service::decider::run(
                &bus,
                &mut views,
                &lh_service::clock::SystemClock,
                shutdown,
                lh_service::Readiness::default(),
            )
            .await
        }
    })
    .await
}

/// First wait after a failure of one of the views' loops before it starts
/// over; it doubles up to the max.
const RESTART_MIN_WAIT: std::time::Duration = std::time::Duration::from_millis(200);
const RESTART_MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `term` until it returns Ok or `shutdown`, starting it over after
/// each failure (`what` names it in the log).
async fn restarted<F, E>(
    what: &str,
    shutdown: &lh_service::CancellationToken,
    mut term: impl FnMut() -> F,
) where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut wait = RESTART_MIN_WAIT;
    while !shutdown.is_cancelled() {
        match term().await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64,
                    "{what} stopped; starting again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(RESTART_MAX_WAIT);
            }
        }
    }
}

mod mirrors;
pub use mirrors::keep as keep_mirrors;
#[cfg(test)]
mod tests;
