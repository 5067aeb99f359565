//! Preemption: which spot leases an on-demand lease may evict.

use std::collections::{BTreeMap, BTreeSet, HashMap};

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

/// What one node can give a gang: its id, the GPUs it gives, and the
/// victims that takes.
type NodeOffer<'a> = (String, u32, Vec<&'a Lease>);

/// Spot leases to evict so that a gang (`lease`, more GPUs than a node
/// holds) fits in one region: on each node its free GPUs, or all that
/// evicting every spot lease old enough frees there. Nodes that need no
/// eviction come first, then the cheapest per GPU gained, until the gang
/// fits; the region whose set costs least (GPUs evicted, then work lost)
/// wins. A victim that spans nodes is evicted once, and all its GPUs
/// count against the set.
pub fn plan_gang_preemption(
    state: &State,
    planned: &impl FleetView,
    lease: &Lease,
    now: DateTime<Utc>,
    rules: &Rules,
) -> Option<GangPreemptionPlan> {
    let needs_isolation = state.needs_isolation(lease);
    let evictable = |v: &Lease| {
        !v.is_on_demand()
            && v.preemption_deadline.is_none()
            && !v.stop_requested
            && v.started_at
                .is_some_and(|s| now - s >= rules.preemption_min_runtime)
    };
    let mut regions: BTreeMap<&str, Vec<NodeOffer>> = BTreeMap::new();
    for node in planned.nodes().filter(|n| {
        n.is_schedulable()
            && (!needs_isolation || n.isolation == Isolation::Container)
            && lease.may_run_in(&n.zone)
    }) {
        let of_model: Vec<_> = node
            .gpus
            .iter()
            .filter(|g| g.model == lease.gpu_model && !g.mig && g.health == GpuHealth::Healthy)
            .collect();
        let free = of_model.iter().filter(|g| g.is_free()).count() as u32;
        let mut victims: Vec<&Lease> = Vec::new();
        let mut freed = 0;
        let holders: BTreeSet<Uuid> = of_model.iter().filter_map(|g| g.held_by).collect();
        for id in holders {
            let Some(v) = state.leases.get(&id).filter(|v| evictable(v)) else {
                continue;
            };
            if victims.len() == MAX_VICTIMS_PER_NODE {
                break;
            }
            freed += of_model.iter().filter(|g| g.held_by == Some(id)).count() as u32;
            victims.push(v);
        }
        regions
            .entry(lh_domain::spot::region_of(&node.zone))
            .or_default()
            .push((node.id.clone(), free + freed, victims));
    }
    let mut best: Option<GangPreemptionPlan> = None;
    for mut nodes in regions.into_values() {
        let cost_of = |victims: &[&Lease]| -> (u32, i64) {
            victims.iter().fold((0, 0), |(gpus, lost), v| {
                let ran = v.started_at.map_or(0, |s| (now - s).num_seconds());
                (gpus + v.gpus, lost + i64::from(v.gpus) * ran)
            })
        };
        // Cheapest per GPU gained first (GPUs evicted, then work lost),
        // then the node that gives most, then the node id.
        nodes.retain(|(_, gives, _)| *gives > 0);
        let per_gpu = |(_, gives, victims): &NodeOffer| {
            let (gpus, lost) = cost_of(victims);
            let gives = f64::from(*gives);
            (f64::from(gpus) / gives, lost as f64 / gives)
        };
        nodes.sort_by(|a, b| {
            per_gpu(a)
                .partial_cmp(&per_gpu(b))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(b.1.cmp(&a.1))
                .then(a.0.cmp(&b.0))
        });
        let mut gpus = 0;
        let mut chosen = Vec::new();
        let mut victims: BTreeMap<Uuid, &Lease> = BTreeMap::new();
        for (node, gives, node_victims) in nodes {
            if gpus >= lease.gpus {
                break;
            }
            gpus += gives;
            chosen.push(node);
            victims.extend(node_victims.into_iter().map(|v| (v.id, v)));
        }
        if gpus < lease.gpus || victims.is_empty() {
            continue;
        }
        let victims: Vec<&Lease> = victims.into_values().collect();
        let plan = GangPreemptionPlan {
            nodes: chosen,
            victims: victims.iter().map(|v| v.id).collect(),
            cost: cost_of(&victims),
        };
        if best
            .as_ref()
            .is_none_or(|b| (plan.cost, &plan.nodes) < (b.cost, &b.nodes))
        {
            best = Some(plan);
        }
    }
    best
}

/// Spot leases to evict so that a gang fits, and the nodes it would go to.
#[derive(Debug, Clone, PartialEq)]
pub struct GangPreemptionPlan {
    pub nodes: Vec<String>,
    pub victims: Vec<Uuid>,
    /// `(GPUs evicted, GPU-seconds of work the victims lose)`.
    pub cost: (u32, i64),
}
