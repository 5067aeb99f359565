//! The agent as a [`Decider`]: it folds the log into [`NodeState`], hears
//! its GPUs and its workloads as signals, and decides what to append: its
//! registration, what its GPUs showed, and each lease's transitions. Work on
//! the host (starting and stopping workloads) goes to the workload side's
//! task as commands, whose answers come back as signals; heartbeats and
//! usage samples go to the telemetry task.
//!
//! Deciding ([`NodeAgent::decisions`]) sends nothing: it returns the events
//! to append and the commands for the host, in the order they are to go,
//! so that a test reads them as values. [`Decider::decide`] is the thin
//! shell that sends the commands and tells the GPU side and the telemetry
//! task what runs now.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_events::telemetry::LeaseUsage;
use lh_events::{
    derived_id, subject, Actor, EndReason, Envelope, EventData, Expect, LeaseEnded,
    LeaseMemberCompleted, LeaseStarted, LeaseSuspended, NodeRegistered, WorkspaceSyncReason,
};
use lh_service::decider::{Batch, Decider, Pace};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::gpu::backend::GpuDevice;
use crate::gpu::mig::{self, MigPlaced, UnownedReads};
use crate::gpu::watch::Observation;
use crate::gpu::GpuSide;
use crate::state::{LeaseStep, LocalLease, NodeState, WorkloadStart};
use crate::workload::executor::{Command, Report};

/// Most observation events waiting to be appended; past it the oldest go
/// (the log is unreachable that long, and a GPU's state has moved on).
const MOST_WAITING_EVENTS: usize = 4096;

/// Most sequences of its own events remembered until their relays come
/// back; an event of its own the scheduler never relays (a report on a
/// lease no longer placed here) is forgotten past it.
const MOST_OWN_EVENTS_REMEMBERED: usize = 4096;

/// What one decision pass calls for: the batches to append, and the
/// commands for the workload side, in the order they are to be sent.
#[derive(Debug)]
pub(crate) struct Decisions {
    pub(crate) batches: Vec<Batch>,
    pub(crate) commands: Vec<Command>,
}

/// What the agent hears besides the log.
#[derive(Debug)]
pub(crate) enum Signal {
    Gpu(Observation),
    Workload(Report),
}

/// What the telemetry task reads of the agent's state.
#[derive(Debug, Default)]
pub(crate) struct NodeStatus {
    /// Leases that hold GPUs here and have started.
    pub(crate) running_leases: AtomicUsize,
    /// The host does not answer: no heartbeats.
    pub(crate) silent: AtomicBool,
    /// The GPUs' last readings, which heartbeats carry.
    pub(crate) gpus: std::sync::Mutex<Vec<lh_events::telemetry::GpuReading>>,
}

pub(crate) struct NodeAgent {
    node_id: String,
    /// Its own view of the log (`lh.evt.node_view.<node>.>`): all it may
    /// read (docs/adr/027).
    view: [&'static str; 1],
    /// Sequences of its own events, folded as soon as they were stored:
    /// their relays back are not folded again (an older relay must not
    /// undo a newer event of its own). Oldest first, at most
    /// [`MOST_OWN_EVENTS_REMEMBERED`].
    own_events: BTreeSet<u64>,
    inventory: NodeRegistered,
    state: NodeState,
    gpu: GpuSide,
    /// Observation events not yet on the log, oldest first; each leaves
    /// once it is stored.
    waiting: Vec<Envelope>,
    workloads: mpsc::UnboundedSender<Command>,
    usage: mpsc::Sender<Vec<LeaseUsage>>,
    status: Arc<NodeStatus>,
    tick: Duration,
    reconciliation: Reconciliation,
    /// The reads of the MIG instances no lease holds, which the
    /// registration declares.
    unowned_mig: UnownedReads,
}

/// Where the reconciliation of the host at start stands: until it is done,
/// no workload is started or stopped for a lease (a start could run a
/// second copy of a workload the previous agent left running).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reconciliation {
    NotAsked,
    Asked,
    Done,
}

impl NodeAgent {
    pub(crate) fn new(
        inventory: NodeRegistered,
        gpu: GpuSide,
        workloads: mpsc::UnboundedSender<Command>,
        usage: mpsc::Sender<Vec<LeaseUsage>>,
        status: Arc<NodeStatus>,
        tick: Duration,
    ) -> Self {
        // One filter for the agent's life: leaked once, as the loop takes
        // filters that live as long as the program.
        let view: &'static str =
            Box::leak(subject::guarded(&subject::node_view(&inventory.node_id)).into_boxed_str());
        Self {
            node_id: inventory.node_id.clone(),
            view: [view],
            own_events: BTreeSet::new(),
            inventory,
            state: NodeState {
                fault_hold: gpu.fault_hold(),
                ..NodeState::default()
            },
            gpu,
            waiting: Vec::new(),
            workloads,
            usage,
            status,
            tick,
            reconciliation: Reconciliation::NotAsked,
            unowned_mig: UnownedReads::default(),
        }
    }

    /// The MIG instances the log shows held by leases placed here, and by
    /// leases moved away (the node was lost) that this agent has not left
    /// yet.
    fn mig_of_leases(&self) -> (Vec<MigPlaced>, Vec<MigPlaced>) {
        let placed = self
            .state
            .holding()
            .flat_map(|(&lease_id, l)| MigPlaced::of(lease_id, l.placement_sequence, &l.gpus))
            .collect();
        let over = self
            .state
            .leases
            .iter()
            .filter(|(_, l)| l.moved_away)
            .flat_map(|(&lease_id, l)| MigPlaced::of(lease_id, l.placement_sequence, &l.gpus))
            .collect();
        (placed, over)
    }

    /// One read of the MIG instances on the GPUs: those no lease holds are
    /// declared once two reads in a row agree. Whether the registration
    /// changed.
    fn mig_devices_read(&mut self, gpus: &[GpuDevice]) -> bool {
        let (placed, over) = self.mig_of_leases();
        let found = mig::sort_out(gpus, &placed, &over);
        let now = self.unowned_mig.unowned_in(gpus, &found);
        let Some(unowned) = self.unowned_mig.read(now) else {
            return false;
        };
        let count: usize = unowned.values().map(Vec::len).sum();
        metrics::gauge!("lh_node_mig_unowned_instances").set(count as f64);
        let changed = mig::declare(&mut self.inventory, &unowned);
        if changed {
            tracing::warn!(instances = count, unowned = ?unowned,
                "the MIG instances that no lease holds changed: registering them for the scheduler");
        }
        changed
    }

    /// Whether lease steps may be taken: the host has been reconciled with
    /// the log. The first call, once the fold has caught up (decisions come
    /// only after that), asks for the reconciliation (into `commands`).
    fn host_reconciled(&mut self, commands: &mut Vec<Command>) -> bool {
        if self.reconciliation == Reconciliation::NotAsked {
            let placed_here = self
                .state
                .holding()
                .map(|(&lease_id, l)| (lease_id, l.placement_sequence))
                .collect();
            let share_gpus = self
                .state
                .holding()
                .filter_map(|(&lease_id, l)| {
                    let gpu = l.gpus.first()?;
                    let share = gpu.milli.is_some() && gpu.mig_instance.is_none();
                    share.then(|| (lease_id, gpu.clone()))
                })
                .collect();
            // Leases moved away: a previous agent may have died before
            // destroying their instances. An ended lease's instances went
            // before its end was reported.
            let (mig_placed, mig_over) = self.mig_of_leases();
            let with_data = self
                .state
                .holding()
                .filter_map(|(&lease_id, l)| match (&l.workload, l.tenant_id) {
                    (crate::state::Workload::Known(Some(spec)), Some(tenant))
                        if spec.uses_storage() =>
                    {
                        Some((lease_id, (tenant, spec.clone())))
                    }
                    _ => None,
                })
                .collect();
            let gang_links = self
                .state
                .holding()
                .filter_map(|(&lease_id, l)| {
                    let part = l.gang.as_ref()?;
                    Some((
                        lease_id,
                        crate::workload::gang_link::GangLink::of(lease_id, part),
                    ))
                })
                .collect();
            commands.push(Command::Reconcile {
                placed_here,
                share_gpus,
                mig_placed,
                mig_over,
                with_data,
                gang_links,
            });
            self.reconciliation = Reconciliation::Asked;
        }
        self.reconciliation == Reconciliation::Done
    }

    fn registration(&self, now: DateTime<Utc>) -> Envelope {
        let fingerprint = serde_json::to_string(&self.inventory).unwrap_or_default();
        // After the registration it replaces: back to an earlier inventory
        // (an unowned MIG instance made, then destroyed) is a new event.
        let replaces = self.state.registered_sequence.to_string();
        Envelope::new(
            Actor::Node(self.node_id.clone()),
            now,
            EventData::NodeRegistered(self.inventory.clone()),
        )
        .with_id(derived_id(&["node.registered", &fingerprint, &replaces]))
    }

    /// What to append and what to ask of the host at `now`, without
    /// sending anything: the events, then the commands in the order the
    /// workload side is to carry them out. `None` while the host does not
    /// answer: it says nothing, and what runs is not retold.
    pub(crate) fn decisions(&mut self, now: DateTime<Utc>) -> Option<Decisions> {
        if self.gpu.node_stopped() {
            return None;
        }
        let mut batches = Vec::new();
        let mut commands = Vec::new();
        if !self.unowned_mig.any_declared() {
            if let Some(logged) = &self.state.registered {
                mig::declare(&mut self.inventory, &mig::declared(logged));
            }
        }
        if self.state.registered.as_ref() != Some(&self.inventory) {
            batches.push(vec![(self.registration(now), Expect::Any)]);
        }
        batches.extend(
            self.waiting
                .iter()
                .map(|envelope| vec![(envelope.clone(), Expect::Any)]),
        );
        if self.host_reconciled(&mut commands) {
            for (&lease_id, lease) in self.state.leases.iter_mut() {
                if std::mem::take(&mut lease.stale_workload) {
                    commands.push(Command::StopStale {
                        lease_id,
                        placement: lease.placement_sequence,
                    });
                }
            }
            for step in self.state.decide(now) {
                batches.extend(self.lease_step(step, now, &mut commands));
            }
        }
        // Ended leases need no memory beyond the log.
        self.state.leases.retain(|_, l| !l.ended);
        Some(Decisions { batches, commands })
    }

    /// Tells the GPU side which GPUs running leases hold, and the telemetry
    /// task how many leases run.
    fn tell_what_runs(&mut self) {
        self.gpu.set_busy(&self.state);
        self.status
            .running_leases
            .store(self.state.running(), Ordering::Relaxed);
    }

    /// The decision a lease step calls for, if one is due now; the work on
    /// the host it needs goes into `commands`, for the workload side.
    fn lease_step(
        &mut self,
        step: LeaseStep,
        now: DateTime<Utc>,
        commands: &mut Vec<Command>,
    ) -> Option<Batch> {
        let lease_id = step.lease_id();
        let lease = self.state.leases.get_mut(&lease_id)?;
        let report = match step {
            LeaseStep::Leave { .. } => {
                commands.push(Command::Stop {
                    lease_id,
                    reason: WorkspaceSyncReason::Move,
                });
                lease.workload_running = false;
                lease.ended = true;
                return None;
            }
            LeaseStep::Notify { .. } => {
                if let Some(deadline) = lease.preemption_deadline {
                    commands.push(Command::Notice {
                        lease_id,
                        deadline,
                        reason: lease.preemption_reason.unwrap_or_default(),
                    });
                }
                lease.notice_told = true;
                return None;
            }
            LeaseStep::StopWorkload { .. } => {
                let reason = if lease.suspend_requested {
                    WorkspaceSyncReason::Suspension
                } else {
                    WorkspaceSyncReason::End
                };
                commands.push(Command::Stop { lease_id, reason });
                lease.workload_running = false;
                lease.stopping = true;
                return None;
            }
            // A start under way ends, or is reported, once it is answered.
            _ if lease.start == WorkloadStart::Asked => return None,
            LeaseStep::Start { .. } => match &lease.start {
                WorkloadStart::NotAsked | WorkloadStart::Asked => {
                    lease.start = WorkloadStart::Asked;
                    commands.push(Command::Start {
                        lease_id,
                        placement: lease.placement_sequence,
                        gpus: lease.gpus.clone(),
                        workload: lease.workload.clone(),
                        tenant_id: lease.tenant_id,
                        gang: lease.gang.clone(),
                    });
                    return None;
                }
                // Its container is not run yet (its image being pulled):
                // it starts, and is billed, once it runs.
                WorkloadStart::Answered(Ok(_)) if lease.not_yet_running => return None,
                WorkloadStart::Answered(Ok(_)) => Transition::Started,
                WorkloadStart::Answered(Err(why)) => {
                    // It cannot run here: the lease fails, never started,
                    // so nothing is billed.
                    tracing::warn!(lease = %lease_id, error = %why, "workload does not start");
                    Transition::Ended {
                        reason: EndReason::Failed,
                        exit_code: None,
                        at: now,
                    }
                }
            },
            LeaseStep::Suspend { .. } => Transition::Suspended,
            LeaseStep::PartCompleted { .. } => Transition::PartCompleted,
            LeaseStep::End {
                reason, exit_code, ..
            } => Transition::Ended {
                reason,
                exit_code,
                at: match reason {
                    // A gang completes when its last part is heard of: its
                    // GPUs were all held till then.
                    EndReason::Completed if lease.gang.is_some() => now,
                    EndReason::Completed | EndReason::Failed => lease.exit_heard_at(now),
                    _ => now,
                },
            },
            LeaseStep::EndUnmoved { exit_code, .. } => {
                tracing::warn!(lease = %lease_id, code = ?exit_code,
                    wait_secs = self.state.fault_hold.move_wait.as_secs(),
                    "workload died with its GPU unhealthy, but no move came in time: the lease fails");
                Transition::Ended {
                    reason: EndReason::Failed,
                    exit_code,
                    at: lease.exit_heard_at(now),
                }
            }
        };
        if matches!(report, Transition::Suspended | Transition::Ended { .. }) {
            commands.push(Command::Release { lease_id });
        }
        Some(vec![report.event(&self.node_id, lease_id, lease, now)])
    }
}

/// A lease transition the agent reports.
enum Transition {
    Started,
    Suspended,
    /// A gang's later member's part completed; the gang goes on.
    PartCompleted,
    Ended {
        reason: EndReason,
        exit_code: Option<i32>,
        /// When the lease ended: for a workload that ended by itself, when
        /// that was heard, so that waiting to tell a GPU's fault from the
        /// workload's own is not billed.
        at: DateTime<Utc>,
    },
}

impl Transition {
    /// The event, with its guard. A migrated lease starts (and is
    /// suspended) once per placement; it ends only once. Start and
    /// suspension are guarded: a stop that arrived meanwhile must win.
    fn event(
        self,
        node_id: &str,
        lease_id: Uuid,
        lease: &LocalLease,
        now: DateTime<Utc>,
    ) -> (Envelope, Expect) {
        let placement = lease.placement_sequence.to_string();
        let guard = Expect::LastSubjectSequence(lease.subject_sequence);
        let (data, id, expect) = match self {
            Transition::Started => (
                EventData::LeaseStarted(LeaseStarted {
                    lease_id,
                    node_id: node_id.to_string(),
                    started_at: now,
                    mig_devices: lease.mig_devices.clone(),
                }),
                // A gang's members each start their own part.
                match &lease.gang {
                    None => derived_id(&["lease.started", &lease_id.to_string(), &placement]),
                    Some(_) => {
                        derived_id(&["lease.started", &lease_id.to_string(), &placement, node_id])
                    }
                },
                guard,
            ),
            Transition::Suspended => (
                EventData::LeaseSuspended(LeaseSuspended {
                    lease_id,
                    node_id: node_id.to_string(),
                    gpu_indices: lease.gpus.iter().map(|g| g.index).collect(),
                    suspended_at: now,
                    reason: "idle under the tenant's suspend policy".into(),
                }),
                derived_id(&["lease.suspended", &lease_id.to_string(), &placement]),
                guard,
            ),
            Transition::PartCompleted => (
                EventData::LeaseMemberCompleted(LeaseMemberCompleted {
                    lease_id,
                    node_id: node_id.to_string(),
                }),
                derived_id(&[
                    "lease.member_completed",
                    &lease_id.to_string(),
                    &placement,
                    node_id,
                ]),
                guard,
            ),
            Transition::Ended {
                reason,
                exit_code,
                at,
            } => (
                EventData::LeaseEnded(LeaseEnded {
                    lease_id,
                    node_id: Some(node_id.to_string()),
                    ended_at: at,
                    reason,
                    exit_code,
                    // A stop or a preemption may have cut the workload
                    // short; only a failure has a cause.
                    failure: lease.failure.filter(|_| reason == EndReason::Failed),
                }),
                derived_id(&["lease.ended", &lease_id.to_string()]),
                Expect::Any,
            ),
        };
        let mut envelope = Envelope::new(Actor::Node(node_id.to_string()), now, data).with_id(id);
        envelope.correlation_id = lease.correlation_id;
        envelope.tenant_id = lease.tenant_id;
        (envelope, expect)
    }
}

impl NodeAgent {
    fn fold(&mut self, sequence: u64, envelope: &Envelope) {
        // An observation stored although its acknowledgement was lost (the
        // server went away) is on the log: it no longer waits.
        if !self.waiting.is_empty() {
            self.waiting.retain(|w| w.id != envelope.id);
        }
        self.state.apply(&self.node_id, sequence, envelope);
    }
}

impl Decider for NodeAgent {
    type Signal = Signal;

    fn name(&self) -> &'static str {
        "node-agent"
    }

    /// Its fold keeps what this node runs, not when anything happened:
    /// the times nodes report are the scheduler's and pricing's to hold.
    fn node_clock_skew(&self) -> Option<chrono::Duration> {
        None
    }

    fn filters(&self) -> &[&'static str] {
        &self.view
    }

    fn pace(&self) -> Pace {
        // Preemption deadlines fall due with time, not with events.
        Pace {
            tick: self.tick,
            ..Pace::default()
        }
    }

    fn snapshot(&self) -> Option<Box<serde_json::value::RawValue>> {
        lh_service::decider::snapshot_of(&self.state.snapshot()?)
    }

    fn restore(&mut self, state: &serde_json::value::RawValue) -> bool {
        lh_service::decider::restored(state).is_some_and(|state| self.state.restore(state))
    }

    /// One per node: each agent's fold keeps its own node's leases. Named
    /// for the view it folds, not for the whole log an older agent read.
    fn snapshot_key(&self) -> String {
        format!("node-agent-view-{}", self.node_id)
    }

    /// A relay of its view, or one of its own events as soon as it is
    /// stored (it reads nothing else).
    fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        match &envelope.data {
            EventData::NodeViewRelayed(relay) => {
                if relay.node_id != self.node_id {
                    return;
                }
                for p in &relay.idle_policies {
                    self.state.idle_policies.insert(p.tenant_id, p.policy);
                }
                for e in &relay.events {
                    if self.own_events.remove(&e.sequence) {
                        continue;
                    }
                    self.fold(e.sequence, &e.envelope);
                }
            }
            _ => {
                self.own_events.insert(sequence);
                if self.own_events.len() > MOST_OWN_EVENTS_REMEMBERED {
                    self.own_events.pop_first();
                }
                self.fold(sequence, envelope);
            }
        }
    }

    fn signal(&mut self, signal: Signal, now: DateTime<Utc>) -> bool {
        match signal {
            Signal::Gpu(Observation::MigDevices(gpus)) => self.mig_devices_read(&gpus),
            Signal::Gpu(observation) => {
                if let Observation::Samples { samples, .. } = &observation {
                    let readings = samples
                        .iter()
                        .take(lh_events::telemetry::MOST_GPU_READINGS)
                        .map(|s| lh_events::telemetry::GpuReading {
                            index: s.index,
                            utilization_pct: s.utilization_pct,
                            memory_used_mib: s.memory_used_mib,
                            memory_total_mib: s.memory_total_mib,
                            temperature_c: s.temperature_c,
                        })
                        .collect();
                    *self.status.gpus.lock().unwrap_or_else(|e| e.into_inner()) = readings;
                }
                // Judged against the log's health, which the fold has
                // caught up with before any signal is heard.
                self.gpu.seed(&self.state.gpu_health);
                let judgement = self
                    .gpu
                    .observe(&self.node_id, &mut self.state, observation, now);
                self.status
                    .silent
                    .store(self.gpu.node_stopped(), Ordering::Relaxed);
                if !judgement.usage.is_empty() && self.usage.try_send(judgement.usage).is_err() {
                    tracing::debug!("usage report dropped: the telemetry task is behind");
                }
                let new_events = !judgement.events.is_empty();
                self.waiting.extend(judgement.events);
                if self.waiting.len() > MOST_WAITING_EVENTS {
                    let dropped = self.waiting.len() - MOST_WAITING_EVENTS;
                    tracing::warn!(dropped, "observations not appended in time are dropped");
                    self.waiting.drain(..dropped);
                }
                judgement.act || new_events
            }
            Signal::Workload(Report::Started {
                lease_id,
                placement,
                outcome,
                mig_devices,
                not_yet_running,
            }) => {
                self.unowned_mig.made_for_a_lease(&mig_devices);
                let current = |l: &&mut LocalLease| l.placement_sequence == placement;
                if let Some(l) = self.state.leases.get_mut(&lease_id).filter(current) {
                    l.workload_running = outcome == Ok(true);
                    l.not_yet_running = outcome == Ok(true) && not_yet_running;
                    l.mig_devices = mig_devices;
                    l.start = WorkloadStart::Answered(outcome);
                }
                true
            }
            Signal::Workload(Report::Running {
                lease_id,
                placement,
            }) => {
                let current = |l: &&mut LocalLease| l.placement_sequence == placement;
                if let Some(l) = self.state.leases.get_mut(&lease_id).filter(current) {
                    l.not_yet_running = false;
                }
                true
            }
            Signal::Workload(Report::Reconciled { adopted }) => {
                // An adopted workload runs for its placement as if started
                // here: a stop reaches it, its exit is reported, and a start
                // still to report finds it running.
                for (lease_id, placement) in adopted {
                    let current = |l: &&mut LocalLease| l.placement_sequence == placement;
                    if let Some(l) = self.state.leases.get_mut(&lease_id).filter(current) {
                        l.workload_running = true;
                    }
                }
                self.reconciliation = Reconciliation::Done;
                true
            }
            Signal::Workload(Report::Ended(f)) => {
                let current = |l: &&mut LocalLease| l.placement_sequence == f.placement;
                if let Some(l) = self.state.leases.get_mut(&f.lease_id).filter(current) {
                    tracing::info!(lease = %f.lease_id, code = ?f.exit.code, signal = ?f.exit.signal, "workload ended");
                    l.exit = Some(f.exit);
                    l.failure = f.failure;
                    l.exited_at = Some(now);
                    l.workload_running = false;
                }
                true
            }
        }
    }

    fn decide(&mut self, now: DateTime<Utc>) -> Vec<Batch> {
        let Some(Decisions { batches, commands }) = self.decisions(now) else {
            return Vec::new();
        };
        // The workload side's task ends only with the agent, so a send does
        // not fail while it matters.
        for command in commands {
            let _ = self.workloads.send(command);
        }
        self.tell_what_runs();
        batches
    }

    fn appended(&mut self, batch: &Batch) {
        for (envelope, _) in batch {
            self.waiting.retain(|w| w.id != envelope.id);
            match &envelope.data {
                EventData::NodeRegistered(e) => {
                    tracing::info!(node = %e.node_id, gpus = e.gpus.len(), "node registered")
                }
                EventData::LeaseStarted(_)
                | EventData::LeaseSuspended(_)
                | EventData::LeaseEnded(_) => {
                    let event_type = envelope.data.event_type();
                    metrics::counter!("lh_node_lease_transitions_total", "type" => event_type)
                        .increment(1);
                    tracing::info!(lease = ?envelope.data.lease_id(), event = event_type, "lease transition");
                }
                _ => {}
            }
        }
        self.state.leases.retain(|_, l| !l.ended);
        self.tell_what_runs();
    }
}

#[cfg(test)]
mod tests;
