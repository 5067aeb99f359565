//! Node-agent: one per GPU host. Registers the node's inventory, heartbeats,
//! starts the leases placed on it and stops them when asked, reporting
//! `lease.started` / `lease.ended` with its own timestamps (pricing bills
//! from those).
//!
//! Its GPUs are read through NVML or played from a fleet file's simulated
//! node (`--gpu-backend`, see [`gpu`]). What a lease runs depends on
//! `--runtime`: with `sim` a lease "runs" from start until it is stopped;
//! with `process`, `docker` or `podman` its workload runs (see
//! [`workload`]), its exit ends the lease with the exit code, and a stop is
//! SIGTERM, a grace period, then SIGKILL. The agent learns what it should be
//! running from the log at start, so a restarted agent picks up where it was.
//!
//! This file holds the flags and the agent's loop. `state.rs` folds the log
//! and decides each lease's next step without I/O (`NodeState::decide`);
//! `act.rs` carries the steps out.

mod act;
pub mod gpu;
mod state;
pub mod workload;

use std::path::PathBuf;
use std::time::Duration;

use lh_bus::{Bus, Expect};
use lh_events::telemetry::Heartbeat;
use lh_events::{derived_id, subject, Actor, Envelope, EventData, NodeRegistered};
use lh_service::clock::{SharedClock, SystemClock};
use lh_service::{CancellationToken, CommonArgs, Readiness, Running};

pub use gpu::GpuArgs;
use state::{LocalLease, NodeState};
pub use workload::supervisor::RuntimeKind;
use workload::supervisor::{Finished, Workloads};

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
    pub gpus: GpuArgs,
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
            gpus: GpuArgs::for_test(),
        }
    }
}

pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    config.gpus.validate()?;
    let (backend, inventory) = gpu::open(&config.gpus, &config.fleet_file, &config.node_id)?;
    let service = format!("lh-node-agent-{}", config.node_id);
    let bus = config.common.connect_bus(&service).await?;
    let readiness = Readiness::default();
    let ready = readiness.clone();
    let heartbeat = Duration::from_millis(config.heartbeat_ms.max(10));
    let grace = Duration::from_secs(config.stop_grace_secs);
    let runtime = (config.runtime, config.container_cli.clone());
    let section = lh_telemetry::MetricsSection::default();
    let clock = SystemClock::shared();
    let gpu_side = gpu::GpuSide::new(
        &config.gpus,
        backend,
        &inventory,
        section.clone(),
        clock.clone(),
    );
    Running::spawn_with_metrics(
        config.common.http_addr_or(DEFAULT_HTTP_ADDR),
        axum::Router::new(),
        readiness,
        section,
        shutdown,
        async move {
            let (workloads, finished) = Workloads::new(runtime.0, runtime.1, grace)?;
            agent(
                bus, inventory, heartbeat, ready, workloads, finished, gpu_side, clock,
            )
            .await
        },
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn agent(
    bus: Bus,
    inventory: NodeRegistered,
    heartbeat: Duration,
    ready: Readiness,
    mut workloads: Workloads,
    mut finished: tokio::sync::mpsc::UnboundedReceiver<Finished>,
    mut gpu_side: gpu::GpuSide,
    clock: SharedClock,
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
    let mut early: Vec<gpu::watch::Observation> = Vec::new();
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
                    l.workload_running = false;
                }
                dirty = true;
            }
            Some(observation) = observations.recv() => {
                // Judged against the log's health, so only once caught up.
                gpu::watch::hold(&mut early, observation);
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
                let hb = Heartbeat { node_id: node_id.clone(), at: clock.now(), running_leases: state.running() };
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
                register(&bus, &inventory, clock.now()).await?;
                state.registered = Some(inventory.clone());
            }
            ready.set(true);
            if !act::act(&bus, &node_id, &mut state, &mut workloads, clock.now()).await {
                caught_up = false;
                dirty = true;
            }
            gpu_side.set_busy(&state);
        }
    }
}

async fn register(
    bus: &Bus,
    inventory: &NodeRegistered,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<()> {
    let fingerprint = serde_json::to_string(inventory)?;
    let envelope = Envelope::new(
        Actor::Node(inventory.node_id.clone()),
        now,
        EventData::NodeRegistered(inventory.clone()),
    )
    .with_id(derived_id(&["node.registered", &fingerprint]));
    bus.publish(&envelope, Expect::Any).await?;
    tracing::info!(node = %inventory.node_id, gpus = inventory.gpus.len(), "node registered");
    Ok(())
}
