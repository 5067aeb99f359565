//! Node-agent: one per GPU host. Registers the node's inventory, heartbeats,
//! starts the leases placed on it and stops them when asked, reporting
//! `lease.started` / `lease.ended` with its own timestamps (pricing bills
//! from those).
//!
//! This version drives a simulated host described by a fleet file (see
//! [`fleet_file`]). What a lease runs depends on `--runtime`: with `sim` a
//! lease "runs" from start until it is stopped; with `process`, `docker` or
//! `podman` its workload runs (see [`workloads`]), its exit ends the lease
//! with the exit code, and a stop is SIGTERM, a grace period, then SIGKILL.
//! The agent learns what it should be running from the log at start, so a
//! restarted agent picks up where it was.

pub mod backend;
pub mod fleet_file;
pub mod gpu_watch;
pub mod gpus;
pub mod health;
pub mod runtime;
pub mod self_test;
pub mod usage;
pub mod workloads;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use lh_bus::{Bus, BusError, Expect};
use lh_events::telemetry::Heartbeat;
use lh_events::{
    derived_id, subject, Actor, AssignedGpu, EndReason, Envelope, EventData, GpuHealth, IdlePolicy,
    LeaseEnded, LeaseStarted, LeaseSuspended, NodeRegistered, WorkloadSpec,
};
use lh_service::{CancellationToken, CommonArgs, Readiness, Running};
use uuid::Uuid;
use workloads::{Finished, RuntimeKind, Workloads};

pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9110";
const QUIET: Duration = Duration::from_millis(100);

#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "lh-node-agent",
    about = "Leasehold node-agent (simulated GPU host)"
)]
pub struct Config {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Fleet file describing the simulated nodes.
    #[arg(long, env = "LH_FLEET_FILE", default_value = "dev/fleet.toml")]
    pub fleet_file: PathBuf,
    /// Which node of the fleet file this agent is.
    #[arg(long, env = "LH_NODE_ID")]
    pub node_id: String,
    /// Heartbeat period on the telemetry stream.
    #[arg(long, env = "LH_HEARTBEAT_MS", default_value_t = 1_000)]
    pub heartbeat_ms: u64,
    /// How leases run: `sim` (nothing runs; a lease lasts until stopped),
    /// `process` (its workload command), `docker` / `podman` (its image).
    #[arg(long, env = "LH_RUNTIME", value_enum, default_value_t = RuntimeKind::Sim)]
    pub runtime: RuntimeKind,
    /// The docker or podman binary (default: found on PATH).
    #[arg(long, env = "LH_CONTAINER_CLI")]
    pub container_cli: Option<PathBuf>,
    /// Seconds a stopped workload gets between SIGTERM and SIGKILL.
    #[arg(long, env = "LH_STOP_GRACE_SECS", default_value_t = 30)]
    pub stop_grace_secs: u64,
    #[command(flatten)]
    pub gpus: gpus::GpuArgs,
}

impl Config {
    pub fn for_test(nats_url: &str, fleet_file: PathBuf, node_id: &str) -> Self {
        Self {
            common: CommonArgs::for_test(nats_url),
            fleet_file,
            node_id: node_id.to_string(),
            heartbeat_ms: 500,
            runtime: RuntimeKind::Sim,
            container_cli: None,
            stop_grace_secs: 30,
            gpus: gpus::GpuArgs::for_test(),
        }
    }
}

pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    config.gpus.validate()?;
    let (backend, inventory) = gpus::open(&config.gpus, &config.fleet_file, &config.node_id)?;
    let service = format!("lh-node-agent-{}", config.node_id);
    let bus = config.common.connect_bus(&service).await?;
    let readiness = Readiness::default();
    let ready = readiness.clone();
    let heartbeat = Duration::from_millis(config.heartbeat_ms.max(10));
    let grace = Duration::from_secs(config.stop_grace_secs);
    let runtime = (config.runtime, config.container_cli.clone());
    let section = lh_telemetry::MetricsSection::default();
    let gpu_side = gpus::GpuSide::new(&config.gpus, backend, &inventory, section.clone());
    Running::spawn_with_metrics(
        config.common.http_addr_or(DEFAULT_HTTP_ADDR),
        axum::Router::new(),
        readiness,
        section,
        shutdown,
        async move {
            let (workloads, finished) = Workloads::new(runtime.0, runtime.1, grace)?;
            agent(
                bus, inventory, heartbeat, ready, workloads, finished, gpu_side,
            )
            .await
        },
    )
    .await
}

/// What the log says about one lease placed on this node.
#[derive(Debug, Clone, Default)]
struct LocalLease {
    started: bool,
    stop_requested: bool,
    /// A spot lease preempted for an on-demand one ends at this instant.
    preemption_deadline: Option<chrono::DateTime<Utc>>,
    ended: bool,
    subject_sequence: u64,
    /// Stream sequence of the placement on this node (`lease.placed`, or a
    /// `lease.migrated` here): a lease that comes back starts afresh.
    placement_sequence: u64,
    correlation_id: Uuid,
    tenant_id: Option<Uuid>,
    /// The GPUs it holds here.
    gpus: Vec<AssignedGpu>,
    /// Moved to another node: its workload stops here, nothing is reported.
    moved_away: bool,
    /// A stop was sent to its workload; the end is reported once it exits.
    stopping: bool,
    /// Its workload ended (on its own, or stopped).
    exit: Option<runtime::Exit>,
    /// Its GPUs' idle stretch, while it runs.
    idle: usage::IdleWatch,
    /// Idle under a `suspend` policy: its workload stops and the lease is
    /// reported suspended, not ended.
    suspend_requested: bool,
}

#[derive(Default)]
struct NodeState {
    registered: Option<NodeRegistered>,
    leases: BTreeMap<Uuid, LocalLease>,
    /// Workloads of requested leases, until they end (any node's: the
    /// request comes before the placement).
    specs: HashMap<Uuid, WorkloadSpec>,
    /// The health the log last recorded for each of this node's GPUs.
    gpu_health: BTreeMap<u32, GpuHealth>,
    /// Tenants' idle policies, where they set one.
    idle_policies: HashMap<Uuid, IdlePolicy>,
}

impl NodeState {
    fn apply(&mut self, node_id: &str, sequence: u64, envelope: &Envelope) {
        match &envelope.data {
            EventData::NodeRegistered(e) if e.node_id == node_id => {
                self.registered = Some(e.clone());
            }
            EventData::NodeGpuHealthChanged(e) if e.node_id == node_id => {
                self.gpu_health.insert(e.gpu_index, e.to);
            }
            EventData::TenantCreated(e) => {
                if let Some(p) = e.idle_policy {
                    self.idle_policies.insert(e.tenant_id, p);
                }
            }
            EventData::LeaseRequested(e) => {
                if let Some(w) = &e.workload {
                    self.specs.insert(e.lease_id, w.clone());
                }
            }
            EventData::LeaseRejected(e) => {
                self.specs.remove(&e.lease_id);
            }
            EventData::LeasePlaced(e) if e.node_id == node_id => {
                self.placed_here(e.lease_id, &e.gpus, sequence, envelope);
            }
            EventData::LeaseMigrated(e) => {
                if e.from_node_id == node_id {
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
                match &e.to {
                    Some(to) if to.node_id == node_id => {
                        self.placed_here(e.lease_id, &to.gpus, sequence, envelope);
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
                let Some(l) = self.leases.get_mut(&lease_id) else {
                    return;
                };
                l.subject_sequence = l.subject_sequence.max(sequence);
                match other {
                    EventData::LeasePreemptionNoticed(e) => {
                        l.preemption_deadline = Some(e.deadline)
                    }
                    EventData::LeaseStarted(_) => l.started = true,
                    EventData::LeaseStopRequested(_) => l.stop_requested = true,
                    EventData::LeaseEnded(_) => {
                        l.ended = true;
                        self.specs.remove(&lease_id);
                    }
                    // Its run here is over; a resume places it afresh.
                    EventData::LeaseSuspended(_) => l.ended = true,
                    // An agent that restarts between the idle report and the
                    // suspension still owes the suspension.
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
        gpus: &[lh_events::AssignedGpu],
        sequence: u64,
        envelope: &Envelope,
    ) {
        // The simulated node has no instances to make; a real one
        // creates the GPU instance before it starts the lease.
        for g in gpus {
            if let Some(m) = &g.mig_instance {
                tracing::debug!(lease = %lease_id, gpu = g.index, profile = %m.profile, start = m.start, "MIG instance for lease");
            }
        }
        let l = self.leases.entry(lease_id).or_default();
        *l = LocalLease {
            subject_sequence: sequence,
            placement_sequence: sequence,
            correlation_id: envelope.correlation_id,
            tenant_id: envelope.tenant_id,
            gpus: gpus.to_vec(),
            // A stop asked before it came here still holds.
            stop_requested: l.stop_requested,
            ..LocalLease::default()
        };
    }

    fn running(&self) -> usize {
        self.running_here().count()
    }

    /// Leases that hold GPUs here now: placed (started or about to), not
    /// ended or moved away.
    fn holding(&self) -> impl Iterator<Item = (&Uuid, &LocalLease)> {
        self.leases
            .iter()
            .filter(|(_, l)| !l.ended && !l.moved_away)
    }

    /// The leases of [`NodeState::holding`] that have started.
    fn running_here(&self) -> impl Iterator<Item = (&Uuid, &LocalLease)> {
        self.holding().filter(|(_, l)| l.started)
    }
}

async fn agent(
    bus: Bus,
    inventory: NodeRegistered,
    heartbeat: Duration,
    ready: Readiness,
    mut workloads: Workloads,
    mut finished: tokio::sync::mpsc::UnboundedReceiver<Finished>,
    mut gpu_side: gpus::GpuSide,
) -> anyhow::Result<()> {
    let node_id = inventory.node_id.clone();
    let mut state = NodeState::default();
    let node_subject = subject::node(&node_id);
    let mut feed = bus
        .feed(
            &[
                subject::LEASES_ALL,
                node_subject.as_str(),
                subject::TENANTS_ALL,
            ],
            1,
        )
        .await?;
    let mut caught_up = false;
    let mut dirty = true;
    let mut beat = tokio::time::interval(heartbeat);
    let mut observations = gpu_side.watch();
    // What the GPUs said before the agent caught up with the log: judged
    // once it has (a GPU lost during the replay must not be forgotten).
    let mut early: Vec<gpu_watch::Observation> = Vec::new();
    loop {
        tokio::select! {
            next = feed.next_within(QUIET) => match next {
                Some(event) => {
                    let event = event?;
                    state.apply(&node_id, event.sequence, &event.envelope);
                    dirty = true;
                    caught_up = event.pending == 0;
                }
                None => caught_up = true,
            },
            Some(f) = finished.recv() => {
                workloads.forget(f.lease_id, f.placement);
                let current = |l: &&mut LocalLease| l.placement_sequence == f.placement;
                if let Some(l) = state.leases.get_mut(&f.lease_id).filter(current) {
                    tracing::info!(lease = %f.lease_id, code = ?f.exit.code, signal = ?f.exit.signal, "workload ended");
                    l.exit = Some(f.exit);
                }
                dirty = true;
            }
            Some(observation) = observations.recv() => {
                // Judged against the log's health, so only once caught up.
                gpu_watch::hold(&mut early, observation);
                if gpu_side.seeded() || caught_up {
                    gpu_side.seed(&state.gpu_health);
                    for observation in std::mem::take(&mut early) {
                        if gpu_side.observe(&bus, &node_id, &mut state, observation).await {
                            dirty = true;
                        }
                    }
                }
            }
            _ = beat.tick(), if !gpu_side.node_stopped() => {
                let hb = Heartbeat { node_id: node_id.clone(), at: Utc::now(), running_leases: state.running() };
                let payload = serde_json::to_vec(&hb)?;
                if let Err(e) = bus.publish_telemetry(subject::heartbeat(&node_id), payload).await {
                    tracing::warn!(error = %e, "heartbeat not sent");
                }
                metrics::gauge!("lh_node_running_leases").set(state.running() as f64);
                // Preemption deadlines fall due with time, not with events.
                if state.leases.values().any(|l| l.preemption_deadline.is_some() && !l.ended) {
                    dirty = true;
                }
            }
        }
        if caught_up && dirty && !gpu_side.node_stopped() {
            dirty = false;
            if state.registered.as_ref() != Some(&inventory) {
                register(&bus, &inventory).await?;
                state.registered = Some(inventory.clone());
            }
            ready.set(true);
            if !act(&bus, &node_id, &mut state, &mut workloads).await {
                caught_up = false;
                dirty = true;
            }
            gpu_side.set_busy(&state);
        }
    }
}

async fn register(bus: &Bus, inventory: &NodeRegistered) -> anyhow::Result<()> {
    let fingerprint = serde_json::to_string(inventory)?;
    let envelope = Envelope::new(
        Actor::Node(inventory.node_id.clone()),
        Utc::now(),
        EventData::NodeRegistered(inventory.clone()),
    )
    .with_id(derived_id(&["node.registered", &fingerprint]));
    bus.publish(&envelope, Expect::Any).await?;
    tracing::info!(node = %inventory.node_id, gpus = inventory.gpus.len(), "node registered");
    Ok(())
}

/// Starts and stops leases as the log asks. False after a conflict.
async fn act(bus: &Bus, node_id: &str, state: &mut NodeState, workloads: &mut Workloads) -> bool {
    let now = Utc::now();
    let specs = &state.specs;
    for (lease_id, lease) in state.leases.iter_mut().filter(|(_, l)| !l.ended) {
        workloads.stop_stale(*lease_id, lease.placement_sequence);
        if lease.moved_away {
            // It goes on elsewhere: stop it here and report nothing.
            workloads.stop(*lease_id);
            lease.ended = true;
            continue;
        }
        let preempt_now = lease.preemption_deadline.is_some_and(|d| now >= d);
        let ending = lease.stop_requested || preempt_now;
        let suspending = lease.suspend_requested && lease.started && !ending;
        if (ending || suspending) && workloads.stop(*lease_id) {
            // The end is reported when the workload has exited.
            lease.stopping = true;
            continue;
        }
        if lease.stopping && lease.exit.is_none() {
            continue;
        }
        // A workload that finished on its own before the suspension ends
        // the lease as usual.
        let exited_by_itself = lease.exit.is_some() && !lease.stopping;
        let (data, step, expect) = if suspending && !exited_by_itself {
            let data = EventData::LeaseSuspended(LeaseSuspended {
                lease_id: *lease_id,
                node_id: node_id.to_string(),
                gpu_indices: lease.gpus.iter().map(|g| g.index).collect(),
                suspended_at: now,
                reason: "idle under the tenant's suspend policy".into(),
            });
            // Guarded: a stop that arrived meanwhile ends it instead.
            (
                data,
                "lease.suspended",
                Expect::LastSubjectSequence(lease.subject_sequence),
            )
        } else if ending || lease.exit.is_some() {
            let exit_code = lease.exit.and_then(|e| e.code);
            let reason = if !lease.started {
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
            let data = EventData::LeaseEnded(LeaseEnded {
                lease_id: *lease_id,
                node_id: Some(node_id.to_string()),
                ended_at: now,
                reason,
                exit_code,
            });
            (data, "lease.ended", Expect::Any)
        } else if !lease.started {
            // Started before, but the report did not get through: keep it.
            let running = workloads.is_running(*lease_id, lease.placement_sequence);
            let start = match running {
                true => Ok(true),
                false => workloads.start(
                    *lease_id,
                    lease.placement_sequence,
                    &lease.gpus,
                    specs.get(lease_id),
                ),
            };
            if let Err(e) = start {
                // It cannot run here: the lease fails, never started, so
                // nothing is billed.
                tracing::warn!(lease = %lease_id, error = %e, "workload does not start");
                let data = EventData::LeaseEnded(LeaseEnded {
                    lease_id: *lease_id,
                    node_id: Some(node_id.to_string()),
                    ended_at: now,
                    reason: EndReason::Failed,
                    exit_code: None,
                });
                (data, "lease.ended", Expect::Any)
            } else {
                let data = EventData::LeaseStarted(LeaseStarted {
                    lease_id: *lease_id,
                    node_id: node_id.to_string(),
                    started_at: now,
                });
                // Guarded: a stop that arrived meanwhile must win over the start.
                (
                    data,
                    "lease.started",
                    Expect::LastSubjectSequence(lease.subject_sequence),
                )
            }
        } else {
            continue;
        };
        // A migrated lease starts once per placement; it ends only once.
        let id = match step {
            "lease.started" | "lease.suspended" => derived_id(&[
                step,
                &lease_id.to_string(),
                &lease.placement_sequence.to_string(),
            ]),
            _ => derived_id(&[step, &lease_id.to_string()]),
        };
        let mut envelope = Envelope::new(Actor::Node(node_id.to_string()), now, data).with_id(id);
        envelope.correlation_id = lease.correlation_id;
        envelope.tenant_id = lease.tenant_id;
        match bus.publish(&envelope, expect).await {
            Ok(appended) => {
                lease.subject_sequence = appended.sequence;
                match step {
                    "lease.started" => lease.started = true,
                    _ => lease.ended = true,
                }
                metrics::counter!("lh_node_lease_transitions_total", "type" => step).increment(1);
                tracing::info!(lease = %lease_id, event = step, "lease transition");
            }
            Err(BusError::Conflict(_)) => return false,
            Err(e) => {
                tracing::warn!(error = %e, lease = %lease_id, "cannot report lease transition");
                return false;
            }
        }
    }
    // Ended leases need no memory beyond the log.
    state.leases.retain(|_, l| !l.ended);
    true
}
