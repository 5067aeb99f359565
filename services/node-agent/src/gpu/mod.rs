//! The agent's GPU side: which backend it reads, what it makes of the
//! readings (health transitions, faults charged to leases, usage, idle
//! leases, self-tests) and the events and metrics that come of them.

pub mod backend;
pub mod config;
pub mod health;
pub mod inventory;
pub(crate) mod mig;
pub mod self_test;
pub mod usage;
pub mod watch;
pub mod xid;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_events::{
    derived_id, Actor, Envelope, EventData, GpuHealth, IdleAction, IdlePolicy, LeaseGpuFault,
    LeaseIdleDetected, LeaseStopRequested, NodeGpuHealthChanged, NodeGpuSelfTested, NodeRegistered,
};
use lh_service::clock::SharedClock;
use lh_telemetry::MetricsSection;
use uuid::Uuid;

use crate::state::{FaultHold, NodeState};
use backend::{GpuBackend, GpuEvent, GpuSample};
pub use config::{BackendKind, GpuArgs};
use health::{NodeHealth, Outcome, Transition};
pub use inventory::open;
use self_test::{kill_load, spawn_load, Finished, SelfTests, Step};
use usage::{NodeGpu, RunningLease};
use watch::Observation;

/// Longest the MIG instances on the GPUs go unread: an operator's instance
/// keeps the scheduler off its slots this long at most after it is made.
pub const MAX_MIG_READ_EVERY_SECS: u64 = 600;

/// How often a gang's later member renews its report while its GPUs stay
/// idle, at most (a shorter idle window renews each window).
pub const GANG_IDLE_RENEW_SECS: u64 = 30;

/// How much older than its renewal a gang member's idle report may be and
/// still speak for the member (usage samples and the relay between).
pub const GANG_IDLE_REPORT_SLACK_SECS: u64 = 60;

/// How often a gang's later member renews its idle report.
fn gang_idle_renew(window: Duration) -> Duration {
    window.min(Duration::from_secs(GANG_IDLE_RENEW_SECS))
}

/// What the agent knows and does about its GPUs between events.
pub struct GpuSide {
    backend: Arc<dyn GpuBackend>,
    /// Stamps samples and the events the GPU side appends.
    clock: SharedClock,
    period: Duration,
    /// How often the MIG instances on the GPUs are read.
    mig_period: Duration,
    health: NodeHealth,
    seeded: bool,
    stopped: bool,
    gpus: Vec<NodeGpu>,
    hostname: String,
    section: MetricsSection,
    usage_every: Duration,
    last_usage: Option<DateTime<Utc>>,
    idle_default: IdlePolicy,
    self_tests: Option<SelfTests>,
    self_test_command: Option<String>,
    self_test_secs: u64,
    /// The last transition of each GPU and when it was last sent, to send
    /// again until the log shows it (a publish that failed must not leave
    /// the scheduler placing on a GPU it thinks healthy).
    last_transition: BTreeMap<u32, (Transition, std::time::Instant)>,
    fault_hold: FaultHold,
    /// Load commands of the self-tests running now, by GPU.
    loads: BTreeMap<u32, std::process::Child>,
    busy: BTreeSet<u32>,
}

impl Drop for GpuSide {
    fn drop(&mut self) {
        for (_, mut child) in std::mem::take(&mut self.loads) {
            kill_load(&mut child);
        }
    }
}

impl GpuSide {
    pub fn new(
        args: &GpuArgs,
        backend: Arc<dyn GpuBackend>,
        inventory: &NodeRegistered,
        section: MetricsSection,
        clock: SharedClock,
    ) -> Self {
        let rules = args.rules();
        let indices: Vec<u32> = inventory.gpus.iter().map(|g| g.index).collect();
        let self_tests = (args.self_test_every_secs > 0).then(|| {
            // At 0 from the start, so that the first failure is an increase
            // that `increase()` in an alert rule sees.
            for result in ["passed", "failed"] {
                metrics::counter!("lh_node_gpu_self_tests_total", "result" => result).increment(0);
            }
            let tests = SelfTests::new(
                indices.iter().copied(),
                Duration::from_secs(args.self_test_every_secs),
                Duration::from_secs(args.self_test_secs),
                rules.clone(),
                clock.now(),
            );
            match args.self_test_command {
                Some(_) => tests.with_command(),
                None => tests,
            }
        });
        Self {
            backend,
            clock,
            period: Duration::from_millis(args.sample_ms),
            mig_period: Duration::from_secs(args.mig_read_every_secs.min(MAX_MIG_READ_EVERY_SECS)),
            health: NodeHealth::new(indices, rules),
            seeded: false,
            stopped: false,
            gpus: inventory
                .gpus
                .iter()
                .map(|g| NodeGpu {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    model: g.model.clone(),
                })
                .collect(),
            hostname: inventory.hostname.clone(),
            section,
            usage_every: Duration::from_secs(args.usage_interval_secs),
            last_usage: None,
            idle_default: IdlePolicy {
                window_seconds: args.idle_window_secs,
                action: args.idle_action,
            },
            self_tests,
            self_test_command: args.self_test_command.clone(),
            self_test_secs: args.self_test_secs,
            loads: BTreeMap::new(),
            last_transition: BTreeMap::new(),
            fault_hold: FaultHold {
                hold: Duration::from_secs(args.gpu_fault_hold_secs),
                move_wait: Duration::from_secs(args.gpu_fault_move_wait_secs),
            },
            busy: BTreeSet::new(),
        }
    }

    /// How the agent holds a lease whose workload died with a GPU fault.
    pub(crate) fn fault_hold(&self) -> FaultHold {
        self.fault_hold
    }

    /// Starts reading the backend.
    pub fn watch(&self) -> tokio::sync::mpsc::Receiver<Observation> {
        watch::spawn(
            self.backend.clone(),
            self.period,
            self.mig_period,
            self.clock.clone(),
        )
    }

    /// Takes the log's health of each GPU, once, before the first judgement.
    pub fn seed(&mut self, recorded: &BTreeMap<u32, GpuHealth>) {
        if std::mem::replace(&mut self.seeded, true) {
            return;
        }
        for (&index, &health) in recorded {
            self.health.assume(index, health);
        }
    }

    /// The host does not answer: no heartbeats, nothing published.
    pub fn node_stopped(&self) -> bool {
        self.stopped
    }

    /// Tells the backend which GPUs leases hold (the simulated one plays a
    /// load on them).
    pub(crate) fn set_busy(&mut self, state: &NodeState) {
        let busy: BTreeSet<u32> = state
            .running_here()
            .flat_map(|(_, l)| l.gpus.iter().map(|g| g.index))
            .collect();
        if busy != self.busy {
            self.backend.set_busy(&busy);
            self.busy = busy;
        }
    }

    /// Judges one observation, at `now`, against what the log says of the
    /// node's leases.
    pub(crate) fn observe(
        &mut self,
        node_id: &str,
        state: &mut NodeState,
        observation: Observation,
        now: DateTime<Utc>,
    ) -> Judgement {
        let mut out = Judgement {
            node_id: node_id.to_string(),
            now,
            ..Judgement::default()
        };
        match observation {
            Observation::Events(events) => {
                for event in &events {
                    self.fault(&mut out, state, event);
                }
            }
            Observation::Samples { at, samples } => self.samples(&mut out, state, &samples, at),
            Observation::NodeStopped => {
                tracing::warn!(node = node_id, "the host stopped answering: going silent");
                self.stopped = true;
                // No readings: no series, rather than the last ones forever.
                self.section.set(String::new());
            }
            Observation::NodeBack => {
                tracing::info!(node = node_id, "the host answers again");
                self.stopped = false;
                out.act = true;
            }
            // The agent itself sorts them, against its leases.
            Observation::MigDevices(_) => {}
            Observation::Failed(why) => {
                tracing::warn!(node = node_id, error = %why, "GPU backend call failed");
            }
        }
        // What the decision on a workload that died needs: whether its GPU
        // failed under it, before the log can say so.
        let unhealthy = self.health.unhealthy_gpus();
        if unhealthy != state.unhealthy_gpus {
            state.unhealthy_gpus = unhealthy;
            out.act = true;
        }
        out
    }

    fn fault(&mut self, out: &mut Judgement, state: &mut NodeState, event: &GpuEvent) {
        // An application XID is charged to the lease on the GPU; on a GPU
        // that several leases share, the driver's event does not say whose.
        let holders: Vec<Uuid> = state
            .running_here()
            .filter(|(_, l)| l.gpus.iter().any(|g| g.index == event.index))
            .map(|(id, _)| *id)
            .collect();
        let lease = match holders.as_slice() {
            [one] => Some(*one),
            _ => None,
        };
        match self.health.fault(event, lease, event.at) {
            Outcome::Transition(t) => self.transition(out, &t),
            Outcome::ChargedToLease {
                lease_id,
                gpu_index,
                xid,
                at,
            } => {
                let lease = state.leases.get_mut(&lease_id);
                let tenant_id = lease.as_ref().and_then(|l| l.tenant_id);
                if let Some(l) = lease {
                    // Its workload's failure is its own: no hold for a fault.
                    l.application_fault = true;
                }
                let id = derived_id(&[
                    "lease.gpu_fault",
                    &lease_id.to_string(),
                    &gpu_index.to_string(),
                    &xid.to_string(),
                    &at.to_rfc3339(),
                ]);
                let data = EventData::LeaseGpuFault(LeaseGpuFault {
                    lease_id,
                    node_id: out.node_id.clone(),
                    gpu_index,
                    xid,
                    at,
                });
                tracing::info!(lease = %lease_id, gpu = gpu_index, xid, "application XID charged to the lease");
                out.event(id, data, tenant_id);
            }
            Outcome::Ignored { gpu_index, reason } => {
                let reason = if holders.len() > 1 {
                    format!("{reason}; the GPU is shared by {} leases", holders.len())
                } else {
                    reason
                };
                tracing::info!(gpu = gpu_index, %reason, "GPU event ignored");
            }
            Outcome::AlreadyUnhealthy { gpu_index, reason } => {
                tracing::info!(gpu = gpu_index, %reason, "fault on a GPU already unhealthy");
            }
        }
    }

    fn samples(
        &mut self,
        out: &mut Judgement,
        state: &mut NodeState,
        samples: &[GpuSample],
        at: DateTime<Utc>,
    ) {
        for t in self.health.observe(samples, at) {
            self.transition(out, &t);
        }
        self.resend_unrecorded(out, state);
        self.export_health(state);
        let running: Vec<RunningLease> = state
            .running_here()
            .map(|(id, l)| RunningLease {
                lease_id: *id,
                tenant_id: l.tenant_id,
                gpus: l.gpus.clone(),
            })
            .collect();
        let leases_usage = usage::attribute(&out.node_id, &running, samples, at);
        self.section.set(usage::render_dcgm(
            &self.hostname,
            &self.gpus,
            samples,
            &leases_usage,
        ));
        let due = self
            .last_usage
            .is_none_or(|last| (at - last).to_std().unwrap_or_default() >= self.usage_every);
        for u in &leases_usage {
            let suspend = self.idle(out, state, u, at);
            out.act |= suspend;
        }
        if due {
            self.last_usage = Some(at);
            out.usage = leases_usage;
        }
        let held: BTreeSet<u32> = state
            .holding()
            .flat_map(|(_, l)| l.gpus.iter().map(|g| g.index))
            .collect();
        let free: BTreeSet<u32> = self
            .gpus
            .iter()
            .map(|g| g.index)
            .filter(|i| !held.contains(i))
            .collect();
        let finished = self.run_self_tests(samples, &free, at);
        for f in finished {
            let id = derived_id(&[
                "node.gpu_self_tested",
                &out.node_id,
                &f.gpu_index.to_string(),
                &f.at.to_rfc3339(),
            ]);
            tracing::info!(gpu = f.gpu_index, passed = f.passed, detail = %f.detail, "self-test finished");
            metrics::counter!("lh_node_gpu_self_tests_total",
                "result" => if f.passed { "passed" } else { "failed" })
            .increment(1);
            let data = EventData::NodeGpuSelfTested(NodeGpuSelfTested {
                node_id: out.node_id.clone(),
                gpu_index: f.gpu_index,
                passed: f.passed,
                duration_seconds: f.duration.as_secs_f64(),
                detail: f.detail.clone(),
                at: f.at,
            });
            out.event(id, data, None);
            if let Some(t) = self.health.self_test(f.gpu_index, f.passed, f.at) {
                self.transition(out, &t);
            }
        }
    }

    /// Advances the self-tests one round: starts and stops their load
    /// commands and collects the tests that ended.
    fn run_self_tests(
        &mut self,
        samples: &[GpuSample],
        free: &BTreeSet<u32>,
        at: DateTime<Utc>,
    ) -> Vec<Finished> {
        let Some(tests) = &mut self.self_tests else {
            return Vec::new();
        };
        let mut finished = Vec::new();
        for step in tests.observe(samples, free, at) {
            match step {
                Step::Started(gpu) => {
                    let Some(command) = &self.self_test_command else {
                        continue;
                    };
                    let Some(device) = self.gpus.iter().find(|g| g.index == gpu) else {
                        continue;
                    };
                    match spawn_load(command, device, self.self_test_secs) {
                        Ok(child) => {
                            self.loads.insert(gpu, child);
                        }
                        Err(e) => finished.extend(tests.command_exited(
                            gpu,
                            false,
                            format!("the load command does not start: {e}"),
                            at,
                        )),
                    }
                }
                Step::Aborted(gpu) => {
                    if let Some(mut child) = self.loads.remove(&gpu) {
                        kill_load(&mut child);
                    }
                }
                Step::Finished(f) => {
                    if let Some(mut child) = self.loads.remove(&f.gpu_index) {
                        kill_load(&mut child);
                    }
                    finished.push(f);
                }
            }
        }
        let exited: Vec<(u32, std::process::ExitStatus)> = self
            .loads
            .iter_mut()
            .filter_map(|(gpu, child)| child.try_wait().ok().flatten().map(|s| (*gpu, s)))
            .collect();
        for (gpu, status) in exited {
            self.loads.remove(&gpu);
            let detail = format!("the load command ended with {status}");
            finished.extend(tests.command_exited(gpu, status.success(), detail, at));
        }
        finished
    }

    /// True when the lease is to be suspended.
    ///
    /// A gang's later member renews its report while its GPUs stay idle
    /// ([`GANG_IDLE_RENEW_SECS`]), so an older report (past the slack, for
    /// the samples and the relay between) is from a stretch that has ended.
    fn idle(
        &self,
        out: &mut Judgement,
        state: &mut NodeState,
        usage: &lh_events::telemetry::LeaseUsage,
        at: DateTime<Utc>,
    ) -> bool {
        let policies = &state.idle_policies;
        let Some(lease) = state.leases.get_mut(&usage.lease_id) else {
            return false;
        };
        // The first member of a gang whose own part completed waits for
        // the others: its GPUs are idle since, and it still judges the gang.
        let first_part_done = lease.gang.as_ref().is_some_and(|g| g.is_first())
            && !lease.stopping
            && lease.exit.and_then(|e| e.code) == Some(0);
        // NVML reads no utilisation on a GPU in MIG mode: a MIG lease would
        // always look idle, so it is not judged.
        if lease.gpus.iter().any(|g| g.mig_instance.is_some())
            || lease.stop_requested
            || lease.suspend_requested
            // Its workload is gone: its end is being decided, and a lease
            // held for a GPU fault reads idle without being so.
            || (lease.exit.is_some() && !first_part_done)
        {
            return false;
        }
        let policy = lease
            .tenant_id
            .and_then(|t| policies.get(&t).copied())
            .unwrap_or(self.idle_default);
        let window = Duration::from_secs(policy.window_seconds);
        let lease_id = usage.lease_id;
        let idle_since = match &lease.gang {
            // A gang is idle when every member is. A later member reports
            // what it sees, renewed each window while it lasts, and acts
            // on nothing.
            Some(part) if !part.is_first() => {
                let Some((idle_since, windows)) =
                    lease
                        .idle
                        .observe_renewing(usage, window, gang_idle_renew(window), at)
                else {
                    return false;
                };
                let id = derived_id(&[
                    "lease.idle_detected",
                    &lease_id.to_string(),
                    &out.node_id,
                    &idle_since.to_rfc3339(),
                    &windows.to_string(),
                ]);
                let data = EventData::LeaseIdleDetected(LeaseIdleDetected {
                    lease_id,
                    node_id: out.node_id.clone(),
                    idle_since,
                    window_seconds: policy.window_seconds,
                    action: policy.action,
                    at,
                });
                out.event(id, data, lease.tenant_id);
                return false;
            }
            // The first member, once its own GPUs have idled a window and
            // every other member's part has completed or reported its GPUs
            // idle lately.
            Some(part) => {
                let own = if first_part_done {
                    let since = lease.exit_heard_at(at);
                    let held = (at - since).to_std().unwrap_or_default();
                    (held >= window && !lease.idle.reported()).then_some(since)
                } else {
                    lease.idle.ripe(usage, window, at)
                };
                let Some(idle_since) = own else {
                    return false;
                };
                let slack = Duration::from_secs(GANG_IDLE_REPORT_SLACK_SECS);
                let fresh_for = gang_idle_renew(window) + slack;
                let fresh = |node: &str| {
                    lease.members_completed.contains(node)
                        || lease.members_idle.get(node).is_some_and(|&reported| {
                            // A report from ahead of this node's clock by
                            // more than the slack speaks for nothing.
                            let ahead = (reported - at).to_std().unwrap_or_default();
                            let age = (at - reported).to_std().unwrap_or_default();
                            ahead <= slack && age <= fresh_for
                        })
                };
                if !part.others().all(fresh) {
                    return false;
                }
                lease.idle.report();
                // The gang is idle since its last member went idle; a
                // member's clock ahead of this one's says no later than now.
                part.others()
                    .filter_map(|node| lease.members_idle_since.get(node))
                    .fold(idle_since, |latest, &since| latest.max(since))
                    .min(at)
            }
            None => {
                let Some(idle_since) = lease.idle.observe(usage, window, at) else {
                    return false;
                };
                idle_since
            }
        };
        tracing::info!(lease = %lease_id, %idle_since, action = policy.action.as_str(), "lease idle");
        let id = derived_id(&[
            "lease.idle_detected",
            &lease_id.to_string(),
            &idle_since.to_rfc3339(),
        ]);
        let data = EventData::LeaseIdleDetected(LeaseIdleDetected {
            lease_id,
            node_id: out.node_id.clone(),
            idle_since,
            window_seconds: policy.window_seconds,
            action: policy.action,
            at,
        });
        let tenant_id = lease.tenant_id;
        // Under `suspend` the loop stops the workload and reports it.
        lease.suspend_requested = policy.action == IdleAction::Suspend;
        out.event(id, data, tenant_id);
        if policy.action == IdleAction::Stop {
            // The same id as a tenant's stop: one stop, whoever asks first.
            let id = derived_id(&["lease.stop_requested", &lease_id.to_string()]);
            let data = EventData::LeaseStopRequested(LeaseStopRequested { lease_id });
            out.event(id, data, tenant_id);
        }
        policy.action == IdleAction::Suspend
    }

    /// Each GPU's health as last judged here (else as the log records it):
    /// one series per state, 1 for the state it is in, so a dashboard shows
    /// the fleet's health now and not only its changes.
    fn export_health(&self, state: &NodeState) {
        for gpu in &self.gpus {
            let now = self
                .last_transition
                .get(&gpu.index)
                .map(|(t, _)| t.to)
                .or_else(|| state.gpu_health.get(&gpu.index).copied())
                .unwrap_or(GpuHealth::Healthy);
            for health in [
                GpuHealth::Healthy,
                GpuHealth::Degraded,
                GpuHealth::Unhealthy,
            ] {
                let name = format!("{health:?}").to_lowercase();
                metrics::gauge!("lh_node_gpu_health", "gpu" => gpu.index.to_string(), "state" => name)
                    .set(if health == now { 1.0 } else { 0.0 });
            }
        }
    }

    /// Sends again, with the same id, a transition the log does not show
    /// after a while.
    fn resend_unrecorded(&mut self, out: &mut Judgement, state: &NodeState) {
        const RESEND_AFTER: Duration = Duration::from_secs(5);
        let due: Vec<Transition> = self
            .last_transition
            .values()
            .filter(|(t, sent)| {
                let recorded = state.gpu_health.get(&t.gpu_index).copied();
                recorded != Some(t.to) && sent.elapsed() >= RESEND_AFTER
            })
            .map(|(t, _)| t.clone())
            .collect();
        for t in due {
            tracing::info!(gpu = t.gpu_index, to = ?t.to, "health change not on the log yet: sending it again");
            self.transition(out, &t);
        }
    }

    fn transition(&mut self, out: &mut Judgement, t: &Transition) {
        self.last_transition
            .insert(t.gpu_index, (t.clone(), std::time::Instant::now()));
        let gpu_uuid = self
            .gpus
            .iter()
            .find(|g| g.index == t.gpu_index)
            .map(|g| g.uuid.clone())
            .unwrap_or_default();
        tracing::info!(gpu = t.gpu_index, from = ?t.from, to = ?t.to, reason = %t.reason, "GPU health changed");
        metrics::counter!("lh_node_gpu_health_transitions_total", "to" => format!("{:?}", t.to).to_lowercase())
            .increment(1);
        let id = derived_id(&[
            "node.gpu_health_changed",
            &out.node_id,
            &t.gpu_index.to_string(),
            &format!("{:?}", t.to),
            &t.at.to_rfc3339(),
        ]);
        let data = EventData::NodeGpuHealthChanged(NodeGpuHealthChanged {
            node_id: out.node_id.clone(),
            gpu_index: t.gpu_index,
            gpu_uuid,
            from: t.from,
            to: t.to,
            reason: t.reason.clone(),
            evidence: t.evidence.clone(),
            at: t.at,
        });
        out.event(id, data, None);
    }
}

/// What the GPU side made of one observation.
#[derive(Default)]
pub(crate) struct Judgement {
    node_id: String,
    /// Stamps the events.
    now: DateTime<Utc>,
    /// Events to append, each on its own and unguarded: an observation
    /// states what the node saw, which no other writer can contradict.
    pub(crate) events: Vec<Envelope>,
    /// Per-lease usage for the telemetry stream, when a report is due.
    pub(crate) usage: Vec<lh_events::telemetry::LeaseUsage>,
    /// The node's leases may call for acting (the host came back, a lease
    /// is to be suspended).
    pub(crate) act: bool,
}

impl Judgement {
    fn event(&mut self, id: Uuid, data: EventData, tenant: Option<Uuid>) {
        let mut envelope =
            Envelope::new(Actor::Node(self.node_id.clone()), self.now, data).with_id(id);
        envelope.tenant_id = tenant;
        self.events.push(envelope);
    }
}
