//! Executes the lease steps [`NodeState::decide`] chose: starts and stops
//! workloads and reports the lease's transitions on the log.

use chrono::{DateTime, Utc};
use lh_bus::{Bus, BusError, Expect};
use lh_events::{
    derived_id, Actor, EndReason, Envelope, EventData, LeaseEnded, LeaseStarted, LeaseSuspended,
};

use crate::state::{LeaseStep, LocalLease, NodeState};
use crate::workload::supervisor::Workloads;

/// Starts and stops leases as the log asks, at `now`. False after a
/// conflict or a failed report: the agent re-reads the log and decides
/// again.
pub(crate) async fn act(
    bus: &Bus,
    node_id: &str,
    state: &mut NodeState,
    workloads: &mut Workloads,
    now: DateTime<Utc>,
) -> bool {
    // A workload that runs for an earlier placement of a lease (it moved
    // to other GPUs here) stops without a report that counts.
    for (lease_id, lease) in state.leases.iter().filter(|(_, l)| !l.ended) {
        workloads.stop_stale(*lease_id, lease.placement_sequence);
    }
    for step in state.decide(now) {
        let lease_id = step.lease_id();
        let spec = state.specs.get(&lease_id);
        let Some(lease) = state.leases.get_mut(&lease_id) else {
            continue;
        };
        let report = match step {
            LeaseStep::Leave { .. } => {
                workloads.stop(lease_id);
                lease.workload_running = false;
                lease.ended = true;
                continue;
            }
            LeaseStep::StopWorkload { .. } => {
                workloads.stop(lease_id);
                lease.workload_running = false;
                lease.stopping = true;
                continue;
            }
            LeaseStep::Start { .. } => {
                // Started before, but the report did not get through: keep it.
                let start = match workloads.is_running(lease_id, lease.placement_sequence) {
                    true => Ok(true),
                    false => workloads.start(lease_id, lease.placement_sequence, &lease.gpus, spec),
                };
                match start {
                    Ok(running) => {
                        lease.workload_running = running;
                        step
                    }
                    Err(e) => {
                        // It cannot run here: the lease fails, never
                        // started, so nothing is billed.
                        tracing::warn!(lease = %lease_id, error = %e, "workload does not start");
                        LeaseStep::End {
                            lease_id,
                            reason: EndReason::Failed,
                            exit_code: None,
                        }
                    }
                }
            }
            LeaseStep::Suspend { .. } | LeaseStep::End { .. } => step,
        };
        if !report_step(bus, node_id, lease, report, now).await {
            return false;
        }
    }
    // Ended leases need no memory beyond the log.
    state.leases.retain(|_, l| !l.ended);
    true
}

/// Appends the event a reporting step stands for. False when it did not
/// get through.
async fn report_step(
    bus: &Bus,
    node_id: &str,
    lease: &mut LocalLease,
    step: LeaseStep,
    now: DateTime<Utc>,
) -> bool {
    let lease_id = step.lease_id();
    let placement = lease.placement_sequence.to_string();
    // A migrated lease starts (and is suspended) once per placement; it
    // ends only once. Start and suspension are guarded: a stop that
    // arrived meanwhile must win.
    let (data, id, expect) = match step {
        LeaseStep::Start { .. } => (
            EventData::LeaseStarted(LeaseStarted {
                lease_id,
                node_id: node_id.to_string(),
                started_at: now,
            }),
            derived_id(&["lease.started", &lease_id.to_string(), &placement]),
            Expect::LastSubjectSequence(lease.subject_sequence),
        ),
        LeaseStep::Suspend { .. } => (
            EventData::LeaseSuspended(LeaseSuspended {
                lease_id,
                node_id: node_id.to_string(),
                gpu_indices: lease.gpus.iter().map(|g| g.index).collect(),
                suspended_at: now,
                reason: "idle under the tenant's suspend policy".into(),
            }),
            derived_id(&["lease.suspended", &lease_id.to_string(), &placement]),
            Expect::LastSubjectSequence(lease.subject_sequence),
        ),
        LeaseStep::End {
            reason, exit_code, ..
        } => (
            EventData::LeaseEnded(LeaseEnded {
                lease_id,
                node_id: Some(node_id.to_string()),
                ended_at: now,
                reason,
                exit_code,
            }),
            derived_id(&["lease.ended", &lease_id.to_string()]),
            Expect::Any,
        ),
        LeaseStep::Leave { .. } | LeaseStep::StopWorkload { .. } => return true,
    };
    let event_type = data.event_type();
    let mut envelope = Envelope::new(Actor::Node(node_id.to_string()), now, data).with_id(id);
    envelope.correlation_id = lease.correlation_id;
    envelope.tenant_id = lease.tenant_id;
    match bus.publish(&envelope, expect).await {
        Ok(appended) => {
            lease.subject_sequence = appended.sequence;
            match step {
                LeaseStep::Start { .. } => lease.started = true,
                _ => lease.ended = true,
            }
            metrics::counter!("lh_node_lease_transitions_total", "type" => event_type).increment(1);
            tracing::info!(lease = %lease_id, event = event_type, "lease transition");
            true
        }
        Err(BusError::Conflict(_)) => false,
        Err(e) => {
            tracing::warn!(error = %e, lease = %lease_id, "cannot report lease transition");
            false
        }
    }
}
