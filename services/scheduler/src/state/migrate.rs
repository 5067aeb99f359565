//! Leases that must leave their node: lost, drained with `move`, or on an
//! unhealthy GPU. A gang leaves all its nodes when one of them must.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use lh_domain::fleet::Node;
use lh_events::{DrainMode, EventData, Expect, GpuHealth, LeaseMigrated};
use uuid::Uuid;

use super::decide::Pass;
use super::{
    lease_event, migration_allocation, relocate, watch, FleetView, Lease, PlannedFleet, State,
    Status,
};

impl State {
    /// Moves every lease held on a lost node, on a node drained with `move`,
    /// or on a GPU turned unhealthy: placed again at once where the engine
    /// finds room (`lease.migrated` with `to`), else back in the queue.
    pub(super) fn decide_migrations(&self, pass: &mut Pass) {
        let now = pass.now;
        // Only leases on these nodes may have to move: the fleet's troubled
        // nodes, and those this pass changed (declared lost) that are.
        let mut troubled: HashSet<&str> =
            self.watch.troubled().iter().map(String::as_str).collect();
        troubled.extend(
            pass.planned
                .changed_nodes()
                .filter(|id| pass.planned.node(id).is_some_and(watch::troubled)),
        );
        let trusts_node_watch = pass.trusts_node_watch();
        if troubled.is_empty() && trusts_node_watch {
            return;
        }
        // A gang moves whole when any of its members must: it goes back to
        // the queue and is placed again, every member afresh.
        let mut moving: Vec<(&Lease, String, String, DateTime<Utc>)> = self
            .leases
            .values()
            .filter(|l| l.status == Status::Holding)
            .filter_map(|l| {
                let first = l.node_id.as_deref()?;
                let mut held = vec![(first.to_string(), held_on(&pass.planned, l.id, first))];
                held.extend(pass.planned.gang_members(&l.id).iter().cloned());
                held.iter().find_map(|(node_id, indices)| {
                    if trusts_node_watch && !troubled.contains(node_id.as_str()) {
                        return None;
                    }
                    let node = pass.planned.node(node_id)?;
                    let (reason, billing_ends_at) = why_move(node, indices, now)?;
                    Some((l, first.to_string(), reason, billing_ends_at))
                })
            })
            .collect();
        moving.sort_by_key(|(l, ..)| l.requested_sequence);
        for (lease, from_node, reason, last_heard) in moving {
            let from_gpu_indices = pass
                .planned
                .holding(&lease.id)
                .map(|(_, idx)| idx.clone())
                .unwrap_or_default();
            // Where it may go now: its zones and regions, and for a bid,
            // where the price is covered; nowhere sends it to the queue.
            let gang = !pass.planned.gang_members(&lease.id).is_empty();
            let zones = self.zones_for(&pass.planned, lease).ok().filter(|_| !gang);
            let needs_isolation = self.needs_isolation(lease);
            let planner = pass.planner();
            let placed = zones.and_then(|zones| {
                planner
                    .place(
                        lease.shape(),
                        &lease.gpu_model,
                        needs_isolation,
                        zones.as_deref().unwrap_or_default(),
                    )
                    .ok()
            });
            let planned = &mut pass.planned;
            let mut allocated = None;
            let to = placed.map(|p| {
                let (relocation, allocation) = relocate(planned, lease, &p);
                let node_seq = planned.node_sequence(&p.node_id);
                allocated = Some((allocation, node_seq));
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
            let migrated = lease_event(lease, now, migrated);
            planned.apply(u64::MAX, &migrated.data);
            let mut decision = vec![(
                migrated.clone(),
                Expect::LastSubjectSequence(lease.subject_sequence),
            )];
            if let Some((allocation, node_seq)) = allocated {
                let env = migration_allocation(lease, now, allocation, &migrated);
                planned.apply(u64::MAX, &env.data);
                decision.push((env, Expect::LastSubjectSequence(node_seq)));
            }
            pass.out.push(decision);
        }
    }
}

/// The GPU indices `lease_id` holds on `node_id`, its first (or only) node.
fn held_on(planned: &PlannedFleet, lease_id: Uuid, node_id: &str) -> Vec<u32> {
    planned
        .holding(&lease_id)
        .filter(|(n, _)| n == node_id)
        .map(|(_, idx)| idx.clone())
        .unwrap_or_default()
}

/// Why a lease holding GPUs `indices` of `node` must move now, and when
/// its billing there ends: the node was lost (at its last heartbeat), is
/// drained with `move` (now), or one of those GPUs turned unhealthy (when
/// it did).
fn why_move(node: &Node, indices: &[u32], now: DateTime<Utc>) -> Option<(String, DateTime<Utc>)> {
    if let Some(at) = node.lost {
        return Some((lh_domain::moves::node_lost(&node.id), at));
    }
    if node.cordoned == Some(Some(DrainMode::Move)) {
        return Some((lh_domain::moves::node_drained(&node.id), now));
    }
    node.gpus
        .iter()
        .filter(|g| indices.contains(&g.index) && g.health == GpuHealth::Unhealthy)
        .map(|g| {
            (
                lh_domain::moves::gpu_unhealthy(g.index, &node.id),
                g.health_since.unwrap_or(now).min(now),
            )
        })
        .next()
}
