//! One decision pass over the state.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use lh_bus::Expect;
use lh_events::{
    derived_id, Actor, EndReason, Envelope, EventData, LeaseEnded, LeasePlaced,
    LeasePreemptionNoticed, LeaseQueued, LeaseRejected, Tier,
};

use super::*;
use crate::planner::{self, Planner};

impl State {
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
