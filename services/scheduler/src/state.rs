//! The scheduler's view of the world and its decisions, as pure functions:
//! [`State::apply`] folds one stored event in, [`State::decide`] says what
//! to append next. No I/O and no clock: `now` comes in as an argument.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use lh_bus::Expect;
use lh_domain::fleet::Fleet;
use lh_domain::placement::{self, Request, Unplaceable};
use lh_events::{
    derived_id, Actor, AssignedGpu, Decision, EndReason, Envelope, EventData, LeaseEnded,
    LeasePlaced, LeaseQueued, LeaseRejected, NodeGpusAllocated, Quota, Tier,
};
use uuid::Uuid;

pub const SERVICE: &str = "lh-scheduler";

#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    Requested,
    Queued {
        reason: String,
    },
    /// Placed or running: holds GPUs until it ends.
    Holding,
}

#[derive(Debug, Clone)]
pub struct Lease {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub gpus: u32,
    pub gpu_model: String,
    pub tier: Tier,
    pub status: Status,
    pub stop_requested: bool,
    /// Sequence of `lease.requested`: first come, first served.
    pub requested_sequence: u64,
    /// Last stream sequence on this lease's subject.
    pub subject_sequence: u64,
    pub correlation_id: Uuid,
    pub request_event_id: Uuid,
}

#[derive(Debug, Clone, Default)]
pub struct State {
    pub fleet: Fleet,
    /// Live leases only: ended and rejected ones are dropped.
    pub leases: HashMap<Uuid, Lease>,
    pub quotas: HashMap<Uuid, Quota>,
    /// Leases waiting for a decision, by request sequence.
    waiting: BTreeMap<u64, Uuid>,
}

/// One decision: events appended together as one atomic batch.
pub type Batch = Vec<(Envelope, Expect)>;

impl State {
    pub fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        let data = &envelope.data;
        self.fleet.apply(sequence, data);
        match data {
            EventData::TenantCreated(e) => {
                self.quotas.insert(e.tenant_id, e.quota);
            }
            EventData::LeaseRequested(e) => {
                self.leases.entry(e.lease_id).or_insert_with(|| Lease {
                    id: e.lease_id,
                    tenant_id: e.tenant_id,
                    gpus: e.gpus,
                    gpu_model: e.gpu_model.clone(),
                    tier: e.tier,
                    status: Status::Requested,
                    stop_requested: false,
                    requested_sequence: sequence,
                    subject_sequence: sequence,
                    correlation_id: envelope.correlation_id,
                    request_event_id: envelope.id,
                });
                self.waiting.insert(sequence, e.lease_id);
            }
            EventData::LeaseQueued(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.status = Status::Queued {
                        reason: e.reason.clone(),
                    };
                }
            }
            EventData::LeasePlaced(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.status = Status::Holding;
                    let key = l.requested_sequence;
                    self.waiting.remove(&key);
                }
            }
            EventData::LeaseStopRequested(e) => {
                if let Some(l) = self.lease_at(e.lease_id, sequence) {
                    l.stop_requested = true;
                }
            }
            EventData::LeaseStarted(e) => {
                self.lease_at(e.lease_id, sequence);
            }
            EventData::LeaseEnded(e) => self.forget(e.lease_id),
            EventData::LeaseRejected(e) => self.forget(e.lease_id),
            _ => {}
        }
    }

    fn lease_at(&mut self, lease_id: Uuid, sequence: u64) -> Option<&mut Lease> {
        let lease = self.leases.get_mut(&lease_id)?;
        lease.subject_sequence = lease.subject_sequence.max(sequence);
        Some(lease)
    }

    fn forget(&mut self, lease_id: Uuid) {
        if let Some(l) = self.leases.remove(&lease_id) {
            self.waiting.remove(&l.requested_sequence);
        }
    }

    pub fn waiting_count(&self) -> usize {
        self.waiting.len()
    }

    fn gpus_held_by_tenant(&self) -> HashMap<Uuid, u32> {
        let mut held = HashMap::new();
        for l in self.leases.values().filter(|l| l.status == Status::Holding) {
            *held.entry(l.tenant_id).or_default() += l.gpus;
        }
        held
    }

    /// What to append now, in request order. Each batch assumes the ones
    /// before it were stored; after a conflict the caller re-reads the log
    /// and asks again. A node takes at most one placement per pass (the
    /// next one's expected node sequence is only known once the first is
    /// stored), so the pass stops there and `more` tells the caller to
    /// decide again right after appending.
    pub fn decide(&self, now: DateTime<Utc>) -> Decisions {
        let mut scratch = self.fleet.clone();
        let mut touched_nodes: Vec<String> = Vec::new();
        let mut held = self.gpus_held_by_tenant();
        let mut queued_per_model: HashMap<&str, u32> = HashMap::new();
        let mut out = Vec::new();
        for lease_id in self.waiting.values() {
            let Some(lease) = self.leases.get(lease_id) else {
                continue;
            };
            let event = |data: EventData, step: &str| {
                let mut env = Envelope::new(Actor::Service(SERVICE.into()), now, data).with_id(
                    derived_id(&[
                        step,
                        &lease.id.to_string(),
                        &lease.subject_sequence.to_string(),
                    ]),
                );
                env.correlation_id = lease.correlation_id;
                env.causation_id = Some(lease.request_event_id);
                env.tenant_id = Some(lease.tenant_id);
                env
            };
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
            let Some(quota) = self.quotas.get(&lease.tenant_id) else {
                let rejected = EventData::LeaseRejected(LeaseRejected {
                    lease_id: lease.id,
                    reason: "unknown tenant".into(),
                    field: None,
                });
                out.push(vec![(event(rejected, "lease.rejected"), expect_lease)]);
                continue;
            };
            let tenant_held = held.get(&lease.tenant_id).copied().unwrap_or(0);
            if tenant_held + lease.gpus > quota.max_gpus {
                let rejected = EventData::LeaseRejected(LeaseRejected {
                    lease_id: lease.id,
                    reason: format!(
                        "quota exceeded: tenant holds {tenant_held} GPUs, asks for {} more, quota is {}",
                        lease.gpus, quota.max_gpus
                    ),
                    field: Some("gpus".into()),
                });
                out.push(vec![(event(rejected, "lease.rejected"), expect_lease)]);
                continue;
            }
            let request = Request {
                gpus: lease.gpus,
                gpu_model: lease.gpu_model.clone(),
            };
            match placement::best_fit(scratch.nodes.values(), &request) {
                Ok(p) if touched_nodes.contains(&p.node_id) => {
                    return Decisions {
                        batches: out,
                        more: true,
                    };
                }
                Ok(p) => {
                    touched_nodes.push(p.node_id.clone());
                    let indices: Vec<u32> = p.gpus.iter().map(|g| g.index).collect();
                    let node_seq = scratch.node_sequence.get(&p.node_id).copied().unwrap_or(0);
                    let placed = EventData::LeasePlaced(LeasePlaced {
                        lease_id: lease.id,
                        node_id: p.node_id.clone(),
                        zone: p.zone.clone(),
                        gpu_model: lease.gpu_model.clone(),
                        vram_gb_per_gpu: p.gpus.first().map(|g| g.vram_gb).unwrap_or(0),
                        gpus: p
                            .gpus
                            .iter()
                            .map(|g| AssignedGpu {
                                index: g.index,
                                uuid: g.uuid.clone(),
                            })
                            .collect(),
                        decision: Decision {
                            policy: placement::POLICY_BEST_FIT.into(),
                            policy_version: placement::POLICY_VERSION,
                            candidates: p.candidates,
                            winner_score: p.winner_score,
                            runner_up_score: p.runner_up_score,
                        },
                    });
                    let allocated = EventData::NodeGpusAllocated(NodeGpusAllocated {
                        node_id: p.node_id.clone(),
                        lease_id: lease.id,
                        gpu_indices: indices.clone(),
                    });
                    let placed_env = event(placed, "lease.placed");
                    let mut alloc_env = event(allocated, "node.gpus_allocated");
                    alloc_env.causation_id = Some(placed_env.id);
                    // Plan the rest of this pass on top of this placement.
                    scratch.apply(u64::MAX, &alloc_env.data);
                    *held.entry(lease.tenant_id).or_default() += lease.gpus;
                    out.push(vec![
                        (placed_env, expect_lease),
                        (alloc_env, Expect::LastSubjectSequence(node_seq)),
                    ]);
                }
                Err(why) => {
                    let position = queued_per_model.entry(&lease.gpu_model).or_default();
                    *position += 1;
                    let reason = why.reason(&request);
                    let already =
                        matches!(&lease.status, Status::Queued { reason: r } if *r == reason);
                    if !already {
                        let queued = EventData::LeaseQueued(LeaseQueued {
                            lease_id: lease.id,
                            reason,
                            position: *position,
                        });
                        out.push(vec![(event(queued, "lease.queued"), expect_lease)]);
                    }
                    if matches!(why, Unplaceable::Busy { .. }) {
                        // Keep strict order per model: nothing smaller jumps a
                        // waiting lease of the same model for now (backfill
                        // comes with the queueing rules of a later issue).
                        scratch.nodes.values_mut().for_each(|n| {
                            n.gpus
                                .iter_mut()
                                .filter(|g| g.model == lease.gpu_model && g.held_by.is_none())
                                .for_each(|g| g.held_by = Some(lease.id));
                        });
                    }
                }
            }
        }
        Decisions {
            batches: out,
            more: false,
        }
    }
}

/// The outcome of one decision pass.
#[derive(Debug, Default)]
pub struct Decisions {
    pub batches: Vec<Batch>,
    /// The pass stopped early: decide again once these are appended.
    pub more: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::*;

    fn env(data: EventData) -> Envelope {
        Envelope::new(Actor::Admin, Utc::now(), data)
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
                })
                .collect(),
        })
    }

    fn tenant(id: Uuid, max_gpus: u32) -> EventData {
        EventData::TenantCreated(TenantCreated {
            tenant_id: id,
            name_sealed: String::new(),
            email_sealed: String::new(),
            api_key_sha256: String::new(),
            quota: Quota { max_gpus },
        })
    }

    fn request(lease: Uuid, tenant: Uuid, gpus: u32) -> EventData {
        EventData::LeaseRequested(LeaseRequested {
            lease_id: lease,
            tenant_id: tenant,
            gpus,
            gpu_model: "A100-40GB".into(),
            tier: Tier::Basic,
            idempotency_key: None,
        })
    }

    fn given(events: Vec<EventData>) -> State {
        let mut s = State::default();
        for (i, e) in events.into_iter().enumerate() {
            s.apply(i as u64 + 1, &env(e));
        }
        s
    }

    #[test]
    fn places_with_expectations_on_lease_and_node() {
        let t = Uuid::from_u128(1);
        let l = Uuid::from_u128(2);
        let s = given(vec![node("a", 8), tenant(t, 16), request(l, t, 2)]);
        let d = s.decide(Utc::now()).batches;
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
        let d = s.decide(Utc::now()).batches;
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
    fn no_gpu_is_planned_twice_in_one_pass_and_the_rest_queue() {
        let t = Uuid::from_u128(1);
        let s = given(vec![
            node("a", 4),
            tenant(t, 100),
            request(Uuid::from_u128(2), t, 3),
            request(Uuid::from_u128(3), t, 2),
            request(Uuid::from_u128(4), t, 1),
        ]);
        let d = s.decide(Utc::now()).batches;
        let types: Vec<&str> = d.iter().map(|b| b[0].0.event_type.as_str()).collect();
        assert_eq!(types, vec!["lease.placed", "lease.queued", "lease.queued"]);
        match &d[2][0].0.data {
            EventData::LeaseQueued(q) => assert_eq!(q.position, 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn queued_lease_is_placed_when_capacity_frees_and_stop_cancels_waiting() {
        let t = Uuid::from_u128(1);
        let (a, b, c) = (Uuid::from_u128(2), Uuid::from_u128(3), Uuid::from_u128(4));
        let mut s = given(vec![
            node("a", 2),
            tenant(t, 100),
            request(a, t, 2),
            request(b, t, 2),
        ]);
        for batch in s.decide(Utc::now()).batches {
            for (e, _) in batch {
                s.apply(100, &e);
            }
        }
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
        let d = s.decide(Utc::now()).batches;
        assert_eq!(d[0][0].0.event_type, "lease.placed");
        assert_eq!(d[1][0].0.event_type, "lease.ended");
    }

    #[test]
    fn one_placement_per_node_per_pass() {
        let t = Uuid::from_u128(1);
        let s = given(vec![
            node("a", 8),
            tenant(t, 100),
            request(Uuid::from_u128(2), t, 1),
            request(Uuid::from_u128(3), t, 1),
        ]);
        let d = s.decide(Utc::now());
        assert_eq!(d.batches.len(), 1);
        assert!(d.more);
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
        let a: Vec<_> = s
            .decide(now)
            .batches
            .into_iter()
            .flatten()
            .map(|(e, x)| (e.id, e.data, x))
            .collect();
        let b: Vec<_> = s
            .decide(now)
            .batches
            .into_iter()
            .flatten()
            .map(|(e, x)| (e.id, e.data, x))
            .collect();
        assert_eq!(a, b);
    }
}
