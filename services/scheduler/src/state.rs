//! The scheduler's view of the world and its decisions, as pure functions:
//! [`State::apply`] folds one stored event in, [`State::decide`] says what
//! to append next. No I/O and no clock: `now` comes in as an argument.
//!
//! The queue, in order:
//! 1. on-demand (basic) before spot;
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

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Duration, Utc};
use lh_bus::Expect;
use lh_domain::fleet::Fleet;
use lh_domain::placement::{self, Request, Unplaceable};
use lh_events::{
    derived_id, Actor, AssignedGpu, Decision, DrainMode, EndReason, Envelope, EventData,
    GpuFraction, GpuHealth, LeaseEnded, LeaseMigrated, LeasePlaced, LeasePreemptionNoticed,
    LeaseQueued, LeaseRejected, MigInstance, NodeAllocation, NodeGpusAllocated, NodeLost,
    NodeRejoined, Quota, Relocation, Tier,
};

use crate::planner::{self, Ask, Planner};
use uuid::Uuid;

pub const SERVICE: &str = "lh-scheduler";
/// Milli-GPU in one whole GPU.
pub const MILLI_PER_GPU: u64 = 1000;
/// Queue positions are kept exact (re-announced when they move) this far
/// down the queue; beyond it a position is announced once.
pub const EXACT_POSITIONS: u32 = 100;
/// Most spot leases on one node considered as preemption victims at once
/// (the search tries every subset).
pub const MAX_VICTIMS_PER_NODE: usize = 12;

/// Knobs of the queueing rules.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// A spot lease younger than this is never preempted.
    pub preemption_min_runtime: Duration,
    /// Time a preempted spot lease gets between notice and eviction.
    pub preemption_notice: Duration,
    /// A waiting lease older than this stops smaller ones of its model from
    /// jumping ahead.
    pub backfill_starvation: Duration,
    /// A node silent this long is lost: its leases move elsewhere.
    pub node_lost_after: Duration,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            preemption_min_runtime: Duration::minutes(10),
            preemption_notice: Duration::seconds(120),
            backfill_starvation: Duration::minutes(5),
            node_lost_after: Duration::seconds(3),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    Requested,
    Queued {
        reason: String,
        position: u32,
    },
    /// Placed or running: holds GPUs until it ends.
    Holding,
    /// Idle and suspended by its node: holds nothing, waits for a resume.
    Suspended,
}

#[derive(Debug, Clone)]
pub struct Lease {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub gpus: u32,
    /// A share of one GPU instead of whole GPUs.
    pub fraction: Option<GpuFraction>,
    /// A MIG instance of this profile instead of whole GPUs.
    pub mig_profile: Option<String>,
    pub gpu_model: String,
    pub tier: Tier,
    pub priority: i32,
    pub status: Status,
    pub stop_requested: bool,
    /// When it joined the queue: its request, or its resume.
    pub requested_at: DateTime<Utc>,
    /// It was placed at least once (a quota breach then queues it, never
    /// rejects it).
    pub placed_before: bool,
    /// Sequence of `lease.requested`: first come, first served.
    pub requested_sequence: u64,
    /// Last stream sequence on this lease's subject.
    pub subject_sequence: u64,
    pub correlation_id: Uuid,
    pub request_event_id: Uuid,
    /// Where it runs, once placed.
    pub node_id: Option<String>,
    pub vram_gb: u32,
    pub started_at: Option<DateTime<Utc>>,
    /// Set once this spot lease has been told it will be preempted.
    pub preemption_deadline: Option<DateTime<Utc>>,
}

impl Lease {
    fn milli(&self) -> u64 {
        match (self.fraction, &self.mig_profile) {
            (Some(f), _) => u64::from(f.milli),
            (None, Some(p)) => mig_size(&self.gpu_model, p).map_or(0, |s| u64::from(s.0)),
            (None, None) => u64::from(self.gpus) * MILLI_PER_GPU,
        }
    }

    /// Whole GPUs: the only leases that preempt or hold GPUs back.
    pub fn is_whole(&self) -> bool {
        self.fraction.is_none() && self.mig_profile.is_none()
    }

    /// The request field a quota breach names.
    fn size_field(&self) -> &'static str {
        match (self.fraction, &self.mig_profile) {
            (Some(_), _) => "gpu_fraction",
            (None, Some(_)) => "mig_profile",
            (None, None) => "gpus",
        }
    }

    pub fn ask(&self) -> Ask {
        match (self.fraction, &self.mig_profile) {
            (Some(f), _) => Ask::Fraction {
                milli: f.milli,
                vram_gb: f.vram_gb,
            },
            (None, Some(p)) => Ask::Mig {
                profile: lh_placement::mig::profiles(&self.gpu_model)
                    .iter()
                    .find(|x| x.name == p)
                    .map_or("", |x| x.name),
            },
            (None, None) => Ask::Whole(self.gpus),
        }
    }
}

/// `(milli, VRAM GB)` an instance of `profile` of `model` takes.
fn mig_size(model: &str, profile: &str) -> Option<(u16, u32)> {
    let g = lh_placement::mig::geometry(model)?;
    g.profile(profile).map(|p| lh_placement::mig::size(p, g))
}

#[derive(Debug, Clone, Copy)]
pub struct Tenant {
    pub quota: Quota,
    pub weight: u32,
}

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
}

/// The last heartbeat of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heard {
    /// When we received it (our clock: silence is measured on it).
    pub local: DateTime<Utc>,
    /// The node's own timestamp in it (billing of its leases ends there).
    pub node_at: DateTime<Utc>,
}

/// One decision: events appended together as one atomic batch.
pub type Batch = Vec<(Envelope, Expect)>;

/// The outcome of one decision pass.
#[derive(Debug, Default)]
pub struct Decisions {
    pub batches: Vec<Batch>,
}

impl State {
    pub fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        let data = &envelope.data;
        self.fleet.apply(sequence, data);
        match data {
            EventData::TenantCreated(e) => {
                self.tenants.insert(
                    e.tenant_id,
                    Tenant {
                        quota: e.quota,
                        weight: e.weight.max(1),
                    },
                );
            }
            EventData::LeaseRequested(e) => {
                let vram_per_gpu = lh_domain::catalog::vram_gb(&e.gpu_model).unwrap_or(0);
                self.leases.entry(e.lease_id).or_insert_with(|| Lease {
                    id: e.lease_id,
                    tenant_id: e.tenant_id,
                    gpus: if e.fraction.is_some() || e.mig_profile.is_some() {
                        1
                    } else {
                        e.gpus
                    },
                    fraction: e.fraction,
                    mig_profile: e.mig_profile.clone(),
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
                    vram_gb: match (e.fraction, &e.mig_profile) {
                        (Some(f), _) => f.vram_gb,
                        (None, Some(p)) => mig_size(&e.gpu_model, p).map_or(0, |s| s.1),
                        (None, None) => e.gpus * vram_per_gpu,
                    },
                    started_at: None,
                    preemption_deadline: None,
                });
                self.waiting.insert(sequence, e.lease_id);
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
                    l.status = Status::Holding;
                    l.placed_before = true;
                    l.node_id = Some(e.node_id.clone());
                    l.vram_gb = e.vram_gb_per_gpu * l.gpus;
                    let key = l.requested_sequence;
                    self.waiting.remove(&key);
                    self.awaiting_preemption.remove(&e.lease_id);
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
                }
                self.awaiting_preemption.insert(e.preempted_for);
            }
            EventData::LeaseStarted(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.started_at = Some(e.started_at);
                }
            }
            EventData::LeaseEnded(e) => self.forget(e.lease_id),
            EventData::LeaseMigrated(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.started_at = None;
                    l.preemption_deadline = None;
                    match &e.to {
                        Some(to) => {
                            l.status = Status::Holding;
                            l.node_id = Some(to.node_id.clone());
                        }
                        None => {
                            // Back in the queue, keeping its place.
                            l.status = Status::Requested;
                            l.node_id = None;
                            let key = l.requested_sequence;
                            self.waiting.insert(key, e.lease_id);
                        }
                    }
                }
            }
            EventData::LeaseSuspended(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.status = Status::Suspended;
                    l.node_id = None;
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

    pub fn waiting_count(&self) -> usize {
        self.waiting.len()
    }

    /// A heartbeat of `node_id` stamped `node_at` arrived at `local`.
    pub fn heard(&mut self, node_id: &str, node_at: DateTime<Utc>, local: DateTime<Utc>) {
        let h = self
            .heard
            .entry(node_id.to_string())
            .or_insert(Heard { local, node_at });
        if local >= h.local {
            *h = Heard { local, node_at };
        }
    }

    /// Nodes whose liveness changes at `now`: `(node, lost)` for each node
    /// to declare lost (`true`) or rejoined (`false`).
    pub fn liveness_changes(&self, now: DateTime<Utc>, rules: &Rules) -> Vec<(String, bool)> {
        let Some(since) = self.liveness_since else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for node in self.fleet.nodes.values() {
            let last = self.heard.get(&node.id).map_or(since, |h| h.local);
            let silent = now - last > rules.node_lost_after;
            match (node.lost.is_some(), silent) {
                (false, true) => out.push((node.id.clone(), true)),
                (true, false) => out.push((node.id.clone(), false)),
                _ => {}
            }
        }
        out
    }

    /// `(milli, vram GB)` each tenant holds now.
    fn held_by_tenant(&self) -> HashMap<Uuid, (u64, u64)> {
        let mut held: HashMap<Uuid, (u64, u64)> = HashMap::new();
        for l in self.leases.values().filter(|l| l.status == Status::Holding) {
            let h = held.entry(l.tenant_id).or_default();
            h.0 += l.milli();
            h.1 += u64::from(l.vram_gb);
        }
        held
    }

    /// Waiting leases in queue order (see the module docs), with the held
    /// amounts evolving as if each lease before were placed.
    pub fn queue_order(&self) -> Vec<Uuid> {
        let mut held = self.held_by_tenant();
        // tier → tenant → leases by (priority desc, sequence asc)
        let mut per_tier: BTreeMap<u8, HashMap<Uuid, Vec<&Lease>>> = BTreeMap::new();
        for id in self.waiting.values() {
            let Some(l) = self.leases.get(id) else {
                continue;
            };
            let tier_rank = match l.tier {
                Tier::Basic => 0,
                Tier::Spot => 1,
            };
            per_tier
                .entry(tier_rank)
                .or_default()
                .entry(l.tenant_id)
                .or_default()
                .push(l);
        }
        let mut order = Vec::with_capacity(self.waiting.len());
        for (_, mut tenants) in per_tier {
            for queue in tenants.values_mut() {
                queue.sort_by_key(|l| (std::cmp::Reverse(l.priority), l.requested_sequence));
                queue.reverse(); // pop from the back
            }
            loop {
                // The tenant with the smallest weighted share goes next;
                // ties by who asked first.
                let next = tenants
                    .iter()
                    .filter_map(|(t, q)| q.last().map(|l| (*t, l)))
                    .min_by(|(ta, la), (tb, lb)| {
                        let share = |t: &Uuid| {
                            let weight = self.tenants.get(t).map(|x| x.weight).unwrap_or(1);
                            held.get(t).map(|h| h.0).unwrap_or(0) as f64 / f64::from(weight)
                        };
                        share(ta)
                            .total_cmp(&share(tb))
                            .then(la.requested_sequence.cmp(&lb.requested_sequence))
                    })
                    .map(|(t, _)| t);
                let Some(tenant) = next else { break };
                let lease = tenants.get_mut(&tenant).and_then(Vec::pop).expect("head");
                held.entry(tenant).or_default().0 += lease.milli();
                order.push(lease.id);
            }
        }
        order
    }

    /// What to append now, in queue order. Each batch assumes the ones
    /// before it were stored; after a conflict the caller re-reads the log
    /// and asks again. A second placement on a node in one pass expects the
    /// node's sequence after the first: the caller sets it from the sequence
    /// the first one got (see [`State::expect_current`]).
    pub fn decide(&self, now: DateTime<Utc>, rules: &Rules) -> Decisions {
        let mut scratch = self.fleet.clone();
        let mut held = self.held_by_tenant();
        let workload = {
            let mut live: Vec<&Lease> = self.leases.values().collect();
            live.sort_by_key(|l| l.requested_sequence);
            planner::workload(live.iter().map(|l| (l.ask(), l.gpu_model.as_str())))
        };
        let mut out = Vec::new();
        self.decide_liveness(now, rules, &mut scratch, &mut out);
        // Rebuilt from `scratch` when the pass reserves GPUs outside it.
        let mut engine: Option<Planner> = None;
        self.decide_migrations(now, &mut scratch, &workload, &mut engine, &mut out);
        // A suspended lease holds nothing: a stop ends it here.
        let mut stopped: Vec<&Lease> = self
            .leases
            .values()
            .filter(|l| l.status == Status::Suspended && l.stop_requested)
            .collect();
        stopped.sort_by_key(|l| l.requested_sequence);
        for lease in stopped {
            let ended = EventData::LeaseEnded(LeaseEnded {
                lease_id: lease.id,
                node_id: None,
                ended_at: now,
                reason: EndReason::Stopped,
                exit_code: None,
            });
            out.push(vec![(
                lease_event(lease, now, ended, "lease.ended"),
                Expect::LastSubjectSequence(lease.subject_sequence),
            )]);
        }
        let mut positions: HashMap<&str, u32> = HashMap::new();
        for lease_id in self.queue_order() {
            let lease = &self.leases[&lease_id];
            let event = |data: EventData, step: &str| lease_event(lease, now, data, step);
            let expect_lease = Expect::LastSubjectSequence(lease.subject_sequence);
            if lease.stop_requested {
                let ended = EventData::LeaseEnded(LeaseEnded {
                    lease_id: lease.id,
                    node_id: None,
                    ended_at: now,
                    reason: EndReason::Cancelled,
                    exit_code: None,
                });
                out.push(vec![(event(ended, "lease.ended"), expect_lease)]);
                continue;
            }
            let Some(tenant) = self.tenants.get(&lease.tenant_id) else {
                let rejected = EventData::LeaseRejected(LeaseRejected {
                    lease_id: lease.id,
                    reason: "unknown tenant".into(),
                    field: None,
                });
                out.push(vec![(event(rejected, "lease.rejected"), expect_lease)]);
                continue;
            };
            let (held_milli, held_vram) = held.get(&lease.tenant_id).copied().unwrap_or((0, 0));
            if let Some(reason) = quota_breach(&tenant.quota, held_milli, held_vram, lease) {
                if lease.placed_before {
                    // It has run (then was suspended or moved): refusing it
                    // now would lose it; it waits until the tenant has room.
                    let unchanged =
                        matches!(&lease.status, Status::Queued { reason: r, .. } if *r == reason);
                    if !unchanged {
                        let queued = EventData::LeaseQueued(LeaseQueued {
                            lease_id: lease.id,
                            reason,
                            position: 0,
                        });
                        out.push(vec![(event(queued, "lease.queued"), expect_lease)]);
                    }
                    continue;
                }
                let rejected = EventData::LeaseRejected(LeaseRejected {
                    lease_id: lease.id,
                    reason,
                    field: Some(lease.size_field().into()),
                });
                out.push(vec![(event(rejected, "lease.rejected"), expect_lease)]);
                continue;
            }
            let planner = engine.get_or_insert_with(|| Planner::new(&scratch, &workload));
            match planner.place(lease.ask(), &lease.gpu_model) {
                Ok(p) => {
                    let node_seq = scratch.node_sequence.get(&p.node_id).copied().unwrap_or(0);
                    let (to, allocated) = relocate(&scratch, lease, &p);
                    let vram_gb_per_gpu = to.vram_gb_per_gpu;
                    let placed = EventData::LeasePlaced(LeasePlaced {
                        lease_id: lease.id,
                        node_id: to.node_id,
                        zone: to.zone,
                        gpu_model: lease.gpu_model.clone(),
                        vram_gb_per_gpu,
                        gpus: to.gpus,
                        decision: to.decision,
                    });
                    let placed_env = event(placed, "lease.placed");
                    let mut alloc_env = event(allocated, "node.gpus_allocated");
                    alloc_env.causation_id = Some(placed_env.id);
                    // Plan the rest of this pass on top of this placement.
                    scratch.apply(u64::MAX, &alloc_env.data);
                    let h = held.entry(lease.tenant_id).or_default();
                    h.0 += lease.milli();
                    h.1 += u64::from(vram_gb_per_gpu) * p.gpu_indices.len() as u64;
                    out.push(vec![
                        (placed_env, expect_lease),
                        (alloc_env, Expect::LastSubjectSequence(node_seq)),
                    ]);
                }
                Err(_) => {
                    let position = positions.entry(&lease.gpu_model).or_default();
                    *position += 1;
                    let (mut reason, busy) = why_pending(&scratch, lease);
                    if busy
                        && lease.is_whole()
                        && lease.tier == Tier::Basic
                        && !self.awaiting_preemption.contains(&lease.id)
                    {
                        if let Some(plan) = plan_preemption(self, &scratch, lease, now, rules) {
                            reason = format!(
                                "preempting {} spot lease(s) on {}; their notice ends {}",
                                plan.victims.len(),
                                plan.node_id,
                                (now + rules.preemption_notice).to_rfc3339()
                            );
                            for victim in &plan.victims {
                                let v = &self.leases[victim];
                                let mut notice = Envelope::new(
                                    Actor::Service(SERVICE.into()),
                                    now,
                                    EventData::LeasePreemptionNoticed(LeasePreemptionNoticed {
                                        lease_id: *victim,
                                        node_id: plan.node_id.clone(),
                                        preempted_for: lease.id,
                                        deadline: now + rules.preemption_notice,
                                    }),
                                )
                                .with_id(derived_id(&[
                                    "lease.preemption_noticed",
                                    &victim.to_string(),
                                ]));
                                notice.correlation_id = lease.correlation_id;
                                notice.causation_id = Some(lease.request_event_id);
                                notice.tenant_id = Some(v.tenant_id);
                                out.push(vec![(
                                    notice,
                                    Expect::LastSubjectSequence(v.subject_sequence),
                                )]);
                            }
                            // The victims' GPUs and the free ones go to this lease.
                            reserve_for(&mut scratch, &plan.node_id, lease);
                            engine = None;
                        }
                    }
                    let starving = busy
                        && lease.is_whole()
                        && now - lease.requested_at > rules.backfill_starvation;
                    if starving {
                        // Stop backfill: keep the free GPUs of its model.
                        for node in scratch.nodes.values_mut() {
                            node.gpus
                                .iter_mut()
                                .filter(|g| g.model == lease.gpu_model && !g.mig && g.is_free())
                                .for_each(|g| g.held_by = Some(lease.id));
                        }
                        engine = None;
                    }
                    // A lease waiting for its victims keeps saying so.
                    let waiting_for_victims = self.awaiting_preemption.contains(&lease.id)
                        && matches!(lease.status, Status::Queued { .. });
                    let unchanged = waiting_for_victims
                        || match &lease.status {
                            Status::Queued {
                                reason: r,
                                position: p,
                            } => *r == reason && (*p == *position || *position > EXACT_POSITIONS),
                            _ => false,
                        };
                    if !unchanged {
                        let queued = EventData::LeaseQueued(LeaseQueued {
                            lease_id: lease.id,
                            reason,
                            position: *position,
                        });
                        out.push(vec![(event(queued, "lease.queued"), expect_lease)]);
                    }
                }
            }
        }
        Decisions { batches: out }
    }

    /// `node.lost` for nodes silent too long, `node.rejoined` for lost nodes
    /// heard again; `scratch` follows.
    fn decide_liveness(
        &self,
        now: DateTime<Utc>,
        rules: &Rules,
        scratch: &mut Fleet,
        out: &mut Vec<Batch>,
    ) {
        for (node_id, lost) in self.liveness_changes(now, rules) {
            let since = self.liveness_since.unwrap_or(now);
            let heard = self.heard.get(&node_id).copied();
            let node_seq = scratch.node_sequence.get(&node_id).copied().unwrap_or(0);
            let (data, step) = if lost {
                let last_local = heard.map_or(since, |h| h.local);
                let data = EventData::NodeLost(NodeLost {
                    node_id: node_id.clone(),
                    // Never heard since we started: bill no later than that.
                    last_heard_at: heard.map_or(since, |h| h.node_at),
                    silence_ms: (now - last_local).num_milliseconds().max(0) as u64,
                });
                (data, "node.lost")
            } else {
                let data = EventData::NodeRejoined(NodeRejoined {
                    node_id: node_id.clone(),
                    heard_at: heard.map_or(now, |h| h.node_at),
                });
                (data, "node.rejoined")
            };
            let envelope = Envelope::new(Actor::Service(SERVICE.into()), now, data)
                .with_id(derived_id(&[step, &node_id, &node_seq.to_string()]));
            scratch.apply(u64::MAX, &envelope.data);
            out.push(vec![(envelope, Expect::LastSubjectSequence(node_seq))]);
        }
    }

    /// Moves every lease held on a lost node, on a node drained with `move`,
    /// or on a GPU turned unhealthy: placed again at once where the engine
    /// finds room (`lease.migrated` with `to`), else back in the queue.
    fn decide_migrations(
        &self,
        now: DateTime<Utc>,
        scratch: &mut Fleet,
        workload: &lh_placement::ShapeMix,
        engine: &mut Option<Planner>,
        out: &mut Vec<Batch>,
    ) {
        let mut moving: Vec<(&Lease, String, String, DateTime<Utc>)> = self
            .leases
            .values()
            .filter(|l| l.status == Status::Holding)
            .filter_map(|l| {
                let node = scratch.nodes.get(l.node_id.as_deref()?)?;
                let (reason, billing_ends_at) = why_move(scratch, node, l.id, now)?;
                Some((l, node.id.clone(), reason, billing_ends_at))
            })
            .collect();
        moving.sort_by_key(|(l, ..)| l.requested_sequence);
        for (lease, from_node, reason, last_heard) in moving {
            let from_gpu_indices = scratch
                .holdings
                .get(&lease.id)
                .map(|(_, idx)| idx.clone())
                .unwrap_or_default();
            let planner = engine.get_or_insert_with(|| Planner::new(scratch, workload));
            let placed = planner.place(lease.ask(), &lease.gpu_model).ok();
            let mut batch = Vec::new();
            let to = placed.map(|p| {
                let (relocation, allocation) = relocate(scratch, lease, &p);
                let node_seq = scratch.node_sequence.get(&p.node_id).copied().unwrap_or(0);
                batch.push((allocation, node_seq));
                relocation
            });
            let migrated = EventData::LeaseMigrated(LeaseMigrated {
                lease_id: lease.id,
                reason,
                from_node_id: from_node,
                from_gpu_indices,
                billing_ends_at: last_heard,
                to,
            });
            let migrated = lease_event(lease, now, migrated, "lease.migrated");
            scratch.apply(u64::MAX, &migrated.data);
            let mut decision = vec![(
                migrated.clone(),
                Expect::LastSubjectSequence(lease.subject_sequence),
            )];
            for (allocation, node_seq) in batch {
                let mut env = lease_event(lease, now, allocation, "node.gpus_allocated.migrated");
                env.causation_id = Some(migrated.id);
                scratch.apply(u64::MAX, &env.data);
                decision.push((env, Expect::LastSubjectSequence(node_seq)));
            }
            out.push(decision);
        }
    }

    /// Refreshes the expectation of every node message in `batch` from the
    /// sequences this state knows now, which include the batches this
    /// scheduler appended earlier in the same pass.
    pub fn expect_current(&self, batch: &mut Batch) {
        for (envelope, expect) in batch.iter_mut() {
            if let EventData::NodeGpusAllocated(a) = &envelope.data {
                let seq = self
                    .fleet
                    .node_sequence
                    .get(&a.node_id)
                    .copied()
                    .unwrap_or(0);
                *expect = Expect::LastSubjectSequence(seq);
            }
        }
    }
}

/// Why a lease held on `node` must move now, and when its billing there
/// ends: the node was lost (at its last heartbeat), is drained with `move`
/// (now), or one of the lease's GPUs turned unhealthy (when it did).
fn why_move(
    scratch: &Fleet,
    node: &placement::Node,
    lease_id: Uuid,
    now: DateTime<Utc>,
) -> Option<(String, DateTime<Utc>)> {
    if let Some(at) = node.lost {
        return Some((format!("node {} lost", node.id), at));
    }
    if node.cordoned == Some(Some(DrainMode::Move)) {
        return Some((format!("node {} drained", node.id), now));
    }
    let (_, indices) = scratch.holdings.get(&lease_id)?;
    node.gpus
        .iter()
        .filter(|g| indices.contains(&g.index) && g.health == GpuHealth::Unhealthy)
        .map(|g| {
            (
                format!("GPU {} of node {} unhealthy", g.index, node.id),
                g.health_since.unwrap_or(now).min(now),
            )
        })
        .next()
}

/// An event about `lease` decided at `now`, its id derived from the step and
/// the lease's subject sequence (the same decision always has the same id).
fn lease_event(lease: &Lease, now: DateTime<Utc>, data: EventData, step: &str) -> Envelope {
    let mut env = Envelope::new(Actor::Service(SERVICE.into()), now, data).with_id(derived_id(&[
        step,
        &lease.id.to_string(),
        &lease.subject_sequence.to_string(),
    ]));
    env.correlation_id = lease.correlation_id;
    env.causation_id = Some(lease.request_event_id);
    env.tenant_id = Some(lease.tenant_id);
    env
}

/// What a placement the engine chose for `lease` gives, as the placed GPUs
/// and the matching `node.gpus_allocated`.
fn relocate(scratch: &Fleet, lease: &Lease, p: &planner::Chosen) -> (Relocation, EventData) {
    let node = &scratch.nodes[&p.node_id];
    let gpus: Vec<&placement::Gpu> = p
        .gpu_indices
        .iter()
        .filter_map(|i| node.gpus.iter().find(|g| g.index == *i))
        .collect();
    let share = match (&p.mig, lease.fraction) {
        (Some(m), _) => Some((u32::from(m.milli), m.vram_gb)),
        (None, f) => f.map(|f| (f.milli, f.vram_gb)),
    };
    let mig_instance = p.mig.as_ref().map(|m| MigInstance {
        profile: m.profile.name.to_string(),
        start: m.start,
    });
    let vram_gb_per_gpu = match share {
        Some((_, v)) => v,
        None => gpus.first().map(|g| g.vram_gb).unwrap_or(0),
    };
    let relocation = Relocation {
        node_id: p.node_id.clone(),
        zone: p.zone.clone(),
        vram_gb_per_gpu,
        gpus: gpus
            .iter()
            .map(|g| AssignedGpu {
                index: g.index,
                uuid: g.uuid.clone(),
                milli: share.map(|s| s.0),
                vram_gb: share.map(|s| s.1),
                mig_instance: mig_instance.clone(),
            })
            .collect(),
        decision: Decision {
            policy: p.provenance.policy.into(),
            policy_version: p.provenance.policy_version,
            candidates: p.provenance.candidates,
            winner_score: p.provenance.winner_score,
            runner_up_score: p.provenance.runner_up_score,
        },
    };
    let allocation = EventData::NodeGpusAllocated(NodeGpusAllocated {
        node_id: p.node_id.clone(),
        allocations: vec![NodeAllocation {
            lease_id: lease.id,
            gpu_indices: p.gpu_indices.clone(),
            milli: share.map(|s| s.0),
            vram_gb: share.map(|s| s.1),
            mig_instance,
        }],
    });
    (relocation, allocation)
}

fn quota_breach(quota: &Quota, held_milli: u64, held_vram: u64, lease: &Lease) -> Option<String> {
    let max_milli = u64::from(quota.max_gpus) * MILLI_PER_GPU;
    if held_milli + lease.milli() > max_milli {
        return Some(format!(
            "quota exceeded: tenant holds {} GPUs, asks for {} more, quota is {}",
            held_milli as f64 / MILLI_PER_GPU as f64,
            lease.milli() as f64 / MILLI_PER_GPU as f64,
            quota.max_gpus
        ));
    }
    if let Some(max_vram) = quota.max_vram_gb {
        if held_vram + u64::from(lease.vram_gb) > u64::from(max_vram) {
            return Some(format!(
                "VRAM quota exceeded: tenant holds {held_vram} GB, asks for {} GB more, quota is {max_vram} GB",
                lease.vram_gb
            ));
        }
    }
    None
}

/// Why `lease` cannot be placed now, and whether only busy capacity is in
/// the way (so waiting, or preempting, can help).
fn why_pending(scratch: &Fleet, lease: &Lease) -> (String, bool) {
    if let Some(profile) = &lease.mig_profile {
        let mig_gpus = scratch
            .nodes
            .values()
            .flat_map(|n| n.gpus.iter())
            .filter(|g| g.model == lease.gpu_model && g.mig)
            .count();
        return match (mig_size(&lease.gpu_model, profile), mig_gpus) {
            (None, _) => (
                format!("{} has no MIG profile {profile}", lease.gpu_model),
                false,
            ),
            (Some(_), 0) => (
                format!("no {} in MIG mode yet", lease.gpu_model),
                false,
            ),
            (Some(_), n) => (
                format!(
                    "waiting for capacity: no room for a {profile} instance on the {n} {} in MIG mode",
                    lease.gpu_model
                ),
                true,
            ),
        };
    }
    match lease.fraction {
        None => {
            let request = Request {
                gpus: lease.gpus,
                gpu_model: lease.gpu_model.clone(),
            };
            let usable: Vec<placement::Node> = scratch
                .nodes
                .values()
                .filter(|n| n.is_schedulable())
                .map(|n| placement::Node {
                    gpus: n
                        .gpus
                        .iter()
                        .filter(|g| g.health == GpuHealth::Healthy)
                        .cloned()
                        .collect(),
                    ..n.clone()
                })
                .collect();
            match placement::best_fit(&usable, &request) {
                Err(why) => (
                    why.reason(&request),
                    matches!(why, Unplaceable::Busy { .. }),
                ),
                // Only when the ask is out of the engine's range.
                Ok(_) => (
                    format!("{} x {} cannot be placed", lease.gpus, lease.gpu_model),
                    false,
                ),
            }
        }
        Some(f) => {
            let largest = scratch
                .nodes
                .values()
                .flat_map(|n| n.gpus.iter())
                .filter(|g| g.model == lease.gpu_model)
                .map(|g| g.vram_gb)
                .max();
            match largest {
                None => (format!("no node offers {} yet", lease.gpu_model), false),
                Some(v) if v < f.vram_gb || f.milli > 1000 || f.milli == 0 => (
                    format!(
                        "a share of {} milli / {} GB does not fit one {} ({v} GB)",
                        f.milli, f.vram_gb, lease.gpu_model
                    ),
                    false,
                ),
                Some(_) => (
                    format!(
                        "waiting for capacity: a share of {} milli / {} GB of one {}",
                        f.milli, f.vram_gb, lease.gpu_model
                    ),
                    true,
                ),
            }
        }
    }
}

fn reserve_for(scratch: &mut Fleet, node_id: &str, lease: &Lease) {
    if let Some(node) = scratch.nodes.get_mut(node_id) {
        node.gpus
            .iter_mut()
            .filter(|g| g.model == lease.gpu_model && !g.mig && g.is_free())
            .for_each(|g| g.held_by = Some(lease.id));
    }
}

/// Spot leases to evict so that `lease` fits.
#[derive(Debug, Clone, PartialEq)]
pub struct PreemptionPlan {
    pub node_id: String,
    pub victims: Vec<Uuid>,
    /// `(GPUs evicted, GPU-seconds of work the victims lose)`: lower is cheaper.
    pub cost: (u32, i64),
}

/// The cheapest set of running spot leases whose eviction lets `lease` fit
/// on one node: fewest GPUs evicted, then least work lost (GPU-seconds the
/// victims have run), then node id. Leases younger than the minimum runtime,
/// already noticed, or not started are never chosen.
pub fn plan_preemption(
    state: &State,
    scratch: &Fleet,
    lease: &Lease,
    now: DateTime<Utc>,
    rules: &Rules,
) -> Option<PreemptionPlan> {
    let mut best: Option<PreemptionPlan> = None;
    for node in scratch.nodes.values().filter(|n| n.is_schedulable()) {
        let of_model: Vec<_> = node
            .gpus
            .iter()
            .filter(|g| g.model == lease.gpu_model && !g.mig && g.health == GpuHealth::Healthy)
            .collect();
        if (of_model.len() as u32) < lease.gpus {
            continue;
        }
        let free = of_model.iter().filter(|g| g.is_free()).count() as u32;
        let need = lease.gpus.saturating_sub(free);
        if need == 0 {
            continue;
        }
        let mut candidates: Vec<&Lease> = of_model
            .iter()
            .filter_map(|g| g.held_by)
            .collect::<HashSet<_>>()
            .into_iter()
            .filter_map(|id| state.leases.get(&id))
            .filter(|v| {
                v.tier == Tier::Spot
                    && v.preemption_deadline.is_none()
                    && !v.stop_requested
                    && v.started_at
                        .is_some_and(|s| now - s >= rules.preemption_min_runtime)
            })
            .collect();
        candidates.sort_by_key(|v| v.id);
        candidates.truncate(MAX_VICTIMS_PER_NODE);
        let n = candidates.len();
        for mask in 1u32..(1u32 << n) {
            let chosen: Vec<&Lease> = (0..n)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| candidates[i])
                .collect();
            let freed: u32 = chosen.iter().map(|v| v.gpus).sum();
            if freed < need {
                continue;
            }
            let lost: i64 = chosen
                .iter()
                .map(|v| {
                    i64::from(v.gpus) * v.started_at.map(|s| (now - s).num_seconds()).unwrap_or(0)
                })
                .sum();
            let plan = PreemptionPlan {
                node_id: node.id.clone(),
                victims: chosen.iter().map(|v| v.id).collect(),
                cost: (freed, lost),
            };
            let better = match &best {
                None => true,
                Some(b) => (plan.cost, &plan.node_id) < (b.cost, &b.node_id),
            };
            if better {
                best = Some(plan);
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::*;

    fn env(data: EventData) -> Envelope {
        Envelope::new(Actor::Admin, Utc::now(), data)
    }

    fn env_at(data: EventData, at: DateTime<Utc>) -> Envelope {
        Envelope::new(Actor::Admin, at, data)
    }

    fn node(id: &str, n: u32) -> EventData {
        EventData::NodeRegistered(NodeRegistered {
            node_id: id.into(),
            zone: "z".into(),
            hostname: id.into(),
            gpus: (0..n)
                .map(|i| GpuInfo {
                    index: i,
                    uuid: format!("GPU-{id}-{i}"),
                    model: "A100-40GB".into(),
                    vram_gb: 40,
                    mig: false,
                })
                .collect(),
        })
    }

    fn node_mig(id: &str, n: u32) -> EventData {
        let EventData::NodeRegistered(mut r) = node(id, n) else {
            unreachable!()
        };
        r.gpus.iter_mut().for_each(|g| g.mig = true);
        EventData::NodeRegistered(r)
    }

    fn request_mig(lease: Uuid, tenant: Uuid, profile: &str) -> EventData {
        let EventData::LeaseRequested(mut r) = request(lease, tenant, 1) else {
            unreachable!()
        };
        r.mig_profile = Some(profile.into());
        EventData::LeaseRequested(r)
    }

    fn tenant_with(id: Uuid, max_gpus: u32, max_vram_gb: Option<u32>, weight: u32) -> EventData {
        EventData::TenantCreated(TenantCreated {
            tenant_id: id,
            name_sealed: String::new(),
            email_sealed: String::new(),
            api_key_sha256: String::new(),
            quota: Quota {
                max_gpus,
                max_vram_gb,
            },
            weight,
            idle_policy: None,
        })
    }

    fn tenant(id: Uuid, max_gpus: u32) -> EventData {
        tenant_with(id, max_gpus, None, 1)
    }

    fn request_full(lease: Uuid, tenant: Uuid, gpus: u32, tier: Tier, priority: i32) -> EventData {
        EventData::LeaseRequested(LeaseRequested {
            lease_id: lease,
            tenant_id: tenant,
            gpus,
            gpu_model: "A100-40GB".into(),
            tier,
            priority,
            idempotency_key: None,
            fraction: None,
            mig_profile: None,
            workload: None,
        })
    }

    fn request(lease: Uuid, tenant: Uuid, gpus: u32) -> EventData {
        request_full(lease, tenant, gpus, Tier::Basic, 0)
    }

    fn request_frac(lease: Uuid, tenant: Uuid, milli: u32, vram_gb: u32) -> EventData {
        EventData::LeaseRequested(LeaseRequested {
            lease_id: lease,
            tenant_id: tenant,
            gpus: 1,
            gpu_model: "A100-40GB".into(),
            tier: Tier::Basic,
            priority: 0,
            idempotency_key: None,
            fraction: Some(GpuFraction { milli, vram_gb }),
            mig_profile: None,
            workload: None,
        })
    }

    /// `(node, GPU index)` of a holding lease's GPUs.
    fn where_is(s: &State, lease: Uuid) -> (String, Vec<u32>) {
        s.fleet.holdings[&lease].clone()
    }

    #[test]
    fn fractions_pack_onto_one_gpu_until_its_vram_is_spent() {
        let t = Uuid::from_u128(1);
        let (f1, f2, f3) = (Uuid::from_u128(2), Uuid::from_u128(3), Uuid::from_u128(4));
        let mut s = given(vec![
            node("a", 2),
            tenant(t, 16),
            request_frac(f1, t, 300, 10),
        ]);
        settle(&mut s, Utc::now(), &Rules::default());
        s.apply(5000, &env(request_frac(f2, t, 500, 20)));
        settle(&mut s, Utc::now(), &Rules::default());
        assert_eq!(where_is(&s, f1), where_is(&s, f2), "same GPU");
        // 10 GB left on that GPU: a 15 GB share goes to the other one.
        s.apply(6000, &env(request_frac(f3, t, 100, 15)));
        let d = decide(&s).batches;
        match &d[0][0].0.data {
            EventData::LeasePlaced(p) => {
                assert_eq!(p.decision.policy, "leasehold");
                assert_eq!(p.vram_gb_per_gpu, 15);
                assert_eq!(p.gpus[0].milli, Some(100));
                assert_eq!(p.gpus[0].vram_gb, Some(15));
            }
            other => panic!("{other:?}"),
        }
        settle(&mut s, Utc::now(), &Rules::default());
        assert_ne!(where_is(&s, f3).1, where_is(&s, f1).1);
        let gpu = &s.fleet.nodes["a"].gpus[where_is(&s, f1).1[0] as usize];
        assert_eq!((gpu.used_milli(), gpu.used_vram_gb()), (800, 30));
        // A whole GPU is not free while shared: a 2-GPU lease waits.
        s.apply(7000, &env(request(Uuid::from_u128(5), t, 2)));
        settle(&mut s, Utc::now(), &Rules::default());
        assert!(matches!(
            s.leases[&Uuid::from_u128(5)].status,
            Status::Queued { .. }
        ));
    }

    #[test]
    fn a_fraction_counts_its_milli_and_vram_toward_the_quotas() {
        let t = Uuid::from_u128(1);
        // 1 GPU and 30 GB: 600 + 300 milli fit the GPU quota, a third
        // 200 milli does not; VRAM 20 + 10 fits, nothing more.
        let mut s = given(vec![
            node("a", 4),
            tenant_with(t, 1, Some(30), 1),
            request_frac(Uuid::from_u128(2), t, 600, 20),
            request_frac(Uuid::from_u128(3), t, 300, 10),
            request_frac(Uuid::from_u128(4), t, 50, 1),
            request_frac(Uuid::from_u128(5), t, 200, 1),
        ]);
        let d = decide(&s).batches;
        let fields: Vec<Option<String>> = d
            .iter()
            .filter_map(|b| match &b[0].0.data {
                EventData::LeaseRejected(r) => Some(r.field.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(fields, vec![Some("gpu_fraction".into()); 2]);
        settle(&mut s, Utc::now(), &Rules::default());
        assert_eq!(placed(&s), vec![Uuid::from_u128(2), Uuid::from_u128(3)]);
    }

    fn events_of(d: &Decisions) -> Vec<&EventData> {
        d.batches.iter().flatten().map(|(e, _)| &e.data).collect()
    }

    #[test]
    fn a_silent_node_is_lost_and_its_leases_move_where_there_is_room() {
        let t = Uuid::from_u128(1);
        let (l1, l2) = (Uuid::from_u128(2), Uuid::from_u128(3));
        let t0 = Utc::now();
        let mut s = given(vec![node("a", 2), node("b", 1), tenant(t, 8)]);
        s.apply(10, &env(request(l1, t, 2)));
        settle(&mut s, t0, &Rules::default());
        s.apply(5000, &env(request(l2, t, 1)));
        settle(&mut s, t0, &Rules::default());
        assert_eq!(where_is(&s, l1).0, "a");
        assert_eq!(where_is(&s, l2).0, "b");
        let rules = Rules::default();
        s.liveness_since = Some(t0);
        let s_ago = |secs: i64| t0 + Duration::seconds(secs);
        s.heard("a", s_ago(1) - Duration::milliseconds(7), s_ago(1));
        s.heard("b", s_ago(5), s_ago(5));
        // 3 s of silence is not yet lost.
        assert!(s.liveness_changes(s_ago(4), &rules).is_empty());
        let d = s.decide(s_ago(5), &rules);
        let events = events_of(&d);
        match events[0] {
            EventData::NodeLost(n) => {
                assert_eq!(n.node_id, "a");
                assert_eq!(n.last_heard_at, s_ago(1) - Duration::milliseconds(7));
                assert_eq!(n.silence_ms, 4000);
            }
            other => panic!("{other:?}"),
        }
        // b is full: the 2-GPU lease goes back to the queue, billed until
        // the node's last heartbeat.
        match events[1] {
            EventData::LeaseMigrated(m) => {
                assert_eq!((m.lease_id, m.from_node_id.as_str()), (l1, "a"));
                assert_eq!(m.from_gpu_indices, vec![0, 1]);
                assert_eq!(m.billing_ends_at, s_ago(1) - Duration::milliseconds(7));
                assert!(m.to.is_none());
            }
            other => panic!("{other:?}"),
        }
        settle(&mut s, s_ago(5), &rules);
        assert!(s.fleet.nodes["a"].lost.is_some());
        assert!(!s.fleet.holdings.contains_key(&l1));
        // Back in the queue, announced on the next pass like any request.
        assert_eq!(s.leases[&l1].status, Status::Requested);
        settle(&mut s, s_ago(5), &rules);
        assert!(
            matches!(&s.leases[&l1].status, Status::Queued { reason, .. } if reason.contains("largest node has 1")),
            "{:?}",
            s.leases[&l1].status
        );

        // A new node with room: the lease is placed there, never on a.
        s.apply(9000, &env(node("c", 2)));
        s.heard("b", s_ago(6), s_ago(6));
        s.heard("c", s_ago(6), s_ago(6));
        settle(&mut s, s_ago(6), &rules);
        assert_eq!(where_is(&s, l1).0, "c");

        // a is heard again: it rejoins and takes leases again.
        s.heard("a", s_ago(7), s_ago(7));
        let d = s.decide(s_ago(7), &rules);
        assert!(matches!(events_of(&d)[0], EventData::NodeRejoined(n) if n.node_id == "a"));
        settle(&mut s, s_ago(7), &rules);
        assert!(s.fleet.nodes["a"].lost.is_none());
    }

    fn health(node: &str, gpu: u32, to: GpuHealth, at: DateTime<Utc>) -> EventData {
        EventData::NodeGpuHealthChanged(NodeGpuHealthChanged {
            node_id: node.into(),
            gpu_index: gpu,
            gpu_uuid: format!("GPU-{node}-{gpu}"),
            from: GpuHealth::Healthy,
            to,
            reason: "test".into(),
            evidence: HealthEvidence::default(),
            at,
        })
    }

    #[test]
    fn unhealthy_gpus_shed_their_leases_and_degraded_ones_take_nothing_new() {
        let t = Uuid::from_u128(1);
        let (l1, l2) = (Uuid::from_u128(2), Uuid::from_u128(3));
        let t0 = Utc::now();
        let mut s = given(vec![node("a", 3), tenant(t, 8), request(l1, t, 1)]);
        settle(&mut s, t0, &Rules::default());
        let gpu = where_is(&s, l1).1[0];
        // Another GPU turns degraded: the next lease avoids it and l1's.
        let other = (0..3).find(|g| *g != gpu).unwrap();
        s.apply(9000, &env(health("a", other, GpuHealth::Degraded, t0)));
        s.apply(9001, &env(request(l2, t, 1)));
        settle(&mut s, t0, &Rules::default());
        let free = (0..3).find(|g| *g != gpu && *g != other).unwrap();
        assert_eq!(where_is(&s, l2).1, vec![free]);
        // l1's GPU fails: l1 must move, but the only healthy free GPU is
        // taken and the degraded one takes nothing: back to the queue.
        let failed_at = t0 + Duration::seconds(5);
        s.apply(
            9100,
            &env(health("a", gpu, GpuHealth::Unhealthy, failed_at)),
        );
        let d = s.decide(t0 + Duration::seconds(6), &Rules::default());
        match events_of(&d)[0] {
            EventData::LeaseMigrated(m) => {
                assert_eq!(m.lease_id, l1);
                assert_eq!(m.reason, format!("GPU {gpu} of node a unhealthy"));
                assert_eq!(m.billing_ends_at, failed_at);
                assert!(m.to.is_none());
            }
            other => panic!("{other:?}"),
        }
        settle(&mut s, t0 + Duration::seconds(6), &Rules::default());
        // The degraded GPU recovers: l1 goes there.
        s.apply(9200, &env(health("a", other, GpuHealth::Healthy, t0)));
        settle(&mut s, t0 + Duration::seconds(7), &Rules::default());
        assert_eq!(where_is(&s, l1).1, vec![other]);
    }

    #[test]
    fn a_cordoned_node_takes_nothing_new_and_a_drain_moves_its_leases() {
        let t = Uuid::from_u128(1);
        let (l1, l2) = (Uuid::from_u128(2), Uuid::from_u128(3));
        let t0 = Utc::now();
        let mut s = given(vec![node("a", 1), tenant(t, 8), request(l1, t, 1)]);
        settle(&mut s, t0, &Rules::default());
        s.apply(8000, &env(node("b", 2)));
        let cordon = |drain| {
            EventData::NodeCordoned(NodeCordoned {
                node_id: "b".into(),
                drain,
                reason: "maintenance".into(),
            })
        };
        s.apply(8001, &env(cordon(None)));
        s.apply(8002, &env(request(l2, t, 1)));
        settle(&mut s, t0, &Rules::default());
        assert!(
            !s.fleet.holdings.contains_key(&l2),
            "b is cordoned, a is full"
        );
        s.apply(
            8100,
            &env(EventData::NodeUncordoned(NodeUncordoned {
                node_id: "b".into(),
            })),
        );
        settle(&mut s, t0, &Rules::default());
        assert_eq!(where_is(&s, l2).0, "b");
        // Draining a with `move` sends l1 to b, billed until now.
        s.apply(
            8200,
            &env(EventData::NodeCordoned(NodeCordoned {
                node_id: "a".into(),
                drain: Some(DrainMode::Move),
                reason: "kernel upgrade".into(),
            })),
        );
        let now = t0 + Duration::seconds(9);
        let d = s.decide(now, &Rules::default());
        match events_of(&d)[0] {
            EventData::LeaseMigrated(m) => {
                assert_eq!((m.lease_id, m.reason.as_str()), (l1, "node a drained"));
                assert_eq!(m.billing_ends_at, now);
                assert_eq!(m.to.as_ref().unwrap().node_id, "b");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn observations_on_a_lease_count_toward_the_sequence_its_writes_expect() {
        let t = Uuid::from_u128(1);
        let l1 = Uuid::from_u128(2);
        let t0 = Utc::now();
        let mut s = given(vec![
            node("a", 1),
            node("b", 1),
            tenant(t, 8),
            request(l1, t, 1),
        ]);
        settle(&mut s, t0, &Rules::default());
        let from = where_is(&s, l1).0;
        // The node-agent reports the lease idle, on the lease's subject.
        s.apply(
            9000,
            &env(EventData::LeaseIdleDetected(lh_events::LeaseIdleDetected {
                lease_id: l1,
                node_id: from.clone(),
                idle_since: t0,
                window_s: 300,
                action: lh_events::IdleAction::Notify,
                at: t0,
            })),
        );
        s.apply(
            9001,
            &env(EventData::NodeCordoned(NodeCordoned {
                node_id: from,
                drain: Some(DrainMode::Move),
                reason: "test".into(),
            })),
        );
        let d = s.decide(t0, &Rules::default());
        let moved = d
            .batches
            .iter()
            .flatten()
            .find(|(e, _)| matches!(e.data, EventData::LeaseMigrated(_)))
            .expect("the lease moves");
        assert_eq!(moved.1, Expect::LastSubjectSequence(9000));
    }

    /// Lease `id`'s GPU 0 on `node` freed for being idle.
    fn suspended(id: Uuid, node: &str, at: DateTime<Utc>) -> EventData {
        EventData::LeaseSuspended(lh_events::LeaseSuspended {
            lease_id: id,
            node_id: node.into(),
            gpu_indices: vec![0],
            suspended_at: at,
            reason: "idle".into(),
        })
    }

    #[test]
    fn a_resumed_lease_over_quota_waits_instead_of_being_rejected() {
        let t = Uuid::from_u128(1);
        let (l1, l2) = (Uuid::from_u128(2), Uuid::from_u128(3));
        let t0 = Utc::now();
        let mut s = given(vec![node("a", 2), tenant(t, 1), request(l1, t, 1)]);
        settle(&mut s, t0, &Rules::default());
        let (node_id, _) = where_is(&s, l1);
        s.apply(9000, &env(suspended(l1, &node_id, t0)));
        s.apply(9001, &env(request(l2, t, 1)));
        settle(&mut s, t0, &Rules::default());
        assert!(s.fleet.holdings.contains_key(&l2), "the quota had room");
        s.apply(
            20_000,
            &env(EventData::LeaseResumeRequested(
                lh_events::LeaseResumeRequested { lease_id: l1 },
            )),
        );
        let d = s.decide(t0, &Rules::default());
        match events_of(&d)[..] {
            [EventData::LeaseQueued(q)] => {
                assert_eq!(q.lease_id, l1);
                assert!(q.reason.starts_with("quota exceeded"), "{}", q.reason);
            }
            ref other => panic!("{other:?}"),
        }
        settle(&mut s, t0, &Rules::default());
        assert!(
            s.decide(t0, &Rules::default()).batches.is_empty(),
            "said once"
        );
    }

    #[test]
    fn a_suspended_lease_holds_nothing_until_resumed_and_a_stop_ends_it() {
        let t = Uuid::from_u128(1);
        let l1 = Uuid::from_u128(2);
        let t0 = Utc::now();
        let mut s = given(vec![node("a", 1), tenant(t, 1), request(l1, t, 1)]);
        settle(&mut s, t0, &Rules::default());
        let (node_id, _) = where_is(&s, l1);
        s.apply(9000, &env(suspended(l1, &node_id, t0)));
        assert!(!s.fleet.holdings.contains_key(&l1), "GPU freed");
        assert!(
            s.decide(t0, &Rules::default()).batches.is_empty(),
            "not queued"
        );
        assert!(s.held_by_tenant().is_empty(), "counts nothing toward quota");
        s.apply(
            9001,
            &env(EventData::LeaseResumeRequested(
                lh_events::LeaseResumeRequested { lease_id: l1 },
            )),
        );
        settle(&mut s, t0, &Rules::default());
        assert_eq!(where_is(&s, l1).0, "a", "placed again");
        // Suspended again, then stopped: the scheduler ends it.
        s.apply(20_000, &env(suspended(l1, "a", t0)));
        s.apply(
            20_001,
            &env(EventData::LeaseStopRequested(LeaseStopRequested {
                lease_id: l1,
            })),
        );
        let d = s.decide(t0, &Rules::default());
        match events_of(&d)[..] {
            [EventData::LeaseEnded(e)] => assert_eq!(e.reason, EndReason::Stopped),
            ref other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_lost_node_s_lease_is_placed_again_in_the_same_decision() {
        let t = Uuid::from_u128(1);
        let l1 = Uuid::from_u128(2);
        let t0 = Utc::now();
        let mut s = given(vec![node("a", 1), tenant(t, 8), request(l1, t, 1)]);
        settle(&mut s, t0, &Rules::default());
        s.apply(8000, &env(node("b", 1)));
        s.liveness_since = Some(t0);
        s.heard("b", t0 + Duration::seconds(4), t0 + Duration::seconds(4));
        // a was never heard since the scheduler started.
        let d = s.decide(t0 + Duration::seconds(4), &Rules::default());
        let batch = &d.batches[1];
        match (&batch[0].0.data, &batch[1].0.data) {
            (EventData::LeaseMigrated(m), EventData::NodeGpusAllocated(n)) => {
                assert_eq!(
                    m.billing_ends_at, t0,
                    "never heard: billed until we started"
                );
                let to = m.to.as_ref().expect("room on b");
                assert_eq!((to.node_id.as_str(), n.node_id.as_str()), ("b", "b"));
                assert_eq!(to.gpus[0].uuid, "GPU-b-0");
            }
            other => panic!("{other:?}"),
        }
        settle(&mut s, t0 + Duration::seconds(4), &Rules::default());
        assert_eq!(where_is(&s, l1).0, "b");
        assert_eq!(s.leases[&l1].status, Status::Holding);
        // Nothing more to do: no second migration, no placement twice.
        let again = s.decide(t0 + Duration::seconds(4), &Rules::default());
        assert!(events_of(&again).is_empty(), "{:?}", events_of(&again));
    }

    #[test]
    fn mig_leases_get_instances_by_nvidia_rules_and_count_by_size() {
        let (t, u) = (Uuid::from_u128(1), Uuid::from_u128(9));
        let l = |i: u128| Uuid::from_u128(100 + i);
        let mut s = given(vec![
            node_mig("m", 1),
            node("a", 1),
            tenant_with(t, 1, Some(45), 1),
            tenant(u, 8),
            request_mig(l(1), t, "3g.20gb"),
            request_mig(l(2), t, "3g.20gb"),
            request_mig(l(3), t, "1g.5gb"),
            request(l(4), t, 1),
            request(l(5), u, 1),
            request_mig(l(6), u, "9g.99gb"),
        ]);
        let d = decide(&s).batches;
        let placed_events: Vec<&LeasePlaced> = d
            .iter()
            .filter_map(|b| match &b[0].0.data {
                EventData::LeasePlaced(p) => Some(p),
                _ => None,
            })
            .collect();
        let first = placed_events[0];
        assert_eq!((first.lease_id, first.node_id.as_str()), (l(1), "m"));
        assert_eq!(first.decision.policy, "mig-best-fit");
        assert_eq!(first.vram_gb_per_gpu, 20);
        assert_eq!(
            (first.gpus[0].milli, first.gpus[0].vram_gb),
            (Some(428), Some(20))
        );
        assert_eq!(
            first.gpus[0].mig_instance,
            Some(MigInstance {
                profile: "3g.20gb".into(),
                start: 4
            })
        );
        settle(&mut s, Utc::now(), &Rules::default());
        // The second 3g.20gb goes next to the first (slots 0-3); the 1g.5gb
        // finds no memory slice left and waits; the whole GPU would take the
        // tenant past its 1-GPU quota (856 milli held); the other tenant's
        // whole GPU goes to the GPU outside MIG mode.
        let inst = |s: &State, lease| s.fleet.mig_instances[&lease].clone();
        assert_eq!(inst(&s, l(2)).start, 0);
        assert_eq!(where_is(&s, l(2)), ("m".to_string(), vec![0]));
        assert_eq!(where_is(&s, l(5)), ("a".to_string(), vec![0]));
        assert!(!s.leases.contains_key(&l(4)), "rejected by quota");
        let reason = |s: &State, lease| match &s.leases[&lease].status {
            Status::Queued { reason, .. } => reason.clone(),
            other => panic!("{other:?}"),
        };
        assert!(reason(&s, l(3)).starts_with("waiting for capacity: no room for a 1g.5gb"));
        assert_eq!(reason(&s, l(6)), "A100-40GB has no MIG profile 9g.99gb");
        let gpu = &s.fleet.nodes["m"].gpus[0];
        assert_eq!((gpu.used_milli(), gpu.used_vram_gb()), (856, 40));

        // The first instance ends and is destroyed: the 1g.5gb fits now.
        s.apply(
            90_000,
            &env(EventData::LeaseEnded(LeaseEnded {
                lease_id: l(1),
                node_id: Some("m".into()),
                ended_at: Utc::now(),
                reason: EndReason::Stopped,
                exit_code: None,
            })),
        );
        settle(&mut s, Utc::now(), &Rules::default());
        assert_eq!(where_is(&s, l(3)), ("m".to_string(), vec![0]));
        assert!(inst(&s, l(3)).start >= 4, "in the slices the 3g.20gb freed");
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Whole(u32),
            Frac(u32, u32),
            Mig(&'static str),
            End(usize),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (1u32..=4).prop_map(Op::Whole),
                (1u32..=1000, 1u32..=40).prop_map(|(m, v)| Op::Frac(m, v)),
                proptest::sample::select(
                    lh_placement::mig::profiles("A100-40GB")
                        .iter()
                        .map(|p| p.name)
                        .collect::<Vec<_>>()
                )
                .prop_map(Op::Mig),
                any::<usize>().prop_map(Op::End),
            ]
        }

        /// Every GPU within 1000 milli and its VRAM; a whole GPU held by
        /// one lease and shared with none.
        fn check(s: &State) {
            let mut whole: HashMap<(String, u32), Uuid> = HashMap::new();
            let mut shared: HashMap<(String, u32), (u32, u32)> = HashMap::new();
            for (lease, (node, indices)) in &s.fleet.holdings {
                for &i in indices {
                    let key = (node.clone(), i);
                    match s.fleet.shares.get(lease) {
                        Some(&(m, v)) => {
                            let e = shared.entry(key).or_default();
                            e.0 += m;
                            e.1 += v;
                        }
                        None => {
                            assert!(whole.insert(key, *lease).is_none(), "GPU held twice");
                        }
                    }
                }
            }
            for (key, (m, v)) in &shared {
                assert!(!whole.contains_key(key), "whole and shared at once");
                assert!(*m <= 1000, "{key:?} over 1000 milli: {m}");
                assert!(*v <= 40, "{key:?} over its VRAM: {v}");
            }
            for n in s.fleet.nodes.values() {
                for g in &n.gpus {
                    assert!(g.used_milli() <= 1000 && g.used_vram_gb() <= g.vram_gb);
                    // MIG GPUs hold MIG instances only, laid out by NVIDIA's rules.
                    if g.mig {
                        assert!(g.held_by.is_none() && g.shares.iter().all(|x| x.mig.is_some()));
                    } else {
                        assert!(g.shares.iter().all(|x| x.mig.is_none()));
                    }
                    if g.mig {
                        let geometry = lh_placement::mig::geometry(&g.model).unwrap();
                        let instances = g
                            .shares
                            .iter()
                            .map(|x| {
                                let m = x.mig.as_ref().unwrap();
                                lh_placement::mig::Instance {
                                    profile: geometry.profile(&m.profile).unwrap(),
                                    start: m.start,
                                    lease: Some(x.lease_id),
                                    persistent: false,
                                }
                            })
                            .collect();
                        lh_placement::mig::MigLayout::from_instances(geometry, instances)
                            .expect("a valid MIG layout");
                    }
                }
            }
        }

        /// Applies `op` (a request of tenant `t` as `lease`, or the end of
        /// one live lease) and every decision that follows it.
        fn step(s: &mut State, seq: &mut u64, op: Op, lease: Uuid, t: Uuid, now: DateTime<Utc>) {
            let data = match op {
                Op::Whole(n) => request(lease, t, n),
                Op::Frac(m, v) => request_frac(lease, t, m, v),
                Op::Mig(p) => request_mig(lease, t, p),
                Op::End(i) => {
                    let mut live: Vec<Uuid> = s.leases.keys().copied().collect();
                    if live.is_empty() {
                        return;
                    }
                    live.sort();
                    EventData::LeaseEnded(LeaseEnded {
                        lease_id: live[i % live.len()],
                        node_id: None,
                        ended_at: now,
                        reason: EndReason::Stopped,
                        exit_code: None,
                    })
                }
            };
            *seq += 1;
            s.apply(*seq, &env(data));
            for batch in s.decide(now, &Rules::default()).batches {
                for (e, _) in batch {
                    *seq += 1;
                    s.apply(*seq, &e);
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            #[test]
            fn gpus_are_never_oversubscribed(ops in proptest::collection::vec(op(), 1..60)) {
                let t = Uuid::from_u128(1);
                let mut s = given(vec![node("a", 4), node("b", 2), node_mig("m", 2), tenant(t, 1000)]);
                let mut seq = 100u64;
                let now = Utc::now();
                for (k, op) in ops.into_iter().enumerate() {
                    let lease = Uuid::from_u128(1000 + k as u128);
                    step(&mut s, &mut seq, op, lease, t, now);
                    check(&s);
                }
            }

            #[test]
            fn quotas_are_never_exceeded(
                quotas in proptest::collection::vec((1u32..=4, proptest::option::of(5u32..=120)), 3),
                ops in proptest::collection::vec((0usize..3, op()), 1..60),
            ) {
                let tenants: Vec<Uuid> = (0..3).map(|i| Uuid::from_u128(10 + i)).collect();
                let mut events = vec![node("a", 4), node("b", 4), node_mig("m", 2)];
                for (t, (gpus, vram)) in tenants.iter().zip(&quotas) {
                    events.push(tenant_with(*t, *gpus, *vram, 1));
                }
                let mut s = given(events);
                let mut seq = 100u64;
                let now = Utc::now();
                for (k, (who, op)) in ops.into_iter().enumerate() {
                    let (lease, t) = (Uuid::from_u128(1000 + k as u128), tenants[who]);
                    step(&mut s, &mut seq, op, lease, t, now);
                    // What each tenant holds, from the fleet (not from the
                    // scheduler's own counters): whole GPUs at 1000 milli
                    // and their VRAM, shares and MIG instances by size.
                    let mut held: HashMap<Uuid, (u64, u64)> = HashMap::new();
                    for (lease, (node, indices)) in &s.fleet.holdings {
                        let tenant = s.leases[lease].tenant_id;
                        let h = held.entry(tenant).or_default();
                        match s.fleet.shares.get(lease) {
                            Some(&(m, v)) => {
                                h.0 += u64::from(m);
                                h.1 += u64::from(v);
                            }
                            None => {
                                for i in indices {
                                    let g = &s.fleet.nodes[node].gpus[*i as usize];
                                    h.0 += 1000;
                                    h.1 += u64::from(g.vram_gb);
                                }
                            }
                        }
                    }
                    for (t, (gpus, vram)) in tenants.iter().zip(&quotas) {
                        let (m, v) = held.get(t).copied().unwrap_or_default();
                        prop_assert!(m <= u64::from(*gpus) * 1000, "{t}: {m} milli over {gpus} GPUs");
                        if let Some(max) = vram {
                            prop_assert!(v <= u64::from(*max), "{t}: {v} GB over {max} GB");
                        }
                    }
                }
            }
        }
    }

    fn given(events: Vec<EventData>) -> State {
        let mut s = State::default();
        for (i, e) in events.into_iter().enumerate() {
            s.apply(i as u64 + 1, &env(e));
        }
        s
    }

    fn decide(s: &State) -> Decisions {
        s.decide(Utc::now(), &Rules::default())
    }

    /// Appends every decision to the state, as if the log had stored them.
    fn settle(s: &mut State, now: DateTime<Utc>, rules: &Rules) {
        // Past every sequence applied so far, like the log would be.
        let mut seq = s
            .leases
            .values()
            .map(|l| l.subject_sequence)
            .max()
            .unwrap_or(0)
            + 1_000;
        let d = s.decide(now, rules);
        for batch in &d.batches {
            for (e, _) in batch {
                seq += 1;
                s.apply(seq, e);
            }
        }
    }

    fn placed(s: &State) -> Vec<Uuid> {
        let mut v: Vec<Uuid> = s
            .leases
            .values()
            .filter(|l| l.status == Status::Holding)
            .map(|l| l.id)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn places_with_expectations_on_lease_and_node() {
        let t = Uuid::from_u128(1);
        let l = Uuid::from_u128(2);
        let s = given(vec![node("a", 8), tenant(t, 16), request(l, t, 2)]);
        let d = decide(&s).batches;
        assert_eq!(d.len(), 1);
        let batch = &d[0];
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[0].0.event_type, "lease.placed");
        assert_eq!(batch[0].1, Expect::LastSubjectSequence(3));
        assert_eq!(batch[1].0.event_type, "node.gpus_allocated");
        assert_eq!(batch[1].1, Expect::LastSubjectSequence(1));
    }

    #[test]
    fn quota_breach_is_rejected_with_the_field() {
        let t = Uuid::from_u128(1);
        let s = given(vec![
            node("a", 8),
            tenant(t, 2),
            request(Uuid::from_u128(2), t, 2),
            request(Uuid::from_u128(3), t, 1),
        ]);
        let d = decide(&s).batches;
        assert_eq!(d.len(), 2);
        assert_eq!(d[0][0].0.event_type, "lease.placed");
        match &d[1][0].0.data {
            EventData::LeaseRejected(r) => {
                assert_eq!(r.field.as_deref(), Some("gpus"));
                assert!(r.reason.contains("quota"), "{}", r.reason);
            }
            other => panic!("expected rejection, got {other:?}"),
        }
    }

    #[test]
    fn vram_quota_counts_gigabytes_not_devices() {
        let t = Uuid::from_u128(1);
        // 100 GB allows two 40 GB GPUs, not three.
        let mut s = given(vec![
            node("a", 8),
            tenant_with(t, 8, Some(100), 1),
            request(Uuid::from_u128(2), t, 2),
            request(Uuid::from_u128(3), t, 1),
        ]);
        settle(&mut s, Utc::now(), &Rules::default());
        assert_eq!(placed(&s), vec![Uuid::from_u128(2)]);
        assert!(!s.leases.contains_key(&Uuid::from_u128(3)), "rejected");
    }

    #[test]
    fn smaller_requests_backfill_around_a_waiting_one() {
        let t = Uuid::from_u128(1);
        let s = given(vec![
            node("a", 4),
            tenant(t, 100),
            request(Uuid::from_u128(2), t, 3),
            request(Uuid::from_u128(3), t, 2),
            request(Uuid::from_u128(4), t, 1),
        ]);
        let d = decide(&s).batches;
        let types: Vec<&str> = d.iter().map(|b| b[0].0.event_type.as_str()).collect();
        // 3 placed; 2 does not fit and queues; 1 fits around it.
        assert_eq!(types, vec!["lease.placed", "lease.queued", "lease.placed"]);
        let mut s = s;
        settle(&mut s, Utc::now(), &Rules::default());
        assert_eq!(placed(&s), vec![Uuid::from_u128(2), Uuid::from_u128(4)]);
        match &s.leases[&Uuid::from_u128(3)].status {
            Status::Queued { position, .. } => assert_eq!(*position, 1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_starving_lease_stops_backfill() {
        let t = Uuid::from_u128(1);
        let long_ago = Utc::now() - Duration::hours(1);
        let mut s = State::default();
        s.apply(1, &env(node("a", 4)));
        s.apply(2, &env(tenant(t, 100)));
        s.apply(3, &env(request(Uuid::from_u128(2), t, 3)));
        s.apply(4, &env_at(request(Uuid::from_u128(3), t, 2), long_ago));
        s.apply(5, &env(request(Uuid::from_u128(4), t, 1)));
        settle(&mut s, Utc::now(), &Rules::default());
        // Lease 3 (2 GPUs) has waited an hour: lease 4 may not take the last GPU.
        assert_eq!(placed(&s), vec![Uuid::from_u128(2)]);
    }

    #[test]
    fn on_demand_goes_before_spot_and_priority_within_a_tenant() {
        let t = Uuid::from_u128(1);
        let s = given(vec![
            tenant(t, 100),
            request_full(Uuid::from_u128(10), t, 1, Tier::Spot, 0),
            request_full(Uuid::from_u128(11), t, 1, Tier::Basic, 0),
            request_full(Uuid::from_u128(12), t, 1, Tier::Basic, 5),
        ]);
        assert_eq!(
            s.queue_order(),
            vec![
                Uuid::from_u128(12),
                Uuid::from_u128(11),
                Uuid::from_u128(10)
            ]
        );
    }

    #[test]
    fn weighted_fair_share_interleaves_tenants() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let mut events = vec![tenant_with(a, 100, None, 1), tenant_with(b, 100, None, 2)];
        for i in 0..6 {
            events.push(request(Uuid::from_u128(100 + i), a, 1));
        }
        for i in 0..6 {
            events.push(request(Uuid::from_u128(200 + i), b, 1));
        }
        let s = given(events);
        let order: Vec<Uuid> = s.queue_order();
        let owners: String = order
            .iter()
            .map(|id| {
                if s.leases[id].tenant_id == a {
                    'a'
                } else {
                    'b'
                }
            })
            .collect();
        // B has twice the weight: it gets about two leases per one of A's.
        assert_eq!(&owners[..9], "abbabbabb");
    }

    #[test]
    fn a_queued_lease_is_placed_when_capacity_frees_and_stop_cancels_waiting() {
        let t = Uuid::from_u128(1);
        let (a, b, c) = (Uuid::from_u128(2), Uuid::from_u128(3), Uuid::from_u128(4));
        let mut s = given(vec![
            node("a", 2),
            tenant(t, 100),
            request(a, t, 2),
            request(b, t, 2),
        ]);
        settle(&mut s, Utc::now(), &Rules::default());
        assert!(matches!(s.leases[&b].status, Status::Queued { .. }));
        s.apply(
            101,
            &env(EventData::LeaseEnded(LeaseEnded {
                lease_id: a,
                node_id: Some("a".into()),
                ended_at: Utc::now(),
                reason: EndReason::Stopped,
                exit_code: None,
            })),
        );
        s.apply(102, &env(request(c, t, 1)));
        s.apply(
            103,
            &env(EventData::LeaseStopRequested(LeaseStopRequested {
                lease_id: c,
            })),
        );
        let d = decide(&s).batches;
        assert_eq!(d[0][0].0.event_type, "lease.placed");
        assert_eq!(d[1][0].0.event_type, "lease.ended");
    }

    #[test]
    fn two_placements_on_one_node_chain_their_node_expectations() {
        let t = Uuid::from_u128(1);
        let mut s = given(vec![
            node("a", 8),
            tenant(t, 100),
            request(Uuid::from_u128(2), t, 1),
            request(Uuid::from_u128(3), t, 1),
        ]);
        let mut d = decide(&s).batches;
        assert_eq!(d.len(), 2);
        // The first expects the node at its registration (sequence 1).
        s.expect_current(&mut d[0]);
        assert_eq!(d[0][1].1, Expect::LastSubjectSequence(1));
        // Once the first is stored at 10 and 11, the second expects 11.
        s.apply(10, &d[0][0].0);
        s.apply(11, &d[0][1].0);
        s.expect_current(&mut d[1]);
        assert_eq!(d[1][1].1, Expect::LastSubjectSequence(11));
        let indices: Vec<u32> = d
            .iter()
            .filter_map(|b| match &b[1].0.data {
                EventData::NodeGpusAllocated(a) => Some(a.allocations[0].gpu_indices[0]),
                _ => None,
            })
            .collect();
        assert_eq!(indices, vec![0, 1], "distinct GPUs");
    }

    #[test]
    fn same_state_same_decision() {
        let t = Uuid::from_u128(1);
        let s = given(vec![
            node("b", 8),
            node("a", 8),
            tenant(t, 16),
            request(Uuid::from_u128(2), t, 2),
        ]);
        let now = Utc::now();
        let flat = |d: Decisions| -> Vec<(Uuid, EventData, Expect)> {
            d.batches
                .into_iter()
                .flatten()
                .map(|(e, x)| (e.id, e.data, x))
                .collect()
        };
        assert_eq!(
            flat(s.decide(now, &Rules::default())),
            flat(s.decide(now, &Rules::default()))
        );
    }

    fn started(lease: Uuid, at: DateTime<Utc>) -> EventData {
        EventData::LeaseStarted(LeaseStarted {
            lease_id: lease,
            node_id: "a".into(),
            started_at: at,
        })
    }

    #[test]
    fn on_demand_preempts_the_cheapest_old_enough_spot_leases() {
        let (t, now) = (Uuid::from_u128(1), Utc::now());
        let (old_small, old_big, young) = (
            Uuid::from_u128(10),
            Uuid::from_u128(11),
            Uuid::from_u128(12),
        );
        let mut s = given(vec![
            node("a", 4),
            tenant(t, 100),
            request_full(old_big, t, 2, Tier::Spot, 0),
            request_full(old_small, t, 1, Tier::Spot, 0),
            request_full(young, t, 1, Tier::Spot, 0),
        ]);
        settle(&mut s, now, &Rules::default());
        s.apply(5050, &env(started(old_big, now - Duration::minutes(30))));
        s.apply(5051, &env(started(old_small, now - Duration::minutes(20))));
        s.apply(5052, &env(started(young, now - Duration::minutes(1))));
        let on_demand = Uuid::from_u128(20);
        s.apply(5053, &env(request(on_demand, t, 1)));
        let d = s.decide(now, &Rules::default()).batches;
        let notices: Vec<&LeasePreemptionNoticed> = d
            .iter()
            .flatten()
            .filter_map(|(e, _)| match &e.data {
                EventData::LeasePreemptionNoticed(n) => Some(n),
                _ => None,
            })
            .collect();
        // One GPU is needed: the 1-GPU lease is cheapest; the young one is exempt.
        assert_eq!(notices.len(), 1);
        assert_eq!(notices[0].lease_id, old_small);
        assert_eq!(notices[0].preempted_for, on_demand);
        assert_eq!(notices[0].deadline, now + Duration::seconds(120));
        // Once noticed, nothing is preempted twice.
        for batch in &d {
            for (e, _) in batch {
                s.apply(5060, e);
            }
        }
        let again = s.decide(now, &Rules::default()).batches;
        assert!(again
            .iter()
            .flatten()
            .all(|(e, _)| e.event_type != "lease.preemption_noticed"));
        // The victim ends at its deadline: the on-demand lease gets the GPU.
        s.apply(
            70,
            &env(EventData::LeaseEnded(LeaseEnded {
                lease_id: old_small,
                node_id: Some("a".into()),
                ended_at: now,
                reason: EndReason::Preempted,
                exit_code: None,
            })),
        );
        settle(&mut s, now, &Rules::default());
        assert_eq!(s.leases[&on_demand].status, Status::Holding);
    }

    #[test]
    fn spot_never_preempts_and_young_spot_is_safe() {
        let (t, now) = (Uuid::from_u128(1), Utc::now());
        let young = Uuid::from_u128(10);
        let mut s = given(vec![
            node("a", 1),
            tenant(t, 100),
            request_full(young, t, 1, Tier::Spot, 0),
        ]);
        settle(&mut s, now, &Rules::default());
        s.apply(5050, &env(started(young, now - Duration::minutes(9))));
        s.apply(
            5051,
            &env(request_full(Uuid::from_u128(11), t, 1, Tier::Spot, 0)),
        );
        s.apply(5052, &env(request(Uuid::from_u128(12), t, 1)));
        let d = s.decide(now, &Rules::default()).batches;
        assert!(d
            .iter()
            .flatten()
            .all(|(e, _)| e.event_type != "lease.preemption_noticed"));
    }
}
