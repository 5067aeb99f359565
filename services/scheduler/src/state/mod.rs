//! The scheduler's view of the world and its decisions, as pure functions:
//! [`State::apply`] folds one stored event in, [`State::decide`] says what
//! to append next. No I/O and no clock: `now` comes in as an argument.
//!
//! The queue, in order:
//! 1. on-demand (basic, performance, reserved) before spot;
//! 2. within a tier, weighted fair share across tenants: the next lease
//!    comes from the tenant whose held GPU milli divided by its weight is
//!    smallest (dominant resource fairness with one resource, recomputed
//!    after every planned placement);
//! 3. within a tenant, higher priority first, then first come, first served.
//!
//! A lease that does not fit now does not block the ones behind it
//! (backfill), unless it has waited longer than
//! [`Rules::backfill_starvation`]: then the free GPUs of its model are kept
//! for it. An on-demand lease that fits only by evicting spot leases notices
//! the cheapest set of victims (see [`plan_preemption`]).
//!
//! Where a lease goes is decided by the lh-placement engine with the
//! default policy (`leasehold`) and a fixed seed (see [`crate::planner`]),
//! for whole GPUs, fractions (a share of one GPU: milli-GPU and VRAM GB) and
//! MIG instances (a profile of the model's MIG geometry, on a GPU in MIG
//! mode). A fraction or MIG instance counts its milli toward the GPU quota
//! and its VRAM toward the VRAM quota (a MIG instance: its compute slices
//! over the GPU's, and its memory). Preemption and the starvation guard act
//! on whole GPUs only: a fractional or MIG lease never preempts, and a
//! starving one does not hold back others.

pub mod availability;
mod decide;
mod emit;
pub mod fleet_view;
mod fragmentation;
mod lease;
mod liveness;
mod migrate;
mod pending;
pub mod planned_fleet;
mod preempt;
mod queue;
mod rules;
mod spot;
#[cfg(test)]
mod tests;
mod watch;

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use lh_domain::fleet::Fleet;
use lh_events::{Envelope, EventData, Tier};
use rust_decimal::Decimal;
use uuid::Uuid;

use emit::{
    lease_event, migration_allocation, node_event, notice_event, placement_events, relocate,
};
use pending::why_pending;
use preempt::reserve_for;
use queue::quota_breach;

pub use decide::{PlacementEngineCache, SUSPENDED_TENANT};
pub use emit::Decisions;
pub use lease::{Lease, Status, Tenant};
pub use liveness::{Heard, MAX_UNREGISTERED_NODES_HEARD};
pub use planned_fleet::{FleetView, PlannedFleet};
pub use preempt::{plan_gang_preemption, plan_preemption, GangPreemptionPlan, PreemptionPlan};
pub use rules::{Rules, EXACT_POSITIONS, MAX_VICTIMS_PER_NODE, MILLI_PER_GPU};
pub use spot::{recovered_id, SpotStats, MAX_PENDING_RECOVERIES, MAX_SPOT_MARKETS};

pub const SERVICE: &str = "lh-scheduler";

#[derive(Debug, Clone, Default)]
pub struct State {
    pub fleet: Fleet,
    /// Live leases only: ended and rejected ones are dropped.
    pub leases: HashMap<Uuid, Lease>,
    pub tenants: HashMap<Uuid, Tenant>,
    /// Leases waiting for a decision, by request sequence.
    waiting: BTreeMap<u64, Uuid>,
    /// On-demand leases whose preemption notices are out.
    awaiting_preemption: HashSet<Uuid>,
    /// When each node was last heard from: `(our clock, the node's clock)`.
    heard: HashMap<String, Heard>,
    /// Node liveness is judged from this instant on (the scheduler's start);
    /// `None` turns it off.
    pub liveness_since: Option<DateTime<Utc>>,
    /// When any node was last heard from (our clock).
    last_heard_any: Option<DateTime<Utc>>,
    /// When heartbeats came again after the whole fleet had been silent
    /// longer than the loss window: silence is measured from then.
    hearing_resumed_at: Option<DateTime<Utc>>,
    /// Heartbeats again after a silence of the whole fleet, not yet from
    /// enough nodes.
    resuming: Option<liveness::Resuming>,
    /// The node that was last heard alone after a silence of the fleet.
    lone_voice: Option<String>,
    /// The newest spot price per (zone, GPU model), CNY per GB-hour.
    spot_prices: BTreeMap<(String, String), Decimal>,
    /// Preempted spot leases to request again, by the preempted lease.
    recoveries: BTreeMap<Uuid, lh_events::LeaseRequested>,
    /// What the spot market did, folded from the log.
    pub spot_stats: SpotStats,
    /// Lease time owed to and interrupted for each tenant, folded from the log.
    pub availability: availability::AvailabilityStats,
    /// Lost nodes, nodes by when they were heard, nodes whose leases may
    /// have to move: followed from the fleet as it is folded.
    watch: watch::NodeWatch,
}

impl State {
    /// Whether `lease` may only go to a node that isolates workloads: its
    /// tenant is not trusted (nor is a tenant the state does not know).
    pub(crate) fn needs_isolation(&self, lease: &Lease) -> bool {
        !self
            .tenants
            .get(&lease.tenant_id)
            .is_some_and(|t| t.trusted)
    }

    pub fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        self.fleet.apply(sequence, &envelope.data);
        self.watch.follow(&self.fleet, &self.heard);
        self.apply_to_leases(sequence, envelope);
    }

    /// Folds an event into the leases and tenants (the fleet folds its own).
    fn apply_to_leases(&mut self, sequence: u64, envelope: &Envelope) {
        let data = &envelope.data;
        match data {
            // Known already: nothing new but the subject's sequence.
            // Unknown (its history expired before this fold began): its
            // history, each event at its own sequence, so that a lease
            // keeps its place in the queue.
            EventData::LeaseRestated(r) => {
                if !self.leases.contains_key(&r.lease_id) {
                    for e in &r.history {
                        self.apply_to_leases(e.sequence, &e.envelope);
                    }
                }
                let _ = self.lease_at(r.lease_id, sequence);
            }
            EventData::TenantRestated(r) => {
                if !self.tenants.contains_key(&r.tenant_id) {
                    for e in &r.history {
                        self.apply_to_leases(e.sequence, &e.envelope);
                    }
                }
            }
            EventData::TenantCreated(e) => {
                self.tenants.insert(
                    e.tenant_id,
                    Tenant {
                        quota: e.quota,
                        weight: e.weight.max(1),
                        suspended: false,
                        trusted: e.trusted,
                    },
                );
            }
            EventData::TenantQuotaChanged(e) => {
                if let Some(t) = self.tenants.get_mut(&e.tenant_id) {
                    t.quota = e.quota;
                    t.weight = e.weight.max(1);
                }
            }
            EventData::TenantSuspended(e) => {
                if let Some(t) = self.tenants.get_mut(&e.tenant_id) {
                    t.suspended = true;
                }
            }
            EventData::TenantResumed(e) => {
                if let Some(t) = self.tenants.get_mut(&e.tenant_id) {
                    t.suspended = false;
                }
            }
            EventData::LeaseRequested(e) => {
                let ask = e.ask();
                let footprint = lh_domain::catalog::footprint(&e.gpu_model, &ask);
                self.leases.entry(e.lease_id).or_insert_with(|| Lease {
                    id: e.lease_id,
                    tenant_id: e.tenant_id,
                    gpus: ask.gpus(),
                    ask,
                    gpu_model: e.gpu_model.clone(),
                    tier: e.tier,
                    priority: e.priority,
                    status: Status::Requested,
                    stop_requested: false,
                    requested_at: envelope.occurred_at,
                    placed_before: false,
                    requested_sequence: sequence,
                    subject_sequence: sequence,
                    correlation_id: envelope.correlation_id,
                    request_event_id: envelope.id,
                    node_id: None,
                    members: Vec::new(),
                    compute_milli: footprint.milli,
                    vram_gb: footprint.vram_gb,
                    started_at: None,
                    waiting_since: Some(envelope.occurred_at),
                    preemption_deadline: None,
                    max_price_cny_per_gpu_hour: e.max_price_cny_per_gpu_hour,
                    zones: e.zones.clone(),
                    regions: e.regions.clone(),
                    zone: None,
                    preferred_zone: e
                        .recovery_of
                        .as_ref()
                        .filter(|_| {
                            e.recovery.as_ref().map(|r| r.zone_first)
                                == Some(lh_events::ZoneFirst::Same)
                        })
                        .map(|r| r.zone.clone()),
                    recovery_request: (e.tier == Tier::Spot && e.recovery.is_some())
                        .then(|| Box::new(e.clone())),
                });
                self.waiting.insert(sequence, e.lease_id);
                if let Some(of) = &e.recovery_of {
                    self.recoveries.remove(&of.lease_id);
                }
                if e.tier == Tier::Spot {
                    self.spot_stats.requested += 1;
                }
            }
            EventData::LeaseQueued(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.status = Status::Queued {
                        reason: e.reason.clone(),
                        position: e.position,
                    };
                }
            }
            EventData::LeasePlaced(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    let first_spot_placement = l.tier == Tier::Spot && !l.placed_before;
                    l.status = Status::Holding;
                    l.placed_before = true;
                    l.zone = Some(e.zone.clone());
                    l.node_id = Some(e.node_id.clone());
                    l.members = e
                        .members
                        .iter()
                        .map(|m| (m.node_id.clone(), m.gpus.len() as u32))
                        .collect();
                    l.vram_gb = e.vram_gb_per_gpu * l.gpus;
                    let key = l.requested_sequence;
                    self.waiting.remove(&key);
                    self.awaiting_preemption.remove(&e.lease_id);
                    if first_spot_placement {
                        self.spot_stats.accepted += 1;
                    }
                }
            }
            EventData::LeaseStopRequested(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.stop_requested = true;
                }
            }
            EventData::LeasePreemptionNoticed(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.preemption_deadline = Some(e.deadline);
                    self.spot_stats.noticed(e.reason);
                }
                if e.reason != lh_events::PreemptionReason::Outbid {
                    self.awaiting_preemption.insert(e.preempted_for);
                }
            }
            EventData::LeaseStarted(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.started_at = Some(e.started_at);
                    l.waiting_since = None;
                    let tenant = l.tenant_id;
                    self.availability.started(e.lease_id, tenant, e.started_at);
                }
            }
            EventData::LeaseEnded(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    let lease = l.clone();
                    self.spot_ended(&lease, e.reason);
                    self.availability.stopped_owing(e.lease_id, e.ended_at);
                }
                self.forget(e.lease_id)
            }
            EventData::SpotPriceSet(p) => self.spot_price_set(p),
            EventData::LeaseMigrated(e) => {
                if self.is_new_on_lease(e.lease_id, sequence) {
                    self.availability.interrupted(e.lease_id, e.billing_ends_at);
                }
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.started_at = None;
                    l.preemption_deadline = None;
                    match &e.to {
                        Some(to) => {
                            l.status = Status::Holding;
                            l.node_id = Some(to.node_id.clone());
                            l.zone = Some(to.zone.clone());
                        }
                        None => {
                            // Back in the queue, keeping its place.
                            l.status = Status::Requested;
                            l.waiting_since = Some(envelope.occurred_at);
                            l.node_id = None;
                            l.zone = None;
                            let key = l.requested_sequence;
                            self.waiting.insert(key, e.lease_id);
                        }
                    }
                }
            }
            EventData::LeaseSuspended(e) => {
                if self.is_new_on_lease(e.lease_id, sequence) {
                    self.availability.stopped_owing(e.lease_id, e.suspended_at);
                }
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.status = Status::Suspended;
                    l.node_id = None;
                    l.zone = None;
                    l.started_at = None;
                    l.preemption_deadline = None;
                }
            }
            EventData::LeaseResumeRequested(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    if l.status == Status::Suspended {
                        // Back in the queue, keeping its place; starvation
                        // counts from the resume, not the first request.
                        l.status = Status::Requested;
                        l.requested_at = envelope.occurred_at;
                        l.waiting_since = Some(envelope.occurred_at);
                        let key = l.requested_sequence;
                        self.waiting.insert(key, e.lease_id);
                    }
                }
            }
            EventData::LeaseRejected(e) => self.forget(e.lease_id),
            // Observations on a lease's subject (idle, GPU faults) change
            // nothing here but its sequence, which guarded writes expect.
            other => {
                if let Some(id) = other.lease_id() {
                    let _ = self.lease_at(id, sequence);
                }
            }
        }
    }

    /// Whether an event at `sequence` on a known lease's subject is not
    /// applied yet (what [`State::lease_at`] checks, without taking it).
    fn is_new_on_lease(&self, lease_id: Uuid, sequence: u64) -> bool {
        self.leases
            .get(&lease_id)
            .is_some_and(|l| sequence > l.subject_sequence)
    }

    /// The lease an event at `sequence` on its subject applies to; `None`
    /// when the lease is unknown or the event was applied already (a writer
    /// applies its own events at once and the feed repeats them later).
    fn lease_at(&mut self, lease_id: Uuid, sequence: u64) -> Option<&mut Lease> {
        let lease = self.leases.get_mut(&lease_id)?;
        if sequence <= lease.subject_sequence {
            return None;
        }
        lease.subject_sequence = sequence;
        Some(lease)
    }

    fn forget(&mut self, lease_id: Uuid) {
        if let Some(l) = self.leases.remove(&lease_id) {
            self.waiting.remove(&l.requested_sequence);
        }
        self.awaiting_preemption.remove(&lease_id);
    }

    /// What the log says, for a snapshot: not what this process heard of
    /// nodes or when it started (liveness starts afresh).
    pub fn snapshot(&self) -> serde_json::Value {
        serde_json::json!({
            "fleet": self.fleet,
            "leases": self.leases,
            "tenants": self.tenants,
            "waiting": self.waiting,
            "awaiting_preemption": self.awaiting_preemption,
            "spot": self.spot_snapshot(),
            "availability": self.availability,
        })
    }

    /// Takes back a [`State::snapshot`]; false when it does not fit. A
    /// caller that holds a [`PlacementEngineCache`] for this state must
    /// [`clear`](PlacementEngineCache::clear) it after a restore: the
    /// engine holds the fleet the snapshot replaced.
    pub fn restore(&mut self, mut snapshot: serde_json::Value) -> bool {
        // Parsed whole before anything is assigned: a snapshot that does
        // not fit leaves the state untouched for the replay.
        let Some(spot) = spot::SpotSnapshot::parse(snapshot["spot"].take()) else {
            return false;
        };
        let mut take = |field: &str| snapshot[field].take();
        let (Ok(fleet), Ok(leases), Ok(tenants), Ok(waiting), Ok(awaiting_preemption)) = (
            serde_json::from_value(take("fleet")),
            serde_json::from_value(take("leases")),
            serde_json::from_value(take("tenants")),
            serde_json::from_value(take("waiting")),
            serde_json::from_value(take("awaiting_preemption")),
        ) else {
            return false;
        };
        self.fleet = fleet;
        self.watch.rebuild(&self.fleet, &self.heard);
        self.leases = leases;
        self.tenants = tenants;
        self.waiting = waiting;
        self.awaiting_preemption = awaiting_preemption;
        self.restore_spot(spot);
        // A snapshot from before availability was folded: the leases
        // running then owe from their start on, as a replay would find.
        self.availability = match serde_json::from_value(snapshot["availability"].take()) {
            Ok(availability) => availability,
            Err(_) => {
                let mut availability = availability::AvailabilityStats::default();
                for lease in self.leases.values() {
                    if let Some(started_at) = lease.started_at {
                        availability.started(lease.id, lease.tenant_id, started_at);
                    }
                }
                availability
            }
        };
        true
    }

    pub fn waiting_count(&self) -> usize {
        self.waiting.len()
    }

    /// Nodes held lost.
    pub fn lost_count(&self) -> usize {
        self.watch.lost_count()
    }

    /// Whether what the watch follows is what filing every node anew gives.
    #[cfg(test)]
    pub(super) fn watch_is_current(&self) -> bool {
        let mut rebuilt = watch::NodeWatch::default();
        rebuilt.rebuild(&self.fleet, &self.heard);
        rebuilt == self.watch
    }

    /// Idle milli-GPU that no waiting lease fits (see [`fragmentation`]).
    pub fn fragmented_milli(&self) -> u64 {
        // Many waiting leases ask alike: each distinct ask is tried once
        // per GPU.
        let mut seen = Vec::new();
        let waiting: Vec<fragmentation::Want<'_>> = self
            .waiting
            .values()
            .filter_map(|id| self.leases.get(id))
            .filter(|l| {
                let key = (&l.gpu_model, &l.ask);
                let new = !seen.contains(&key);
                if new {
                    seen.push(key);
                }
                new
            })
            .map(|l| fragmentation::Want {
                gpu_model: &l.gpu_model,
                ask: &l.ask,
                milli: l.compute_milli.min(MILLI_PER_GPU),
                vram_gb: l.vram_gb,
            })
            .collect();
        fragmentation::fragmented_milli(&self.fleet, &waiting)
    }
}
