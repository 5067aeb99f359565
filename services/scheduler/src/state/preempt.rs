//! Preemption: which spot leases an on-demand lease may evict.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use lh_events::{GpuHealth, Isolation};
use uuid::Uuid;

use super::{FleetView, Lease, PlannedFleet, Rules, State, MAX_VICTIMS_PER_NODE};

pub(super) fn reserve_for(planned: &mut PlannedFleet, node_id: &str, lease: &Lease) {
    if let Some(node) = planned.node_mut(node_id) {
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
/// victims have run), then node id. A spot gang is evicted whole, on every
/// member: all its GPUs count against it. Leases younger than the minimum runtime,
/// already noticed, or not started are never chosen.
pub fn plan_preemption(
    state: &State,
    planned: &impl FleetView,
    lease: &Lease,
    now: DateTime<Utc>,
    rules: &Rules,
) -> Option<PreemptionPlan> {
    let mut best: Option<PreemptionPlan> = None;
    let needs_isolation = state.needs_isolation(lease);
    let may_run_on = |n: &&lh_domain::fleet::Node| {
        n.is_schedulable()
            && (!needs_isolation || n.isolation == Isolation::Container)
            && lease.may_run_in(&n.zone)
    };
    for node in planned.nodes().filter(may_run_on) {
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
        // A gang holds GPUs on other nodes too: only those here make room
        // here, but evicting it costs all of them.
        let mut held_here: HashMap<Uuid, u32> = HashMap::new();
        for id in of_model.iter().filter_map(|g| g.held_by) {
            *held_here.entry(id).or_default() += 1;
        }
        let mut candidates: Vec<&Lease> = held_here
            .keys()
            .copied()
            .filter_map(|id| state.leases.get(&id))
            .filter(|v| {
                !v.is_on_demand()
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
            let freed: u32 = chosen.iter().map(|v| held_here[&v.id]).sum();
            if freed < need {
                continue;
            }
            let evicted: u32 = chosen.iter().map(|v| v.gpus).sum();
            let lost: i64 = chosen
                .iter()
                .map(|v| {
                    i64::from(v.gpus) * v.started_at.map(|s| (now - s).num_seconds()).unwrap_or(0)
                })
                .sum();
            let plan = PreemptionPlan {
                node_id: node.id.clone(),
                victims: chosen.iter().map(|v| v.id).collect(),
                cost: (evicted, lost),
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
