//! One decision pass over the state: liveness, migrations, then the queue,
//! in order, each lease placed, refused, or told why it waits.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use lh_events::{EndReason, EventData, Expect, LeaseEnded, LeaseQueued, LeaseRejected};
use lh_placement::{Pending, ShapeMix};
use lh_service::decider::Batch;
use uuid::Uuid;

use super::spot::NoZone;
use super::{
    lease_event, notice_event, placement_events, plan_gang_preemption, plan_preemption,
    quota_breach, reserve_for, why_pending, Decisions, FleetView, Lease, PlannedFleet, Rules,
    State, Status, EXACT_POSITIONS,
};
use crate::planner::{self, Chosen, Planner};

/// Why a suspended tenant's lease waits.
pub const SUSPENDED_TENANT: &str = "the tenant is suspended; its leases wait until it is resumed";

/// What a decision pass plans on: the fleet and the tenants' holdings as if
/// every decision before were stored, and the decisions so far.
pub(super) struct Pass<'a> {
    pub(super) now: DateTime<Utc>,
    rules: &'a Rules,
    pub(super) planned: PlannedFleet<'a>,
    /// `(milli, VRAM GB)` each tenant's leases use.
    tenant_usage: HashMap<Uuid, (u64, u64)>,
    /// The live leases' shapes, which the placement policy measures
    /// fragmentation against.
    shape_mix: ShapeMix,
    /// Where the pass gets its placement engine.
    engines: &'a mut dyn EngineSource,
    /// Whether the engine holds `planned` as it is: brought up to date on
    /// first use, and again after the pass reserves GPUs outside it, so
    /// that the next use sees them.
    synced: bool,
    /// Queue position per GPU model.
    positions: HashMap<&'a str, u32>,
    pub(super) out: Vec<Batch>,
}

impl Pass<'_> {
    pub(super) fn planner(&mut self) -> &mut Planner {
        if !self.synced {
            self.synced = true;
            return self.engines.sync(&self.planned, &self.shape_mix);
        }
        self.engines.synced()
    }

    /// Whether only the leases on nodes the watch files as troubled may
    /// have to move (see [`EngineSource::trusts_node_watch`]).
    pub(super) fn trusts_node_watch(&self) -> bool {
        self.engines.trusts_node_watch()
    }
}

/// Where a decision pass gets its placement engine, and whether it trusts
/// the node watch to say which leases may have to move. The scheduler
/// keeps its engine from pass to pass ([`PlacementEngineCache`]) and trusts
/// the watch. Both are shortcuts: a pass that builds its engine anew at
/// every sync and looks at every held lease must decide the same, and the
/// tests hold the scheduler to that.
pub(super) trait EngineSource {
    /// The engine brought up to date with `planned`, deciding as
    /// [`Planner::new`] over it would (see [`Planner::sync`]).
    fn sync(&mut self, planned: &PlannedFleet, shape_mix: &ShapeMix) -> &mut Planner;

    /// The engine the last [`EngineSource::sync`] gave.
    fn synced(&mut self) -> &mut Planner;

    /// Whether only leases on the nodes the watch files as troubled are
    /// looked at for a move, rather than every held lease.
    fn trusts_node_watch(&self) -> bool {
        true
    }
}

/// The placement engine a decision pass leaves for the next (see
/// [`Planner::sync`]). Whoever runs the passes holds it, outside the
/// state: the state stays plain data, and a copy of it decides the same
/// with a cache of its own, or an empty one.
///
/// The kept engine belongs to the fleet it was synced with: a holder that
/// replaces the state ([`State::restore`]) must [`clear`](Self::clear) it,
/// and so must one that catches a panic from [`State::decide`], which may
/// leave the engine out of step with the fleet.
#[derive(Default)]
pub struct PlacementEngineCache {
    planner: Option<Planner>,
}

impl PlacementEngineCache {
    /// Forgets the kept engine: the fleet under it was replaced.
    pub fn clear(&mut self) {
        self.planner = None;
    }
}

impl EngineSource for PlacementEngineCache {
    fn sync(&mut self, planned: &PlannedFleet, shape_mix: &ShapeMix) -> &mut Planner {
        Planner::sync(&mut self.planner, planned, shape_mix)
    }

    fn synced(&mut self) -> &mut Planner {
        self.planner
            .as_mut()
            .expect("a synced pass holds an engine")
    }
}

impl State {
    /// What to append now, in queue order. Each batch assumes the ones
    /// before it were stored; after a conflict the caller re-reads the log
    /// and asks again. A second placement on a node in one pass expects the
    /// node's sequence after the first: the decide loop
    /// (`lh_service::decider`) sets it from the sequence the first one got.
    /// `engine` is the one the last pass left, and keeps this one's.
    pub fn decide(
        &self,
        now: DateTime<Utc>,
        rules: &Rules,
        engine: &mut PlacementEngineCache,
    ) -> Decisions {
        self.decide_with(now, rules, engine)
    }

    /// [`State::decide`] with its placement engine from `engines`.
    pub(super) fn decide_with(
        &self,
        now: DateTime<Utc>,
        rules: &Rules,
        engines: &mut dyn EngineSource,
    ) -> Decisions {
        let shape_mix = planner::shape_mix(
            self.leases
                .values()
                .map(|l| (l.shape(), l.gpu_model.as_str())),
        );
        let mut pass = Pass {
            now,
            rules,
            planned: PlannedFleet::new(&self.fleet),
            tenant_usage: self.tenant_usage(),
            shape_mix,
            engines,
            synced: false,
            positions: HashMap::new(),
            out: Vec::new(),
        };
        self.decide_liveness(now, rules, &mut pass.planned, &mut pass.out);
        self.decide_migrations(&mut pass);
        self.end_stopped_suspended(&mut pass);
        self.notice_outbid(&mut pass);
        pass.out.extend(self.recovery_requests(now));
        for lease_id in self.queue_order() {
            let lease = &self.leases[&lease_id];
            if self.refuse(&mut pass, lease) {
                continue;
            }
            let zones = match self.zones_for(&pass.planned, lease) {
                Ok(zones) => zones,
                Err(NoZone::Constrained(reason) | NoZone::Outbid(reason)) => {
                    let position = next_position(&mut pass, lease);
                    self.announce_wait(&mut pass, lease, reason, position);
                    continue;
                }
            };
            match self.place_in(&mut pass, lease, zones.as_deref()) {
                Ok(members) => place_one(&mut pass, lease, &members),
                Err(pending) => self.wait(&mut pass, lease, pending.as_ref(), zones.as_deref()),
            }
        }
        Decisions { batches: pass.out }
    }

    /// Places `lease` in one of `zones` (`None`: any), its preferred zone
    /// first when it has one there: on one node, or as a gang on several
    /// (the members in node-rank order).
    fn place_in(
        &self,
        pass: &mut Pass,
        lease: &Lease,
        zones: Option<&[String]>,
    ) -> Result<Vec<Chosen>, Option<Pending>> {
        let needs_isolation = self.needs_isolation(lease);
        if pass.planner().spans_nodes(lease.shape()) {
            // A gang that ran restarts in place where its nodes still
            // have room for their parts: its ranks keep their nodes.
            let in_place = match lease.members.as_slice() {
                [] => None,
                members => pass.planner().place_gang_on(
                    lease.shape(),
                    &lease.gpu_model,
                    needs_isolation,
                    zones.unwrap_or_default(),
                    members,
                ),
            };
            if let Some(members) = in_place {
                return Ok(members);
            }
            return pass.planner().place_gang(
                lease.shape(),
                &lease.gpu_model,
                needs_isolation,
                zones.unwrap_or_default(),
            );
        }
        let preferred = lease
            .preferred_zone
            .as_ref()
            .filter(|z| zones.is_none_or(|allowed| allowed.contains(z)));
        if let Some(zone) = preferred {
            let first = pass.planner().place(
                lease.shape(),
                &lease.gpu_model,
                needs_isolation,
                std::slice::from_ref(zone),
            );
            if let Ok(chosen) = first {
                return Ok(vec![chosen]);
            }
        }
        pass.planner()
            .place(
                lease.shape(),
                &lease.gpu_model,
                needs_isolation,
                zones.unwrap_or_default(),
            )
            .map(|chosen| vec![chosen])
    }

    /// Notices every running spot lease whose bid the price outgrew.
    fn notice_outbid(&self, pass: &mut Pass) {
        let deadline = pass.now + pass.rules.preemption_notice;
        for victim in self.outbid() {
            let Some(node_id) = &victim.node_id else {
                continue;
            };
            let notice = notice_event(None, victim, node_id, deadline, pass.now);
            pass.out.push(vec![(
                notice,
                Expect::LastSubjectSequence(victim.subject_sequence),
            )]);
        }
    }

    /// A suspended lease holds nothing: a stop ends it here.
    fn end_stopped_suspended(&self, pass: &mut Pass) {
        let mut stopped: Vec<&Lease> = self
            .leases
            .values()
            .filter(|l| l.status == Status::Suspended && l.stop_requested)
            .collect();
        stopped.sort_by_key(|l| l.requested_sequence);
        for lease in stopped {
            let ended = ended(lease, pass.now, EndReason::Stopped);
            pass.out.push(vec![(
                lease_event(lease, pass.now, ended),
                expect_lease(lease),
            )]);
        }
    }

    /// Decides `lease` without the engine when it must not be placed: it was
    /// cancelled, its tenant is unknown or suspended, or it breaks a quota. `false` when
    /// it may be placed.
    fn refuse(&self, pass: &mut Pass, lease: &Lease) -> bool {
        let now = pass.now;
        let decided = |data: EventData| vec![(lease_event(lease, now, data), expect_lease(lease))];
        if lease.stop_requested {
            pass.out
                .push(decided(ended(lease, now, EndReason::Cancelled)));
            return true;
        }
        let Some(tenant) = self.tenants.get(&lease.tenant_id) else {
            pass.out
                .push(decided(EventData::LeaseRejected(LeaseRejected {
                    lease_id: lease.id,
                    reason: "unknown tenant".into(),
                    field: None,
                })));
            return true;
        };
        // Told once why it waits; the same reason again says nothing new.
        let hold = |out: &mut Vec<_>, reason: String| {
            let unchanged =
                matches!(&lease.status, Status::Queued { reason: r, .. } if *r == reason);
            if !unchanged {
                out.push(decided(EventData::LeaseQueued(LeaseQueued {
                    lease_id: lease.id,
                    reason,
                    position: 0,
                })));
            }
        };
        if tenant.suspended {
            hold(&mut pass.out, SUSPENDED_TENANT.to_string());
            return true;
        }
        let (used_milli, used_vram_gb) = pass
            .tenant_usage
            .get(&lease.tenant_id)
            .copied()
            .unwrap_or((0, 0));
        let Some(reason) = quota_breach(&tenant.quota, used_milli, used_vram_gb, lease) else {
            return false;
        };
        if lease.placed_before {
            // It has run (then was suspended or moved): refusing it now
            // would lose it; it waits until the tenant has room.
            hold(&mut pass.out, reason);
            return true;
        }
        pass.out
            .push(decided(EventData::LeaseRejected(LeaseRejected {
                lease_id: lease.id,
                reason,
                field: Some(lease.size_field().into()),
            })));
        true
    }

    /// `lease` does not fit now: it may preempt spot leases, it may hold
    /// GPUs back from smaller leases, and it is told why and where it waits.
    fn wait<'a>(
        &self,
        pass: &mut Pass<'a>,
        lease: &'a Lease,
        pending: Option<&Pending>,
        zones: Option<&[String]>,
    ) {
        let position = next_position(pass, lease);
        let (mut reason, busy) = why_pending(&pass.planned, lease, pending);
        if let Some(zones) = zones {
            reason = format!("{reason} (in {})", zones.join(", "));
        }
        if busy {
            if let Some(preempting) = self.preempt_for(pass, lease) {
                reason = preempting;
            }
            hold_for_starving(pass, lease);
        }
        self.announce_wait(pass, lease, reason, position);
    }

    /// Tells `lease` why and where it waits, unless it was told so already.
    fn announce_wait(&self, pass: &mut Pass, lease: &Lease, reason: String, position: u32) {
        // A lease waiting for its victims keeps saying so.
        let waiting_for_victims = self.awaiting_preemption.contains(&lease.id)
            && matches!(lease.status, Status::Queued { .. });
        let unchanged = waiting_for_victims
            || match &lease.status {
                Status::Queued {
                    reason: r,
                    position: p,
                } => *r == reason && (*p == position || position > EXACT_POSITIONS),
                _ => false,
            };
        if !unchanged {
            let queued = EventData::LeaseQueued(LeaseQueued {
                lease_id: lease.id,
                reason,
                position,
            });
            pass.out.push(vec![(
                lease_event(lease, pass.now, queued),
                expect_lease(lease),
            )]);
        }
    }

    /// Notices the cheapest set of spot victims for an on-demand whole-GPU
    /// lease that only busy GPUs keep out, and reserves their node for it.
    /// The reason it now waits, when it preempts.
    fn preempt_for(&self, pass: &mut Pass, lease: &Lease) -> Option<String> {
        if !lease.is_whole()
            || !lease.is_on_demand()
            || self.awaiting_preemption.contains(&lease.id)
        {
            return None;
        }
        let (now, rules) = (pass.now, pass.rules);
        let (nodes, victims) = if pass.planner().spans_nodes(lease.shape()) {
            let plan = plan_gang_preemption(self, &pass.planned, lease, now, rules)?;
            (plan.nodes, plan.victims)
        } else {
            let plan = plan_preemption(self, &pass.planned, lease, now, rules)?;
            (vec![plan.node_id], plan.victims)
        };
        let deadline = now + rules.preemption_notice;
        for victim in &victims {
            let v = &self.leases[victim];
            let on = v.node_id.as_deref().unwrap_or(&nodes[0]);
            let notice = notice_event(Some(lease), v, on, deadline, now);
            pass.out.push(vec![(
                notice,
                Expect::LastSubjectSequence(v.subject_sequence),
            )]);
        }
        // The victims' GPUs and the free ones go to this lease.
        for node in &nodes {
            reserve_for(&mut pass.planned, node, lease);
        }
        pass.synced = false;
        Some(format!(
            "preempting {} spot lease(s) on {}; their notice ends {}",
            victims.len(),
            nodes.join(", "),
            deadline.to_rfc3339()
        ))
    }
}

/// `lease`'s 1-based position among the leases of its model waiting in this pass.
fn next_position<'a>(pass: &mut Pass<'a>, lease: &'a Lease) -> u32 {
    let p = pass.positions.entry(&lease.gpu_model).or_default();
    *p += 1;
    *p
}

/// Places `lease` where the engine chose (one node, or a gang's members),
/// and plans the rest of the pass on top of it.
fn place_one(pass: &mut Pass, lease: &Lease, members: &[Chosen]) {
    // Made this pass's first: read from here on without a search of the
    // whole fleet.
    for chosen in members {
        pass.planned.node_mut(&chosen.node_id);
    }
    let (placed, allocated) = placement_events(&pass.planned, lease, members, pass.now);
    let vram_gb_per_gpu = match &placed.data {
        EventData::LeasePlaced(p) => p.vram_gb_per_gpu,
        _ => 0,
    };
    let gpus: usize = members.iter().map(|c| c.gpu_indices.len()).sum();
    let usage = pass.tenant_usage.entry(lease.tenant_id).or_default();
    usage.0 += lease.milli();
    usage.1 += u64::from(vram_gb_per_gpu) * gpus as u64;
    let mut batch = vec![(placed, expect_lease(lease))];
    for (allocated, node_id) in allocated {
        let node_seq = pass.planned.node_sequence(&node_id);
        pass.planned.apply(u64::MAX, &allocated.data);
        batch.push((allocated, Expect::LastSubjectSequence(node_seq)));
    }
    pass.out.push(batch);
}

/// A whole-GPU lease that has waited too long stops backfill: the free GPUs
/// of its model are kept for it.
fn hold_for_starving(pass: &mut Pass, lease: &Lease) {
    if !lease.is_whole() || pass.now - lease.requested_at <= pass.rules.backfill_starvation {
        return;
    }
    let kept = |g: &lh_domain::fleet::Gpu| g.model == lease.gpu_model && !g.mig && g.is_free();
    let nodes: Vec<String> = pass
        .planned
        .nodes()
        .filter(|n| n.gpus.iter().any(kept))
        .map(|n| n.id.clone())
        .collect();
    for id in nodes {
        if let Some(node) = pass.planned.node_mut(&id) {
            node.gpus
                .iter_mut()
                .filter(|g| kept(g))
                .for_each(|g| g.held_by = Some(lease.id));
        }
    }
    pass.synced = false;
}

fn ended(lease: &Lease, now: DateTime<Utc>, reason: EndReason) -> EventData {
    EventData::LeaseEnded(LeaseEnded {
        lease_id: lease.id,
        node_id: None,
        ended_at: now,
        reason,
        exit_code: None,
        failure: None,
    })
}

/// A write about `lease` expects its subject unchanged since we read it.
fn expect_lease(lease: &Lease) -> Expect {
    Expect::LastSubjectSequence(lease.subject_sequence)
}
