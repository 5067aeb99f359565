//! The events the scheduler appends, built in one place.

use chrono::{DateTime, Utc};
use lh_bus::Expect;
use lh_domain::fleet::Fleet;
use lh_domain::placement;
use lh_events::{
    derived_id, Actor, AssignedGpu, Decision, Envelope, EventData, MigInstance, NodeAllocation,
    NodeGpusAllocated, Relocation,
};

use super::*;
use crate::planner;

/// One decision: events appended together as one atomic batch.
pub type Batch = Vec<(Envelope, Expect)>;

/// The outcome of one decision pass.
#[derive(Debug, Default)]
pub struct Decisions {
    pub batches: Vec<Batch>,
}

/// An event about `lease` decided at `now`, its id derived from the step and
/// the lease's subject sequence (the same decision always has the same id).
pub(super) fn lease_event(
    lease: &Lease,
    now: DateTime<Utc>,
    data: EventData,
    step: &str,
) -> Envelope {
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
pub(super) fn relocate(
    scratch: &Fleet,
    lease: &Lease,
    p: &planner::Chosen,
) -> (Relocation, EventData) {
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
