//! What the node-agent knows from the log about the leases on its node,
//! and what it should do next about each: a pure fold ([`NodeState::apply`])
//! and a pure decision ([`NodeState::decide`]). The agent loop carries the
//! decision out ([`crate::agent`]).
//!
//! The lowest room of the agent: the GPU side and the workload side build
//! on what it holds (a lease's idle stretch, how its workload ended, the
//! limits on holding it for a GPU fault), and it knows nothing of either,
//! so that the decision can be read and tested on its own. How a GPU's
//! fault is told from the workload's own is in [`fault_hold`], idle
//! stretches in [`idle`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use lh_events::{
    AssignedGpu, EndReason, Envelope, EventData, GpuHealth, IdlePolicy, NodeRegistered,
    StartedMigDevice, WorkloadSpec,
};
use uuid::Uuid;

mod fault_hold;
mod idle;

pub(crate) use fault_hold::FaultHold;
use fault_hold::FaultVerdict;

use crate::workload::gang::GangPart;
pub use fault_hold::{DEFAULT_GPU_FAULT_HOLD_SECS, DEFAULT_GPU_FAULT_MOVE_WAIT_SECS};
pub(crate) use idle::IdleWatch;

/// The next thing to do about one lease on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseStep {
    /// Moved to another node: its workload stops here and nothing is
    /// reported (the lease goes on elsewhere).
    Leave { lease_id: Uuid },
    /// Its workload is asked to stop; the end (or the suspension) is
    /// reported once the workload has exited.
    StopWorkload { lease_id: Uuid },
    /// Its running workload is told of its preemption's deadline, so that
    /// it can checkpoint before it is stopped.
    Notify { lease_id: Uuid },
    /// Its workload starts, unless it already runs for this placement, and
    /// `lease.started` is reported, guarded by the lease's last sequence.
    Start { lease_id: Uuid },
    /// `lease.suspended` is reported, guarded by the lease's last sequence.
    Suspend { lease_id: Uuid },
    /// `lease.ended` is reported.
    End {
        lease_id: Uuid,
        reason: EndReason,
        exit_code: Option<i32>,
    },
    /// Held for a GPU fault that killed its workload, it waited the whole
    /// [`FaultHold::move_wait`] for the scheduler's move in vain: it ends
    /// `failed`, as a workload's own failure does.
    EndUnmoved {
        lease_id: Uuid,
        exit_code: Option<i32>,
    },
    /// A gang's later member's part exited 0: `lease.member_completed` is
    /// reported, guarded by the lease's last sequence.
    PartCompleted { lease_id: Uuid },
}

impl LeaseStep {
    pub(crate) fn lease_id(&self) -> Uuid {
        match *self {
            LeaseStep::Leave { lease_id }
            | LeaseStep::StopWorkload { lease_id }
            | LeaseStep::Notify { lease_id }
            | LeaseStep::Start { lease_id }
            | LeaseStep::Suspend { lease_id }
            | LeaseStep::End { lease_id, .. }
            | LeaseStep::EndUnmoved { lease_id, .. }
            | LeaseStep::PartCompleted { lease_id } => lease_id,
        }
    }
}

/// What the log says about one lease placed on this node, and what this
/// process did about its workload. A snapshot keeps only the first: the
/// skipped fields are learnt again by a new process, which reconciles the
/// host.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct LocalLease {
    pub(crate) started: bool,
    pub(crate) stop_requested: bool,
    /// A spot lease preempted for an on-demand one ends at this instant.
    pub(crate) preemption_deadline: Option<chrono::DateTime<Utc>>,
    /// Why it is preempted, told to its workload with the deadline.
    #[serde(default)]
    pub(crate) preemption_reason: Option<lh_events::PreemptionReason>,
    /// Its workload was told of the preemption (a signal and a file): once
    /// per process; a new one tells it again.
    #[serde(skip)]
    pub(crate) notice_told: bool,
    pub(crate) ended: bool,
    pub(crate) subject_sequence: u64,
    /// Stream sequence of the placement on this node (`lease.placed`, or a
    /// `lease.migrated` here): a lease that comes back starts afresh.
    pub(crate) placement_sequence: u64,
    pub(crate) correlation_id: Uuid,
    pub(crate) tenant_id: Option<Uuid>,
    /// The GPUs it holds here.
    pub(crate) gpus: Vec<AssignedGpu>,
    /// Moved to another node: its workload stops here, nothing is reported.
    pub(crate) moved_away: bool,
    /// A workload runs for this placement: the agent started it and has
    /// not seen it exit or asked it to stop.
    #[serde(skip)]
    pub(crate) workload_running: bool,
    /// Its workload is a container the engine has not run yet (its image
    /// being pulled): the lease is started once it runs.
    #[serde(skip)]
    pub(crate) not_yet_running: bool,
    /// A stop was sent to its workload; the end is reported once it exits.
    #[serde(skip)]
    pub(crate) stopping: bool,
    /// Its workload ended (on its own, or stopped).
    #[serde(skip)]
    pub(crate) exit: Option<Exit>,
    /// Why its workload failed, where its standard error said.
    #[serde(skip)]
    pub(crate) failure: Option<lh_events::LeaseFailure>,
    /// When the agent heard of that end: the hold for a GPU fault counts
    /// from it.
    #[serde(skip)]
    pub(crate) exited_at: Option<DateTime<Utc>>,
    /// An application XID on its GPU was charged to it (`lease.gpu_fault`):
    /// a failure of its workload is its own, whatever else its GPU does.
    #[serde(skip)]
    pub(crate) application_fault: bool,
    /// Its GPUs' idle stretch, while it runs.
    #[serde(skip)]
    pub(crate) idle: IdleWatch,
    /// Idle under a `suspend` policy: its workload stops and the lease is
    /// reported suspended, not ended.
    pub(crate) suspend_requested: bool,
    /// Where starting its workload for this placement stands.
    #[serde(skip)]
    pub(crate) start: WorkloadStart,
    /// What it runs, as far as the fold knows.
    pub(crate) workload: Workload,
    /// A workload of an earlier placement on this node may still run: it is
    /// to be stopped (without a report that counts).
    #[serde(skip)]
    pub(crate) stale_workload: bool,
    /// The MIG devices made for this placement, reported on `lease.started`.
    #[serde(skip)]
    pub(crate) mig_devices: Vec<StartedMigDevice>,
    /// Its part of a lease that spans several nodes.
    #[serde(default)]
    pub(crate) gang: Option<GangPart>,
    /// The gang's other members whose parts have completed for this
    /// placement (`lease.member_completed`, this node's own included).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) members_completed: BTreeSet<String>,
    /// When each of the gang's later members last reported its GPUs idle
    /// for this placement (`lease.idle_detected`, renewed each window
    /// while they stay so): the first member reclaims the gang only while
    /// every report is fresh.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) members_idle: BTreeMap<String, DateTime<Utc>>,
    /// Since when each of those members' GPUs have idled, by its last
    /// report: the gang is idle since the latest of them and the first's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) members_idle_since: BTreeMap<String, DateTime<Utc>>,
}

impl LocalLease {
    /// A gang's member other than the first: only a failure of its part is
    /// its to report; the first member reports every other end.
    fn follows(&self) -> bool {
        self.gang.as_ref().is_some_and(|g| !g.is_first())
    }

    /// Whether every member's part but this node's own has completed: a
    /// lease on one node has no other part.
    fn other_parts_completed(&self) -> bool {
        self.gang
            .as_ref()
            .is_none_or(|g| g.others().all(|n| self.members_completed.contains(n)))
    }

    /// Whether this node told the gang its part completed.
    fn own_part_told(&self) -> bool {
        self.gang
            .as_ref()
            .is_some_and(|g| self.members_completed.contains(g.own_node()))
    }
}

impl LocalLease {
    /// When its workload's end was heard, never after `now`; `now` when the
    /// agent did not note it (a restart in between).
    pub(crate) fn exit_heard_at(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        self.exited_at.map_or(now, |at| at.min(now))
    }
}

/// How a workload ended: an exit code, or the signal that killed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// What a lease placed here runs. Its request comes just before its
/// placement (or its move) here in the node's view.
// Nearly every lease's is `Known`: boxing it would cost an allocation for
// the one that is not.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Workload {
    /// Nothing (`None`), or this.
    Known(Option<WorkloadSpec>),
    /// Its request did not come with its placement: it cannot start here.
    #[default]
    Unknown,
}

/// Where starting a lease's workload stands: the workload side starts it
/// and reports back, and only then is the start (or the failure) reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum WorkloadStart {
    #[default]
    NotAsked,
    Asked,
    /// Whether a workload runs, or why it cannot run here.
    Answered(Result<bool, String>),
}

#[derive(Default)]
pub(crate) struct NodeState {
    pub(crate) registered: Option<NodeRegistered>,
    /// Where the log holds `registered`: a registration that replaces it
    /// is named after it, so that going back to an earlier inventory is
    /// not taken for a duplicate of it.
    pub(crate) registered_sequence: u64,
    pub(crate) leases: BTreeMap<Uuid, LocalLease>,
    /// Requests relayed just before their leases' placement (or move)
    /// here, with their workloads, until that placement is folded.
    pub(crate) waiting: HashMap<Uuid, Option<WorkloadSpec>>,
    /// The health the log last recorded for each of this node's GPUs.
    pub(crate) gpu_health: BTreeMap<u32, GpuHealth>,
    /// Tenants' idle policies, where they set one, as relays carry them.
    pub(crate) idle_policies: HashMap<Uuid, IdlePolicy>,
    /// The GPUs the agent's own health tracker holds unhealthy now: it
    /// knows before the log does.
    pub(crate) unhealthy_gpus: BTreeSet<u32>,
    /// The agent's limits on holding a lease for a GPU fault.
    pub(crate) fault_hold: FaultHold,
}

/// [`NodeState`] as a snapshot keeps it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct StateSnapshot {
    registered: Option<NodeRegistered>,
    #[serde(default)]
    registered_sequence: u64,
    leases: BTreeMap<Uuid, LocalLease>,
    waiting: HashMap<Uuid, Option<WorkloadSpec>>,
    gpu_health: BTreeMap<u32, GpuHealth>,
    idle_policies: HashMap<Uuid, IdlePolicy>,
}

impl NodeState {
    /// What the log says, for a snapshot.
    pub(crate) fn snapshot(&self) -> Option<serde_json::Value> {
        serde_json::to_value(StateSnapshot {
            registered: self.registered.clone(),
            registered_sequence: self.registered_sequence,
            leases: self.leases.clone(),
            waiting: self.waiting.clone(),
            gpu_health: self.gpu_health.clone(),
            idle_policies: self.idle_policies.clone(),
        })
        .ok()
    }

    /// Takes back a [`NodeState::snapshot`]; false when it does not fit.
    pub(crate) fn restore(&mut self, state: serde_json::Value) -> bool {
        let Ok(s) = serde_json::from_value::<StateSnapshot>(state) else {
            return false;
        };
        // A gang's part from before parts named their members' nodes: the
        // fold of the log names them again.
        if s.leases
            .values()
            .filter_map(|l| l.gang.as_ref())
            .any(|g| g.node_ids.len() != g.members.len())
        {
            return false;
        }
        self.registered = s.registered;
        self.registered_sequence = s.registered_sequence;
        self.waiting = s.waiting;
        self.gpu_health = s.gpu_health;
        self.idle_policies = s.idle_policies;
        self.leases = s.leases;
        true
    }

    pub(crate) fn apply(&mut self, node_id: &str, sequence: u64, envelope: &Envelope) {
        match &envelope.data {
            // What a restatement carries is folded only where its history
            // expired before this fold began (see lh_events::LeaseRestated).
            EventData::LeaseRestated(r) => {
                let known =
                    self.leases.contains_key(&r.lease_id) || self.waiting.contains_key(&r.lease_id);
                if !known {
                    for e in &r.history {
                        self.apply(node_id, e.sequence, &e.envelope);
                    }
                }
                if let Some(l) = self.leases.get_mut(&r.lease_id) {
                    l.subject_sequence = l.subject_sequence.max(sequence);
                }
            }
            EventData::NodeRestated(r) if r.node_id == node_id && self.registered.is_none() => {
                for e in &r.history {
                    self.apply(node_id, e.sequence, &e.envelope);
                }
            }
            // A registration refused before this node was enrolled (or
            // beyond an older enrollment) is sent again under a new id,
            // not taken by the log for a duplicate of the refused one. The
            // agent folded its own registration when it was stored, before
            // any reader refused it: it cannot know it counts, so it sends
            // it again under the new enrollment. Only an enrollment after
            // the registration it holds counts: a relay may come after the
            // agent folded a newer registration of its own.
            EventData::NodeEnrolled(e)
                if e.node_id == node_id && sequence > self.registered_sequence =>
            {
                self.registered_sequence = sequence;
                self.registered = None;
            }
            EventData::NodeRegistered(e)
                if e.node_id == node_id && sequence >= self.registered_sequence =>
            {
                self.registered = Some(e.clone());
                self.registered_sequence = sequence;
            }
            EventData::NodeGpuHealthChanged(e) if e.node_id == node_id => {
                self.gpu_health.insert(e.gpu_index, e.to);
            }
            EventData::LeaseRequested(e) => {
                self.waiting.insert(e.lease_id, e.workload.clone());
            }
            EventData::LeaseRejected(e) => {
                self.waiting.remove(&e.lease_id);
            }
            EventData::LeasePlaced(e) => {
                let workload = self.waiting.remove(&e.lease_id);
                let gang = GangPart::of(e, node_id);
                let gpus = match &gang {
                    Some(part) => &e.members[part.node_rank as usize].gpus,
                    None if e.node_id == node_id => &e.gpus,
                    None => return,
                };
                self.placed_here(e.lease_id, gpus, sequence, envelope);
                if let Some(l) = self.leases.get_mut(&e.lease_id) {
                    if l.placement_sequence == sequence {
                        l.gang = gang;
                    }
                    if let Some(workload) = workload {
                        l.workload = Workload::Known(workload);
                    }
                }
            }
            // Folded already (relayed again): it stands as it is.
            EventData::LeaseMigrated(e)
                if self
                    .leases
                    .get(&e.lease_id)
                    .is_some_and(|l| l.placement_sequence == sequence) => {}
            EventData::LeaseMigrated(e) => {
                // A gang moves whole: every member's part leaves.
                let member_here = self
                    .leases
                    .get(&e.lease_id)
                    .is_some_and(|l| l.gang.is_some());
                if e.from_node_id == node_id || member_here {
                    // Moved away (this node was lost, or its GPU failed):
                    // stop running it here, without ending the lease, which
                    // goes on elsewhere. A node that comes back learns this
                    // from the log and never resurrects the lease.
                    if let Some(l) = self.leases.get_mut(&e.lease_id) {
                        if !l.ended {
                            tracing::info!(lease = %e.lease_id, reason = %e.reason, "lease moved away; stopping it here");
                        }
                        l.moved_away = true;
                    }
                }
                let workload = self.waiting.remove(&e.lease_id);
                match &e.to {
                    Some(to) if to.node_id == node_id => {
                        self.placed_here(e.lease_id, &to.gpus, sequence, envelope);
                        if let (Some(workload), Some(l)) =
                            (workload, self.leases.get_mut(&e.lease_id))
                        {
                            l.workload = Workload::Known(workload);
                        }
                    }
                    _ => {}
                }
            }
            other => {
                // Every event on a lease's subject counts toward the sequence
                // the guarded `lease.started` and `lease.suspended` expect.
                let Some(lease_id) = other.lease_id() else {
                    return;
                };
                // Ended before a placement (stopped while waiting).
                if let EventData::LeaseEnded(_) = other {
                    self.waiting.remove(&lease_id);
                }
                let Some(l) = self.leases.get_mut(&lease_id) else {
                    return;
                };
                l.subject_sequence = l.subject_sequence.max(sequence);
                match other {
                    EventData::LeasePreemptionNoticed(e) => {
                        l.preemption_deadline = Some(e.deadline);
                        l.preemption_reason = Some(e.reason);
                    }
                    // A gang's members start each their own part.
                    EventData::LeaseStarted(e) if l.gang.is_none() || e.node_id == node_id => {
                        l.started = true
                    }
                    EventData::LeaseGpuFault(e)
                        if e.node_id == node_id && sequence > l.placement_sequence =>
                    {
                        l.application_fault = true
                    }
                    EventData::LeaseStopRequested(_) => l.stop_requested = true,
                    EventData::LeaseMemberCompleted(e)
                        if l.gang.is_some() && sequence > l.placement_sequence =>
                    {
                        l.members_completed.insert(e.node_id.clone());
                    }
                    EventData::LeaseEnded(_) => l.ended = true,
                    // Its run here is over; a resume places it afresh.
                    EventData::LeaseSuspended(_) => l.ended = true,
                    // An agent that restarts between the idle report and the
                    // suspension still owes the suspension.
                    // A gang's later member only observes; the first
                    // reports the gang idle once every member is.
                    EventData::LeaseIdleDetected(e)
                        if sequence > l.placement_sequence
                            && l.gang.as_ref().is_some_and(|g| g.first_node() != e.node_id) =>
                    {
                        l.members_idle.insert(e.node_id.clone(), e.at);
                        l.members_idle_since.insert(e.node_id.clone(), e.idle_since);
                    }
                    EventData::LeaseIdleDetected(e)
                        if e.action == lh_events::IdleAction::Suspend
                            && sequence > l.placement_sequence =>
                    {
                        l.suspend_requested = true
                    }
                    _ => {}
                }
            }
        }
    }

    fn placed_here(
        &mut self,
        lease_id: Uuid,
        gpus: &[AssignedGpu],
        sequence: u64,
        envelope: &Envelope,
    ) {
        // Folded already (relayed twice): it stands as it is.
        if self
            .leases
            .get(&lease_id)
            .is_some_and(|l| l.placement_sequence == sequence)
        {
            return;
        }
        let l = self.leases.entry(lease_id).or_default();
        // Moved to other GPUs of this node: what runs for the old placement
        // must stop, whatever comes next (a start, or a stop first).
        let stale_workload = l.stale_workload
            || l.workload_running
            || matches!(
                l.start,
                WorkloadStart::Asked | WorkloadStart::Answered(Ok(true))
            );
        *l = LocalLease {
            subject_sequence: sequence,
            placement_sequence: sequence,
            correlation_id: envelope.correlation_id,
            tenant_id: envelope.tenant_id,
            gpus: gpus.to_vec(),
            // A stop asked before it came here still holds.
            stop_requested: l.stop_requested,
            workload: std::mem::take(&mut l.workload),
            stale_workload,
            ..LocalLease::default()
        };
    }

    /// What to do next about each lease that has not ended here, at `now`
    /// (a preemption deadline falls due with time). At most one step per
    /// lease, in lease order.
    pub(crate) fn decide(&self, now: DateTime<Utc>) -> Vec<LeaseStep> {
        let mut steps = Vec::new();
        let due = |l: &&LocalLease| !l.ended || l.workload_running;
        for (&lease_id, lease) in self.leases.iter().filter(|(_, l)| due(l)) {
            // Moved away, or ended by another (a gang's member whose part
            // still runs when the gang ends): it stops here, unreported.
            if lease.moved_away || lease.ended {
                steps.push(LeaseStep::Leave { lease_id });
                continue;
            }
            let preempt_now = lease.preemption_deadline.is_some_and(|d| now >= d);
            if lease.preemption_deadline.is_some()
                && !preempt_now
                && lease.workload_running
                && !lease.notice_told
                && !lease.stop_requested
            {
                steps.push(LeaseStep::Notify { lease_id });
            }
            let ending = lease.stop_requested || preempt_now;
            let suspending = lease.suspend_requested && lease.started && !ending;
            if (ending || suspending) && lease.workload_running {
                // The end is reported when the workload has exited.
                steps.push(LeaseStep::StopWorkload { lease_id });
                continue;
            }
            if lease.stopping && lease.exit.is_none() {
                continue;
            }
            // A workload that finished on its own before the suspension
            // ends the lease as usual.
            let exited_by_itself = lease.exit.is_some() && !lease.stopping;
            // A gang's later part that ran and completed before its start
            // was on the log: the start is told first, then the completion
            // (the gang waits for both).
            if lease.follows()
                && !lease.started
                && exited_by_itself
                && lease.exit.and_then(|e| e.code) == Some(0)
                && !ending
            {
                steps.push(LeaseStep::Start { lease_id });
                continue;
            }
            if suspending && !exited_by_itself {
                // A gang's suspension is its first member's to report.
                if lease.follows() {
                    continue;
                }
                steps.push(LeaseStep::Suspend { lease_id });
            } else if ending || lease.exit.is_some() {
                let exit_code = lease.exit.and_then(|e| e.code);
                let reason = if !lease.started && exited_by_itself && lease.failure.is_some() {
                    // A container that never ran: its image missing, or
                    // past its start deadline. Failed, and never billed.
                    EndReason::Failed
                } else if !lease.started {
                    EndReason::Cancelled
                } else if lease.stop_requested {
                    EndReason::Stopped
                } else if preempt_now {
                    EndReason::Preempted
                } else if exit_code == Some(0) {
                    EndReason::Completed
                } else {
                    EndReason::Failed
                };
                // A workload that never ran cannot have met a fault of
                // its GPU.
                // A gang's later member holds its GPUs until the first
                // reports the end, unless its own part failed; a part that
                // completed says so, once, and the first member ends the
                // gang when its own and every other part have.
                if lease.follows() && reason != EndReason::Failed {
                    if reason == EndReason::Completed && !lease.own_part_told() {
                        steps.push(LeaseStep::PartCompleted { lease_id });
                    }
                    continue;
                }
                if reason == EndReason::Completed && !lease.other_parts_completed() {
                    continue;
                }
                if reason == EndReason::Failed && exited_by_itself && lease.started {
                    match self.gpu_fault_verdict(lease, now) {
                        FaultVerdict::Workload => {}
                        FaultVerdict::Hold => continue,
                        FaultVerdict::MoveOverdue => {
                            steps.push(LeaseStep::EndUnmoved {
                                lease_id,
                                exit_code,
                            });
                            continue;
                        }
                    }
                }
                steps.push(LeaseStep::End {
                    lease_id,
                    reason,
                    exit_code,
                });
            } else if !lease.started {
                steps.push(LeaseStep::Start { lease_id });
            }
        }
        steps
    }

    pub(crate) fn running(&self) -> usize {
        self.running_here().count()
    }

    /// Leases that hold GPUs here now: placed (started or about to), not
    /// ended or moved away.
    pub(crate) fn holding(&self) -> impl Iterator<Item = (&Uuid, &LocalLease)> {
        self.leases
            .iter()
            .filter(|(_, l)| !l.ended && !l.moved_away)
    }

    /// The leases of [`NodeState::holding`] that have started.
    pub(crate) fn running_here(&self) -> impl Iterator<Item = (&Uuid, &LocalLease)> {
        self.holding().filter(|(_, l)| l.started)
    }
}

#[cfg(test)]
mod tests;
