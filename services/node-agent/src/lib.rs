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
//! This file holds the flags and wires the agent's tasks together.
//! `state/` folds the log and decides each lease's next step without I/O
//! (`NodeState::decide`), below both the GPU side and the workload side;
//! `agent.rs` runs that on the shared decide loop, with the GPUs and the
//! workloads as its signals, and sends the commands it returns to the
//! workload side (`workload::executor`), which starts and stops workloads; `telemetry.rs` sends
//! heartbeats and usage from a task of its own, so that nothing else the
//! agent does can delay a heartbeat.

mod agent;
pub mod gpu;
pub mod sessions;
mod state;
pub mod storage;
mod telemetry;
pub mod workload;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lh_service::clock::SystemClock;
use lh_service::{CancellationToken, CommonArgs, Readiness, Running};

use agent::{NodeAgent, NodeStatus, Signal};
pub use gpu::GpuArgs;
pub use workload::supervisor::RuntimeKind;
use workload::supervisor::{HostMarks, Workloads};

pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9110";

/// Metrics this service records, with their `# HELP` text.
pub const METRICS: &[lh_service::MetricHelp] = &[
    (
        "lh_node_dataset_stagings_total",
        "Datasets a lease mounts, by result: copied into the node's cache, found there (cached), or failed.",
    ),
    (
        "lh_node_dataset_staged_bytes_total",
        "Bytes of datasets copied into the node's cache.",
    ),
    (
        "lh_node_dataset_evictions_total",
        "Dataset versions the node's cache let go to make room.",
    ),
    (
        "lh_node_workspace_syncs_total",
        "Workspace syncs to the tenant's storage, by result: synced, failed or timed_out.",
    ),
    (
        "lh_node_workspace_bytes_sent_total",
        "Bytes of workspaces sent to tenants' storage (what the store did not hold yet).",
    ),
    (
        "lh_node_preemption_notices_total",
        "Workloads told of their spot preemption (a file and SIGUSR1).",
    ),
    (
        "lh_node_running_leases",
        "Leases running on this node, as its last heartbeat said.",
    ),
    (
        "lh_node_lease_transitions_total",
        "Lease starts, suspensions and ends this node-agent recorded, by event type.",
    ),
    (
        "lh_node_gpu_health",
        "Each GPU's health now (1 for the state it is in, 0 for the others), as last judged on this node.",
    ),
    (
        "lh_node_gpu_health_transitions_total",
        "GPU health changes judged on this node, by the health reached.",
    ),
    (
        "lh_node_gpu_self_tests_total",
        "Self-tests of free GPUs that finished on this node, by result (passed, failed).",
    ),
    (
        "lh_node_mig_unowned_instances",
        "MIG instances on this node that no lease owns.",
    ),
    (
        "lh_node_mig_create_failures_total",
        "MIG instances this node could not create for a lease.",
    ),
    (
        "lh_node_workloads_adopted_total",
        "Workloads a restarted node-agent took back, by kind.",
    ),
    (
        "lh_node_workloads_reaped_total",
        "Workloads a restarted node-agent ended because no lease owns them, by kind.",
    ),
];

pub const DEFAULT_STATE_DIR: &str = "/var/lib/leasehold/node-agent";
/// Where simulated GPUs' stand-in devices go, a directory per node: on
/// devtmpfs, which takes device nodes whatever the mount options of the
/// disks.
pub const DEFAULT_SIM_DEVICE_DIR: &str = "/dev/leasehold-sim";

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
    /// Flags every call of the container CLI gets before its subcommand,
    /// e.g. `--cgroup-manager cgroupfs --runtime runc` where the host has no
    /// systemd and crun refuses its cgroups (`LH_CONTAINER_CLI_ARGS`, split
    /// at spaces).
    #[arg(
        long = "container-cli-arg",
        env = "LH_CONTAINER_CLI_ARGS",
        value_delimiter = ' ',
        allow_hyphen_values = true,
        num_args = 1
    )]
    pub container_cli_args: Vec<String>,
    /// The image a lease's command runs in where the lease names none,
    /// under a container runtime (unset: such a lease fails here).
    #[arg(long, env = "LH_DEFAULT_IMAGE")]
    pub default_image: Option<String>,
    /// When the container engine fetches a lease's image.
    #[arg(long, env = "LH_CONTAINER_PULL", value_enum,
          default_value_t = workload::PullPolicy::Missing)]
    pub container_pull: workload::PullPolicy,
    /// Seconds a container may take from its start to running, its pull
    /// included; past them the lease fails `start_timeout`.
    #[arg(long, env = "LH_CONTAINER_START_TIMEOUT_SECS", default_value_t = 900,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub container_start_timeout_secs: u64,
    /// With simulated GPUs, where their stand-in device nodes are made (one
    /// per GPU, named by its UUID), which containers get in their stead.
    #[arg(long, env = "LH_SIM_DEVICE_DIR", default_value = DEFAULT_SIM_DEVICE_DIR)]
    pub sim_device_dir: PathBuf,
    /// Where the agent keeps what must outlive it: the records of the
    /// workload processes it starts, which a restarted agent adopts or stops.
    #[arg(long, env = "LH_NODE_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Seconds a stopped workload gets between SIGTERM and SIGKILL.
    #[arg(long, env = "LH_STOP_GRACE_SECS", default_value_t = 30)]
    pub stop_grace_secs: u64,
    /// HAMi-core's `libvgpu.so`: preloaded by the agent into the workloads
    /// of GPU shares (bind-mounted into containers), so that their VRAM and
    /// compute caps are enforced. Without it the node declares no GPU
    /// sharing enforcement and the scheduler sends it no shares.
    #[arg(long, env = "LH_HAMI_CORE_LIB")]
    pub hami_core_lib: Option<PathBuf>,
    /// `nvidia-cuda-mps-control`, through which the agent runs an MPS
    /// daemon per GPU that hosts shares and caps each share's VRAM and
    /// compute (ADR 016). Default: the one on `PATH`. The node declares
    /// `mps` only when a probe of it works, and not with `--hami-core-lib`.
    #[arg(long, env = "LH_MPS_CONTROL")]
    pub mps_control: Option<PathBuf>,
    /// Seconds a workload's log (its stdout and stderr) is kept after it
    /// ended, for its tenant to read; at most 90 days.
    #[arg(long, env = "LH_LEASE_LOG_KEEP_SECS",
          default_value_t = workload::lease_log::DEFAULT_LEASE_LOG_KEEP_SECS,
          value_parser = clap::value_parser!(u64).range(1..=workload::lease_log::MAX_LEASE_LOG_KEEP_SECS))]
    pub lease_log_keep_secs: u64,
    /// MiB all the workload logs of this node may hold together; past it
    /// the oldest ended ones are removed first.
    #[arg(long, env = "LH_LEASE_LOG_MAX_TOTAL_MIB",
          default_value_t = workload::lease_log::DEFAULT_LEASE_LOG_MAX_TOTAL_MIB)]
    pub lease_log_max_total_mib: u64,
    /// Not a flag: a smaller limit of one log file and a quicker check of
    /// it, for tests that cannot write 64 MiB or wait 30 s.
    #[arg(skip)]
    pub lease_log_test_limits: Option<(u64, Duration)>,
    #[command(flatten)]
    pub gpus: GpuArgs,
    #[command(flatten)]
    pub storage: storage::StorageArgs,
}

impl Config {
    /// How the workloads' logs are kept.
    pub fn lease_log_policy(&self) -> workload::lease_log::LeaseLogPolicy {
        let mut policy = workload::lease_log::LeaseLogPolicy::new(
            self.lease_log_keep_secs,
            self.lease_log_max_total_mib,
        );
        if let Some((max_file_bytes, check_every)) = self.lease_log_test_limits {
            policy.max_file_bytes = max_file_bytes;
            policy.check_every = check_every;
        }
        policy
    }
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
            container_cli_args: Vec::new(),
            default_image: None,
            container_pull: workload::PullPolicy::Missing,
            container_start_timeout_secs: 900,
            sim_device_dir: PathBuf::from(DEFAULT_SIM_DEVICE_DIR),
            // Of its own: agents of parallel tests must not adopt or stop
            // each other's workloads.
            state_dir: std::env::temp_dir()
                .join("lh-node-agent-test")
                .join(uuid::Uuid::new_v4().to_string()),
            stop_grace_secs: 30,
            hami_core_lib: None,
            mps_control: None,
            lease_log_keep_secs: workload::lease_log::DEFAULT_LEASE_LOG_KEEP_SECS,
            lease_log_max_total_mib: workload::lease_log::DEFAULT_LEASE_LOG_MAX_TOTAL_MIB,
            lease_log_test_limits: None,
            gpus: GpuArgs::for_test(),
            storage: storage::StorageArgs::for_test(),
        }
    }
}

impl lh_service::Service for Config {
    const NAME: &'static str = "lh-node-agent";

    async fn start(self, shutdown: CancellationToken) -> anyhow::Result<Running> {
        start(self, shutdown).await
    }
}

pub async fn start(config: Config, shutdown: CancellationToken) -> anyhow::Result<Running> {
    lh_service::describe_metrics(METRICS);
    // The id is a subject token and a NATS user: `gpu.1` and `gpu_1` would
    // share one subject, so only what maps to itself is let through.
    lh_bus::auth::check_user_name(&config.node_id)
        .map_err(|why| anyhow::anyhow!("--node-id {:?}: {why}", config.node_id))?;
    config.gpus.validate()?;
    let (backend, mut inventory) = gpu::open(&config.gpus, &config.fleet_file, &config.node_id)?;
    if config.runtime == RuntimeKind::Process {
        for variable in [
            lh_bus::ENV_NATS_NKEY_SEED_FILE,
            lh_bus::ENV_NATS_PASSWORD_FILE,
            lh_bus::ENV_NATS_CLIENT_KEY_FILE,
        ] {
            if let Some(path) = std::env::var_os(variable).filter(|p| !p.is_empty()) {
                workload::lease_user::check_secret_private(variable, Path::new(&path))?;
            }
        }
    }
    let service = format!("lh-node-agent-{}", config.node_id);
    // A node's user may read only its own view of the log, in the mirror
    // the scheduler keeps of it.
    let bus = config
        .common
        .connect_bus(&service)
        .await?
        .reading_view_of(&config.node_id);
    let readiness = Readiness::default();
    let ready = readiness.clone();
    let heartbeat = Duration::from_millis(config.heartbeat_ms.max(10));
    let grace = Duration::from_secs(config.stop_grace_secs);
    let section = lh_telemetry::MetricsSection::default();
    let clock = SystemClock::shared();
    let gpu_side = gpu::GpuSide::new(
        &config.gpus,
        backend.clone(),
        &inventory,
        section.clone(),
        clock.clone(),
    );
    let marks = HostMarks {
        node_id: inventory.node_id.clone(),
        state_dir: config.state_dir.clone(),
    };
    let settings = workload::supervisor::ContainerSettings {
        global_args: config
            .container_cli_args
            .iter()
            .filter(|a| !a.is_empty())
            .cloned()
            .collect(),
        pull: config.container_pull,
        default_image: config.default_image.clone(),
        start_timeout: Duration::from_secs(config.container_start_timeout_secs),
        stand_in_devices: (backend.name() == "sim")
            .then(|| config.sim_device_dir.join(&config.node_id)),
        ..Default::default()
    };
    let (mut workloads, finished) = Workloads::with_settings(
        config.runtime,
        config.container_cli.clone(),
        grace,
        marks,
        config.hami_core_lib.clone(),
        settings,
    )?;
    if workloads.runs_workloads() && config.hami_core_lib.is_none() {
        if let Some(mps) = workload::mps::for_node(config.mps_control.clone(), &config.state_dir) {
            workloads.enforce_shares_with_mps(mps);
        }
    }
    let log_policy = config.lease_log_policy();
    workloads.keep_logs(log_policy);
    workloads.declare(&mut inventory);
    workloads.on_gpus(backend.clone());
    match workload::assignment::host_memory_bytes() {
        Some(memory_bytes) => workloads.share_out(workload::assignment::Host {
            memory_bytes,
            gpu_count: inventory.gpus.len() as u32,
            cpu_milli: workload::assignment::host_cpu_milli(),
            per_gpu: inventory
                .gpus
                .first()
                .and_then(|g| lh_domain::catalog::host_share_per_gpu(&g.model)),
        }),
        None => tracing::warn!("cannot read the host's memory: workloads get no memory limit"),
    }
    tracing::info!(
        isolation = inventory.isolation.as_str(),
        gpu_sharing = inventory.gpu_sharing.as_str(),
        "the node declares what it enforces"
    );
    let node_id = inventory.node_id.clone();
    let stop = shutdown.clone();
    Running::spawn_with_metrics(
        config.common.http_addr_or(DEFAULT_HTTP_ADDR),
        axum::Router::new(),
        readiness,
        section,
        shutdown,
        async move {
            let status = Arc::new(NodeStatus::default());
            // Both end with the agent, even one ended abruptly.
            let _sweeps = lh_service::AbortOnDrop(tokio::spawn(workload::lease_log::keep_tidy(
                config.state_dir.clone(),
                log_policy,
                stop.clone(),
            )));
            let log_bus = bus.clone();
            let log_node = node_id.clone();
            let log_dir = config.state_dir.clone();
            let simulated = config.runtime == RuntimeKind::Sim;
            let _log_reads = lh_service::AbortOnDrop(tokio::spawn(async move {
                if let Err(e) =
                    workload::lease_log::serve(log_bus, log_node, log_dir, simulated).await
                {
                    tracing::warn!(error = %e, "lease logs are not served");
                }
            }));
            let session_bus = bus.clone();
            let session_node = node_id.clone();
            let doors = workloads.doors();
            let _sessions = lh_service::AbortOnDrop(tokio::spawn(async move {
                if let Err(e) = sessions::serve(session_bus, session_node, doors, simulated).await {
                    tracing::warn!(error = %e, "sessions into leases are not served");
                }
            }));
            // Only where workloads run: a simulated lease has no files.
            let storage = if simulated {
                None
            } else {
                Some(Arc::new(storage::NodeStorage::open(
                    &config.state_dir,
                    &node_id,
                    config.storage.clone(),
                )?))
            };
            let (commands, reports) = workload::executor::spawn(
                bus.clone(),
                node_id.clone(),
                workloads,
                storage,
                finished,
            );
            let usage = telemetry::spawn(
                bus.clone(),
                node_id,
                heartbeat,
                status.clone(),
                clock.clone(),
                stop.clone(),
            );
            let observations = gpu_side.watch();
            let signals = futures::stream::select(
                receive(observations).map(Signal::Gpu),
                receive_unbounded(reports).map(Signal::Workload),
            );
            let mut agent = Box::new(NodeAgent::new(
                inventory, gpu_side, commands, usage, status, heartbeat,
            ));
            lh_service::decider::run_with_signals(
                &bus,
                agent.as_mut(),
                clock.as_ref(),
                stop,
                ready,
                signals,
            )
            .await
        },
    )
    .await
}

fn receive<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn receive_unbounded<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
