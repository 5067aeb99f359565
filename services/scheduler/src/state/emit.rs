//! The events the scheduler appends, built in one place.

use chrono::{DateTime, Utc};
use lh_domain::fleet::Gpu;
use lh_events::{
    derived_id, Actor, AssignedGpu, Decision, Envelope, EventData, LeaseMember, LeasePlaced,
    LeasePreemptionNoticed, MigInstance, NodeAllocation, NodeGpusAllocated, PreemptionReason,
    Relocation,
};
use lh_service::decider::Batch;
use uuid::Uuid;

use super::{FleetView, Lease, SERVICE};
use crate::planner;

/// The outcome of one decision pass.
#[derive(Debug, Default)]
pub struct Decisions {
    pub batches: Vec<Batch>,
}

/// An event about `lease` decided at `now`, its id derived from its type and
/// the lease's subject sequence (the same decision always has the same id).
pub(super) fn lease_event(lease: &Lease, now: DateTime<Utc>, data: EventData) -> Envelope {
    let step = data.event_type();
    derived_lease_event(lease, now, data, step)
}

/// The `node.gpus_allocated` that goes with `migrated`. Its id is derived
/// apart from the lease's placement: both are decided at the same subject
/// sequence of the lease.
pub(super) fn migration_allocation(
    lease: &Lease,
    now: DateTime<Utc>,
    allocation: EventData,
    migrated: &Envelope,
) -> Envelope {
    let mut env = derived_lease_event(lease, now, allocation, "node.gpus_allocated.migrated");
    env.causation_id = Some(migrated.id);
    env
}

fn derived_lease_event(lease: &Lease, now: DateTime<Utc>, data: EventData, step: &str) -> Envelope {
    let id = derived_id(&[
        step,
        &lease.id.to_string(),
        &lease.subject_sequence.to_string(),
    ]);
    let mut env = Envelope::new_with_id(id, Actor::Service(SERVICE.into()), now, data);
    env.correlation_id = lease.correlation_id;
    env.causation_id = Some(lease.request_event_id);
    env.tenant_id = Some(lease.tenant_id);
    env
}

/// An event about node `node_id` decided at `now`, its id derived from its
/// type and the node's subject sequence `node_seq`.
pub(super) fn node_event(
    node_id: &str,
    node_seq: u64,
    now: DateTime<Utc>,
    data: EventData,
) -> Envelope {
    let step = data.event_type();
    let id = derived_id(&[step, node_id, &node_seq.to_string()]);
    Envelope::new_with_id(id, Actor::Service(SERVICE.into()), now, data)
}

/// `lease.placed` for `lease` where the engine chose `members` (one node,
/// or a gang's nodes in node-rank order), and the matching
/// `node.gpus_allocated` of each node (caused by the placement), with the
/// node each is on.
pub(super) fn placement_events(
    planned: &impl FleetView,
    lease: &Lease,
    members: &[planner::Chosen],
    now: DateTime<Utc>,
) -> (Envelope, Vec<(Envelope, String)>) {
    let mut placed_on: Vec<(Relocation, EventData)> = members
        .iter()
        .map(|p| relocate(planned, lease, p))
        .collect();
    let gang: Vec<LeaseMember> = match placed_on.len() {
        1 => Vec::new(),
        _ => placed_on
            .iter()
            .map(|(to, _)| LeaseMember {
                node_id: to.node_id.clone(),
                zone: to.zone.clone(),
                address: planned
                    .node(&to.node_id)
                    .map(|n| n.hostname.clone())
                    .unwrap_or_default(),
                gpus: to.gpus.clone(),
            })
            .collect(),
    };
    let rest = placed_on.split_off(1);
    let (to, first_allocated) = placed_on.pop().expect("a placement has a node");
    let placed = EventData::LeasePlaced(LeasePlaced {
        lease_id: lease.id,
        node_id: to.node_id.clone(),
        zone: to.zone,
        gpu_model: lease.gpu_model.clone(),
        vram_gb_per_gpu: to.vram_gb_per_gpu,
        gpus: to.gpus,
        decision: to.decision,
        members: gang,
    });
    let placed = lease_event(lease, now, placed);
    let mut allocated = vec![(lease_event(lease, now, first_allocated), to.node_id)];
    for (k, (to, allocation)) in rest.into_iter().enumerate() {
        // Each member's allocation is its own event, decided at the same
        // subject sequence of the lease.
        let step = format!("node.gpus_allocated.member.{}", k + 1);
        allocated.push((
            derived_lease_event(lease, now, allocation, &step),
            to.node_id,
        ));
    }
    for (env, _) in &mut allocated {
        env.causation_id = Some(placed.id);
    }
    (placed, allocated)
}

/// The notice that spot lease `victim` will be preempted on `node_id` at
/// `deadline`: so that `lease` fits (it then belongs to `lease`'s
/// conversation), or, without one, because the price outgrew its bid.
pub(super) fn notice_event(
    lease: Option<&Lease>,
    victim: &Lease,
    node_id: &str,
    deadline: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Envelope {
    let reason = match lease {
        Some(_) => PreemptionReason::Capacity,
        None => PreemptionReason::Outbid,
    };
    let data = EventData::LeasePreemptionNoticed(LeasePreemptionNoticed {
        lease_id: victim.id,
        node_id: node_id.to_string(),
        preempted_for: lease.map_or(Uuid::nil(), |l| l.id),
        deadline,
        reason,
    });
    let step = data.event_type();
    let id = match lease {
        Some(_) => derived_id(&[step, &victim.id.to_string()]),
        // Outbid again after a move is a new notice.
        None => derived_id(&[
            step,
            reason.as_str(),
            &victim.id.to_string(),
            &victim.subject_sequence.to_string(),
        ]),
    };
    let cause = lease.unwrap_or(victim);
    let mut notice = Envelope::new_with_id(id, Actor::Service(SERVICE.into()), now, data);
    notice.correlation_id = cause.correlation_id;
    notice.causation_id = Some(cause.request_event_id);
    notice.tenant_id = Some(victim.tenant_id);
    notice
}

/// What a placement the engine chose for `lease` gives, as the placed GPUs
/// and the matching `node.gpus_allocated`.
pub(super) fn relocate(
    planned: &impl FleetView,
    lease: &Lease,
    p: &planner::Chosen,
) -> (Relocation, EventData) {
    let node = planned
        .node(&p.node_id)
        .expect("the engine places on the fleet's nodes");
    let gpus: Vec<&Gpu> = p
        .gpu_indices
        .iter()
        .filter_map(|i| node.gpus.iter().find(|g| g.index == *i))
        .collect();
    let share = match (&p.mig, lease.fraction()) {
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
