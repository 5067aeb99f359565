//! The workloads running on this node: one supervisor task per lease that
//! owns its [`RunningWorkload`](super::RunningWorkload), reports its exit,
//! and stops it gracefully when the agent asks. A workload a previous
//! incarnation of the agent started is found again at start
//! ([`Workloads::reconcile`], see [`super::reconcile`]) and supervised the
//! same way.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lh_events::{
    AssignedGpu, GpuSharing, Isolation, LeaseFailure, NodeRegistered, StartedMigDevice,
    WorkloadSpec, WorkspaceSyncReason,
};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::assignment::{assignment, Host};
use super::container::DEFAULT_STOP_MARGIN;
use super::container_cgroup::ContainerCgroups;
use super::lease_log::{self, LeaseLogPolicy};
use super::lease_user::LeaseUsers;
use super::mps::{Mps, MpsLimits};
use super::reconcile::{self, Adopted, Decision, Found, ProcessRecord, MOST_HOST_WORKLOADS};
use super::{
    CgroupConfig, CliFlavor, ContainerRuntime, Engine, Exit, GpuDevices, ProcessRuntime,
    PullPolicy, Runtime, Workload,
};
use crate::gpu::backend::GpuBackend;

mod host;
mod notice;
mod supervised;

use notice::Notice;
use notice::{make_notice_dir, notice_dir, tell_notice};
use supervised::Supervised;

use crate::storage::cache::CacheHold;
use crate::storage::{LeaseStorage, Prepared};

/// What a running workload holds of its lease's data: its workspaces'
/// sync, and its datasets in the node's cache.
struct LeaseData {
    session: Option<Arc<LeaseStorage>>,
    /// Dropped when the workload has ended: only then may they leave.
    _holds: Vec<CacheHold>,
    /// An adopted container's way to the store, opened again by this
    /// agent (a started one's lives with its container).
    _relay: Option<super::store_relay::RelayTask>,
}

/// How leases run on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeKind {
    /// Nothing runs: a lease "runs" from start until it is stopped.
    Sim,
    /// The lease's `workload.command` as a process group.
    Process,
    /// The lease's `workload.image` through the docker CLI.
    Docker,
    /// The lease's `workload.image` through the podman CLI.
    Podman,
}

/// A workload that ended: on its own, or because the agent stopped it.
#[derive(Debug, Clone, Copy)]
pub struct Finished {
    pub lease_id: Uuid,
    /// The placement it ran for (a lease moved to other GPUs of the same
    /// node runs anew there).
    pub placement: u64,
    pub exit: Exit,
    /// Why it failed, when it exited non-zero and its standard error said.
    pub failure: Option<LeaseFailure>,
    /// Whether it ran: false for a container the engine never ran (its
    /// image missing, its pull stopped or past its deadline).
    pub ran: bool,
}

/// Where the workloads of this node are marked so that a restarted agent
/// finds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMarks {
    pub node_id: String,
    /// The agent's state directory: process records go in it.
    pub state_dir: PathBuf,
}

/// What a reconciliation at start came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Leases whose workload runs on, supervised again, with the placement.
    pub adopted: Vec<(Uuid, u64)>,
    /// Workloads (processes, containers, cgroups) stopped and removed.
    pub reaped: usize,
}

/// The container CLI, for the workloads a reconciliation finds.
#[derive(Debug, Clone)]
struct ContainerCli {
    engine: Engine,
    /// Where the runtime writes the tenants' env files.
    env_dir: PathBuf,
    memory_cgroups: Option<ContainerCgroups>,
    networks: super::tenant_network::TenantNetworks,
    /// The host's lock on gang links, and how long a container may take to
    /// run: an adopted gang member is linked again with them.
    gang_link_lock_file: PathBuf,
    start_timeout: Duration,
}

impl ContainerCli {
    /// The env file the runtime wrote for the container of `lease_id`.
    fn env_file(&self, lease_id: Uuid) -> PathBuf {
        super::container::env_file_path(&self.env_dir, lease_id)
    }
}

/// Starts, watches and stops the workloads of the leases on this node.
pub struct Workloads {
    runtime: Option<Arc<dyn Runtime>>,
    grace: Duration,
    marks: HostMarks,
    /// Set for the process runtime: its workloads get a record.
    records: bool,
    cgroup_parent: Option<PathBuf>,
    /// The process runtime's lease users, whose homes the sweep tidies.
    lease_users: Option<LeaseUsers>,
    container: Option<ContainerCli>,
    /// Containers started and not yet seen running: answered when the
    /// engine runs them ([`Workloads::when_running`]).
    running_signals: HashMap<Uuid, (u64, oneshot::Receiver<()>)>,
    /// Running workloads: the placement each runs for, and its stop handle
    /// (send the grace period).
    running: HashMap<Uuid, (u64, oneshot::Sender<(Duration, WorkspaceSyncReason)>)>,
    /// Leases whose workload was asked to stop and has not reported its
    /// end yet: still on the host, still this agent's, within its grace.
    stopping: std::collections::HashSet<Uuid>,
    /// Each running workload's ear for its preemption notice.
    notices: HashMap<Uuid, oneshot::Sender<Notice>>,
    /// Adopted workloads waiting for their data to be found again (the
    /// tenant's storage comes from the gateway, after the adoption).
    late_data: HashMap<Uuid, (u64, oneshot::Sender<LeaseData>)>,
    finished_tx: mpsc::UnboundedSender<Finished>,
    /// What the runtime isolates workloads with; `None` for the simulated
    /// runtime, whose node declares its own.
    isolation: Option<Isolation>,
    /// Whether shares get HAMi-core.
    hami_core: bool,
    /// The MPS daemons that enforce shares, where MPS works here and
    /// HAMi-core is not used.
    mps: Option<Mps>,
    /// The host's RAM and GPUs, which a lease's RAM share is a part of;
    /// `None`: leases get no memory limit.
    host: Option<Host>,
    /// Told which workloads run on which GPUs (the simulated one kills
    /// them on a fault, as a real GPU does).
    gpu_backend: Option<Arc<dyn GpuBackend>>,
    /// How the workloads' log files are kept.
    logs: LeaseLogPolicy,
    /// The GPUs are simulated (stand-in devices): their sharing is the
    /// fleet file's to declare, as nothing real enforces it.
    simulated_gpus: bool,
    /// How sessions enter the running workloads.
    doors: super::door::Doors,
}

/// How the container runtime is set up beyond its CLI.
#[derive(Debug, Clone)]
pub struct ContainerSettings {
    /// Flags before every subcommand (`--cgroup-manager cgroupfs --runtime runc`).
    pub global_args: Vec<String>,
    pub pull: PullPolicy,
    pub start_timeout: Duration,
    /// Simulated GPUs: their stand-in devices go here.
    pub stand_in_devices: Option<PathBuf>,
    /// Where the engine keeps cgroups as plain directories: under which
    /// mount the agent holds each container's memory limit itself.
    pub cgroup_mount: PathBuf,
    /// The image a workload that names none runs in.
    pub default_image: Option<String>,
}

impl Default for ContainerSettings {
    fn default() -> Self {
        ContainerSettings {
            global_args: Vec::new(),
            pull: PullPolicy::Missing,
            start_timeout: super::container::DEFAULT_START_TIMEOUT,
            stand_in_devices: None,
            cgroup_mount: PathBuf::from(super::container_cgroup::CGROUP_MOUNT),
            default_image: None,
        }
    }
}

/// The engine's cgroup manager (`cgroupfs`, `systemd`), or why the engine
/// cannot say: it does not work here.
pub fn engine_cgroup_manager(engine: &Engine) -> Result<String, String> {
    let format = match engine.flavor {
        CliFlavor::Podman => "{{.Host.CgroupManager}}",
        CliFlavor::Docker => "{{.CgroupDriver}}",
    };
    // Synchronous: the agent asks once, at its start.
    let mut command = engine.command();
    let output = command
        .as_std_mut()
        .args(["info", "--format", format])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", engine.cli.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} info: {}: {}",
            engine.cli.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

impl Workloads {
    /// `None` runtime: every lease is simulated.
    pub fn new(
        kind: RuntimeKind,
        container_cli: Option<PathBuf>,
        grace: Duration,
        marks: HostMarks,
    ) -> anyhow::Result<(Self, mpsc::UnboundedReceiver<Finished>)> {
        Self::with_hami_core(kind, container_cli, grace, marks, None)
    }

    /// As [`Workloads::new`], with HAMi-core (`hami_core_lib`, when it is a
    /// file) injected into the workloads of shares.
    pub fn with_hami_core(
        kind: RuntimeKind,
        container_cli: Option<PathBuf>,
        grace: Duration,
        marks: HostMarks,
        hami_core_lib: Option<PathBuf>,
    ) -> anyhow::Result<(Self, mpsc::UnboundedReceiver<Finished>)> {
        Self::with_settings(
            kind,
            container_cli,
            grace,
            marks,
            hami_core_lib,
            ContainerSettings::default(),
        )
    }

    /// As [`Workloads::with_hami_core`], with the container runtime set up
    /// by `settings`. The container engine must answer `info`: an agent
    /// told to run containers refuses to start without one that works.
    pub fn with_settings(
        kind: RuntimeKind,
        container_cli: Option<PathBuf>,
        grace: Duration,
        marks: HostMarks,
        hami_core_lib: Option<PathBuf>,
        settings: ContainerSettings,
    ) -> anyhow::Result<(Self, mpsc::UnboundedReceiver<Finished>)> {
        if let Some(lib) = &hami_core_lib {
            super::check_hami_core_lib(lib)?;
        }
        let mut cgroup_parent = None;
        let mut lease_users = None;
        let mut container = None;
        let mut isolation = None;
        let runtime: Option<Arc<dyn Runtime>> = match kind {
            RuntimeKind::Sim => None,
            RuntimeKind::Process => {
                let users = LeaseUsers::for_node(&marks.state_dir)?;
                lease_users = Some(users.clone());
                let mut runtime = ProcessRuntime::new(CgroupConfig::default(), users)?;
                cgroup_parent = runtime.cgroup_parent();
                // A cgroup limits and kills; it does not hide the host.
                isolation = Some(if runtime.uses_cgroups() {
                    Isolation::Cgroup
                } else {
                    Isolation::None
                });
                if let Some(lib) = &hami_core_lib {
                    runtime = runtime.with_hami_core_lib(lib.clone());
                }
                Some(Arc::new(runtime))
            }
            RuntimeKind::Docker | RuntimeKind::Podman => {
                let runtime = match kind {
                    RuntimeKind::Docker => {
                        ContainerRuntime::docker(container_cli.unwrap_or_else(|| "docker".into()))
                    }
                    _ => ContainerRuntime::podman(container_cli.unwrap_or_else(|| "podman".into())),
                }
                .on_node(marks.node_id.clone())
                .env_files_in(marks.state_dir.join("env"))
                .with_global_args(settings.global_args.clone());
                let mut runtime = match &hami_core_lib {
                    Some(lib) => runtime.with_hami_core_lib(lib.clone()),
                    None => runtime,
                };
                runtime.pull = settings.pull;
                runtime.default_image = settings.default_image.clone();
                runtime.start_timeout = settings.start_timeout;
                if let Some(dir) = &settings.stand_in_devices {
                    runtime.gpu_devices = GpuDevices::StandIn { dir: dir.clone() };
                }
                let manager = engine_cgroup_manager(&runtime.engine())
                    .map_err(|why| anyhow::anyhow!("the container engine does not work: {why}"))?;
                if manager == "cgroupfs" {
                    match ContainerCgroups::detect(&settings.cgroup_mount) {
                        Ok(cgroups) => runtime.memory_cgroups = Some(cgroups),
                        Err(why) => tracing::warn!(why,
                            "containers' memory limits are the engine's: an OOM kill is not told apart"),
                    }
                }
                isolation = Some(Isolation::Container);
                container = Some(ContainerCli {
                    engine: runtime.engine(),
                    env_dir: runtime.env_dir.clone(),
                    memory_cgroups: runtime.memory_cgroups.clone(),
                    networks: runtime.tenant_networks.clone(),
                    gang_link_lock_file: runtime.gang_link_lock_file.clone(),
                    start_timeout: runtime.start_timeout,
                });
                Some(Arc::new(runtime))
            }
        };
        let (finished_tx, finished_rx) = mpsc::unbounded_channel();
        let simulated_gpus = settings.stand_in_devices.is_some() && container.is_some();
        Ok((
            Workloads {
                runtime,
                grace,
                marks,
                records: kind == RuntimeKind::Process,
                cgroup_parent,
                lease_users,
                container,
                running_signals: HashMap::new(),
                running: HashMap::new(),
                notices: HashMap::new(),
                late_data: HashMap::new(),
                stopping: Default::default(),
                finished_tx,
                hami_core: hami_core_lib.is_some() && kind != RuntimeKind::Sim,
                mps: None,
                isolation,
                host: None,
                gpu_backend: None,
                logs: LeaseLogPolicy::default(),
                simulated_gpus,
                doors: Default::default(),
            },
            finished_rx,
        ))
    }

    /// Enforces shares through `mps` (ADR 016). Ignored where nothing runs
    /// or HAMi-core enforces them; false then.
    pub fn enforce_shares_with_mps(&mut self, mps: Mps) -> bool {
        if self.runtime.is_none() || self.hami_core {
            return false;
        }
        let mut mps = mps;
        if self.lease_users.is_some() {
            mps.serve_gpu_share_users();
        }
        self.mps = Some(mps);
        true
    }

    /// Keeps the workloads' log files under `policy`.
    pub fn keep_logs(&mut self, policy: LeaseLogPolicy) {
        self.logs = policy;
    }

    /// Tells `backend` which workloads run on which of its GPUs.
    pub fn on_gpus(&mut self, backend: Arc<dyn GpuBackend>) {
        self.gpu_backend = Some(backend);
    }

    /// The backend told of workloads, which MIG instances are made through.
    pub(crate) fn gpu_backend(&self) -> Option<Arc<dyn GpuBackend>> {
        self.gpu_backend.clone()
    }

    /// Starts the workload of `lease_id` on `gpus`. `Ok(false)` when there
    /// is nothing to run (simulated node, or a lease without a workload).
    pub fn start(
        &mut self,
        lease_id: Uuid,
        placement: u64,
        gpus: &[AssignedGpu],
        mig_devices: &[StartedMigDevice],
        spec: Option<&WorkloadSpec>,
    ) -> Result<bool, super::RuntimeError> {
        self.start_for(None, lease_id, placement, gpus, mig_devices, spec)
    }

    /// [`Workloads::start`] of a lease of `tenant_id`.
    pub fn start_for(
        &mut self,
        tenant_id: Option<Uuid>,
        lease_id: Uuid,
        placement: u64,
        gpus: &[AssignedGpu],
        mig_devices: &[StartedMigDevice],
        spec: Option<&WorkloadSpec>,
    ) -> Result<bool, super::RuntimeError> {
        self.start_with_storage(
            None,
            tenant_id,
            lease_id,
            placement,
            gpus,
            mig_devices,
            spec,
            None,
        )
    }

    /// [`Workloads::start_for`] with the lease's datasets and workspaces
    /// made ready on the node: mounted into its container, its workspaces
    /// synced while it runs and once more when it ends; a gang's part with
    /// its command run once per GPU and the rendezvous in its environment
    /// ([`super::gang`]).
    #[allow(clippy::too_many_arguments)]
    pub fn start_with_storage(
        &mut self,
        storage: Option<Prepared>,
        tenant_id: Option<Uuid>,
        lease_id: Uuid,
        placement: u64,
        gpus: &[AssignedGpu],
        mig_devices: &[StartedMigDevice],
        spec: Option<&WorkloadSpec>,
        gang: Option<&super::gang::GangPart>,
    ) -> Result<bool, super::RuntimeError> {
        let (Some(runtime), Some(spec)) = (&self.runtime, spec) else {
            return Ok(false);
        };
        if gang.is_some() && spec.command.is_empty() {
            return Err(super::RuntimeError::InvalidWorkload(
                "a lease across nodes runs a command on each, and this one names none".into(),
            ));
        }
        let (mut mounts, data, store) = match storage {
            Some(mut prepared) => {
                let store = prepared.object_store.take();
                let (mounts, session, holds) = prepared.into_parts();
                // Every member of a gang starts from its workspaces; only
                // the first keeps them (rank 0 writes a distributed job's
                // checkpoints): two nodes syncing one workspace would race.
                let session = session.filter(|_| gang.is_none_or(|g| g.is_first()));
                (
                    mounts,
                    Some(LeaseData {
                        session,
                        _holds: holds,
                        _relay: None,
                    }),
                    store,
                )
            }
            None => (Vec::new(), None, None),
        };
        // A container finds its notices here; a process lease is told none.
        let notice_dir = match spec.image {
            Some(_) => {
                let dir = notice_dir(&self.marks.state_dir, lease_id, placement);
                make_notice_dir(&dir).map_err(|e| {
                    super::RuntimeError::InvalidConfig(format!(
                        "making the notice directory {}: {e}",
                        dir.display()
                    ))
                })?;
                mounts.push(super::Mount {
                    host: dir.clone(),
                    path: super::NOTICE_DIR_IN_CONTAINER.to_string(),
                    writable: false,
                });
                Some(dir)
            }
            None => None,
        };
        let share = self.host.and_then(|h| h.memory_share(gpus));
        let mut assignment = assignment(lease_id, gpus, mig_devices, share);
        assignment.cpu_milli = self.host.and_then(|h| h.cpu_share(gpus));
        let log_file = lease_log::path(&self.marks.state_dir, lease_id, placement);
        assignment.log_file = Some(log_file.clone());
        assignment.tenant_id = tenant_id;
        if let Some(part) = gang {
            assignment.gang_env = part.env();
            assignment.gang_link = Some(super::gang_link::GangLink::of(lease_id, part));
            // Another member may share this host's engine (a test, `make
            // up`): its workload's names must not meet the first's.
            if !part.is_first() {
                assignment.part = Some(self.marks.node_id.clone());
            }
        }
        let workload = Workload {
            command: match gang {
                Some(part) => part.launch(&spec.command),
                None => spec.command.clone(),
            },
            image: spec.image.clone(),
            env: spec.env.clone(),
            network: spec.network,
            mounts,
            store,
        };
        let limits = MpsLimits::of_share(&assignment);
        if let (Some(mps), Some(limits), Some(gpu)) = (&mut self.mps, limits, gpus.first()) {
            // Before the workload exists: its first CUDA context may come
            // at once, and binds whatever limit the daemon holds then.
            let pipe = mps
                .prepare((lease_id, placement), gpu.index, &gpu.uuid, limits)
                .map_err(|e| super::RuntimeError::Mps(e.to_string()))?;
            assignment.mps_pipe_dir = Some(pipe);
            assignment.mps_server_uid = Some(mps.server_uid(gpu.index));
        }
        let mut handle = match runtime.start(&assignment, &workload) {
            Ok(handle) => handle,
            Err(e) => {
                if let Some(mps) = &mut self.mps {
                    mps.release((lease_id, placement));
                }
                // It wrote nothing: a start that failed is told on the lease.
                lease_log::remove(&log_file);
                return Err(e);
            }
        };
        tracing::info!(lease = %lease_id, pid = handle.pid(), "workload started");
        if let Some(running) = handle.when_running() {
            self.running_signals.insert(lease_id, (placement, running));
        }
        let on_gpus = self.gpu_backend.clone().map(|backend| {
            let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
            backend.workload_started(&indices, handle.pid());
            (backend, handle.pid())
        });
        let record = self
            .records
            .then(|| self.record(lease_id, placement, handle.pid()));
        self.supervise(
            lease_id,
            placement,
            Supervised::Started(Box::new(handle)),
            record.flatten(),
            on_gpus,
            Some(log_file),
            data,
            None,
            notice_dir,
        );
        Ok(true)
    }

    /// Writes the record a restarted agent finds the process by. Without
    /// it the workload runs, but a restarted agent cannot adopt it.
    fn record(&self, lease_id: Uuid, placement: u64, pid: u32) -> Option<PathBuf> {
        let pid = i32::try_from(pid).ok()?;
        let Some(start_ticks) = reconcile::process_start_ticks(pid) else {
            // Gone already: its exit is reported as usual.
            return None;
        };
        let record = ProcessRecord {
            node_id: self.marks.node_id.clone(),
            lease_id,
            placement,
            pid,
            start_ticks,
        };
        match record.write(&self.marks.state_dir) {
            Ok(path) => Some(path),
            Err(e) => {
                tracing::warn!(lease = %lease_id, dir = %self.marks.state_dir.display(), error = %e,
                    "cannot record the workload; a restarted agent will not find it");
                None
            }
        }
    }

    /// One task that waits for the workload, or stops it when asked, keeps
    /// its log within its limit meanwhile, then reports how it ended (why it
    /// failed, from the end of its log), drops its record and marks its log
    /// ended.
    #[allow(clippy::too_many_arguments)]
    fn supervise(
        &mut self,
        lease_id: Uuid,
        placement: u64,
        mut handle: Supervised,
        record: Option<PathBuf>,
        on_gpus: Option<(Arc<dyn GpuBackend>, u32)>,
        log_file: Option<PathBuf>,
        data: Option<LeaseData>,
        late_data: Option<oneshot::Receiver<LeaseData>>,
        notice_dir: Option<PathBuf>,
    ) {
        let (stop_tx, stop_rx) = oneshot::channel::<(Duration, WorkspaceSyncReason)>();
        let (notice_tx, mut notice_rx) = oneshot::channel::<Notice>();
        let mut noticed = false;
        let finished = self.finished_tx.clone();
        let logs = self.logs;
        let doors = self.doors.clone();
        if let Some(target) = handle.door() {
            doors.open(lease_id, placement, target);
        }
        tokio::spawn(async move {
            let mut stop_rx = stop_rx;
            let mut bound_check = tokio::time::interval(logs.bound_check_interval());
            let mut data = data;
            let mut late_data = late_data;
            let mut session = data.as_ref().and_then(|d| d.session.clone());
            let mut sync_tick = sync_ticks(session.as_deref());
            let stop = loop {
                tokio::select! {
                    exit = handle.wait() => break Err(exit),
                    found = async { late_data.as_mut().expect("checked").await }, if late_data.is_some() => {
                        late_data = None;
                        if let Ok(found) = found {
                            session = found.session.clone();
                            sync_tick = sync_ticks(session.as_deref());
                            data = Some(found);
                        }
                    }
                    stop = &mut stop_rx => break Ok(stop.unwrap_or((Duration::ZERO, WorkspaceSyncReason::End))),
                    notice = &mut notice_rx, if !noticed => {
                        noticed = true;
                        if let Ok(notice) = notice {
                            tell_notice(lease_id, &handle, notice_dir.as_deref(), &notice).await;
                            if let Some(session) = session.clone() {
                                // Halfway to the deadline: what the workload
                                // checkpointed by then is kept even if its
                                // last sync cannot finish in time.
                                let halfway = (notice.deadline - chrono::Utc::now())
                                    .to_std()
                                    .unwrap_or_default()
                                    / 2;
                                tokio::spawn(async move {
                                    tokio::time::sleep(halfway).await;
                                    session.sync(WorkspaceSyncReason::Notice, false).await;
                                });
                            }
                        }
                    }
                    _ = sync_tick.tick(), if session.is_some() => {
                        // Off this loop: a stop is never held up by it,
                        // and the last sync waits for it to finish.
                        let session = session.clone().expect("checked");
                        tokio::spawn(async move {
                            session.sync(WorkspaceSyncReason::Interval, false).await;
                        });
                    }
                    _ = bound_check.tick() => {
                        if let Some(path) = log_file.clone() {
                            let _ = tokio::task::spawn_blocking(move || {
                                lease_log::keep_bounded(&path, &logs)
                            })
                            .await;
                        }
                    }
                }
            };
            // Sessions end as the stop begins, not when the workload has
            // gone: theirs is the lease's end, not a command's exit.
            doors.close(lease_id, placement);
            let (exit, reason) = match stop {
                Err(exit) => (exit, WorkspaceSyncReason::End),
                Ok((grace, reason)) => (handle.stop(grace).await, reason),
            };
            // With the workload gone, nothing changes its workspaces: the
            // last sync is whole, and comes before its end is reported.
            if let Some(session) = &session {
                session.sync(reason, true).await;
            }
            drop(data);
            if let Some(dir) = &notice_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            if let Some(path) = record {
                remove_record(&path);
            }
            if let Some((backend, pid)) = on_gpus {
                backend.workload_ended(pid);
            }
            let exit = exit.unwrap_or_else(|e| {
                tracing::warn!(lease = %lease_id, error = %e, "cannot tell how the workload ended");
                Exit {
                    code: None,
                    signal: None,
                }
            });
            let failed = exit.code != Some(0);
            let from_log = log_file.as_deref().and_then(|path| {
                let failure = failed
                    .then(|| super::stderr::failure_in(&super::stderr::tail(path)))
                    .flatten();
                lease_log::mark_ended(path, std::time::SystemTime::now());
                failure
            });
            let ran = handle.ran();
            let failure = handle
                .failure()
                .or(from_log)
                .or(failed.then_some(LeaseFailure::ExitCode));
            let _ = finished.send(Finished {
                lease_id,
                placement,
                exit,
                failure,
                ran,
            });
        });
        self.running.insert(lease_id, (placement, stop_tx));
        self.notices.insert(lease_id, notice_tx);
    }

    /// Gives an adopted workload of `lease_id` for `placement` what it
    /// holds of its lease's data, found again after the adoption: its
    /// workspaces are synced from then on and at its end, its datasets stay
    /// in the cache, its way to the store is open. Nothing for a workload
    /// that is not waiting for it.
    pub fn attach_data(
        &mut self,
        lease_id: Uuid,
        placement: u64,
        session: Option<Arc<LeaseStorage>>,
        holds: Vec<CacheHold>,
        relay: Option<super::store_relay::RelayTask>,
    ) {
        if let Some((p, tx)) = self.late_data.remove(&lease_id) {
            if p == placement {
                let _ = tx.send(LeaseData {
                    session,
                    _holds: holds,
                    _relay: relay,
                });
            }
        }
    }

    /// Whether an adopted workload of `lease_id` for `placement` waits for
    /// its data ([`Workloads::attach_data`]).
    pub fn awaits_data(&self, lease_id: Uuid, placement: u64) -> bool {
        self.late_data
            .get(&lease_id)
            .is_some_and(|(p, _)| *p == placement)
    }

    /// The container engine, where the runtime is one.
    pub fn container_engine(&self) -> Option<Engine> {
        self.container.as_ref().map(|c| c.engine.clone())
    }

    /// Tells the running workload of `lease_id` its preemption comes at
    /// `deadline`; nothing when none runs.
    pub fn notify(
        &mut self,
        lease_id: Uuid,
        deadline: chrono::DateTime<chrono::Utc>,
        reason: lh_events::PreemptionReason,
    ) {
        if let Some(tx) = self.notices.remove(&lease_id) {
            let _ = tx.send(Notice { deadline, reason });
        }
    }

    /// The doors into the running workloads, for the session server.
    pub fn doors(&self) -> super::door::Doors {
        self.doors.clone()
    }

    /// Stops, without a report that counts, a workload of `lease_id` that
    /// runs for another placement than `placement`.
    pub fn stop_stale(&mut self, lease_id: Uuid, placement: u64) {
        if self
            .running
            .get(&lease_id)
            .is_some_and(|(p, _)| *p != placement)
        {
            self.stop_because(lease_id, WorkspaceSyncReason::Move);
        }
    }

    /// Whether a workload of `lease_id` was asked to stop and has not
    /// reported its end.
    pub fn is_stopping(&self, lease_id: Uuid) -> bool {
        self.stopping.contains(&lease_id)
    }

    /// Asks the workload of `lease_id` to stop (SIGTERM, then SIGKILL after
    /// the grace period); its [`Finished`] follows. False when none runs.
    pub fn stop(&mut self, lease_id: Uuid) -> bool {
        self.stop_because(lease_id, WorkspaceSyncReason::End)
    }

    /// [`Workloads::stop`], saying why: its workspaces' last sync says so.
    pub fn stop_because(&mut self, lease_id: Uuid, reason: WorkspaceSyncReason) -> bool {
        self.notices.remove(&lease_id);
        match self.running.remove(&lease_id) {
            Some((_, stop)) => {
                let _ = stop.send((self.grace, reason));
                self.stopping.insert(lease_id);
                true
            }
            None => false,
        }
    }

    /// The workload of `lease_id` for `placement` reported its end: its
    /// share leaves its GPU's MPS daemon, which quits with the last one.
    pub fn forget(&mut self, lease_id: Uuid, placement: u64) {
        if let Some(mps) = &mut self.mps {
            mps.release((lease_id, placement));
        }
        self.stopping.remove(&lease_id);
        if self
            .running
            .get(&lease_id)
            .is_some_and(|(p, _)| *p == placement)
        {
            self.running.remove(&lease_id);
        }
    }

    /// Gives each lease's workload a RAM share of `host`: its part of the
    /// host's GPUs, as a part of the host's memory.
    pub fn share_out(&mut self, host: Host) {
        self.host = Some(host);
    }

    /// What this node enforces, declared in its `node.registered`: what
    /// the runtime really does. The simulated runtime keeps what
    /// `registered` says (the fleet file's node).
    pub fn declare(&self, registered: &mut NodeRegistered) {
        let Some(isolation) = self.isolation else {
            return;
        };
        registered.isolation = isolation;
        if self.simulated_gpus {
            return;
        }
        registered.gpu_sharing = if self.hami_core {
            GpuSharing::HamiCore
        } else if self.mps.is_some() {
            GpuSharing::Mps
        } else if registered.gpus.iter().any(|g| g.mig) {
            GpuSharing::Mig
        } else {
            GpuSharing::None
        };
    }

    /// The limits the MPS daemon of `gpu` (a UUID) holds, while it hosts
    /// shares.
    pub fn mps_limits(&self, gpu: &str) -> Option<MpsLimits> {
        self.mps.as_ref()?.limits(gpu)
    }

    /// Whether leases run anything here (false on a simulated node).
    pub fn runs_workloads(&self) -> bool {
        self.runtime.is_some()
    }

    /// The signal of a container just started for `placement`: answered
    /// once the engine runs it, closed if it ends or is stopped first.
    /// `None` for a workload that runs once spawned (or no workload).
    pub fn when_running(
        &mut self,
        lease_id: Uuid,
        placement: u64,
    ) -> Option<oneshot::Receiver<()>> {
        match self.running_signals.remove(&lease_id) {
            Some((p, running)) if p == placement => Some(running),
            _ => None,
        }
    }

    pub fn is_running(&self, lease_id: Uuid, placement: u64) -> bool {
        self.running
            .get(&lease_id)
            .is_some_and(|(p, _)| *p == placement)
    }
}

/// Removes a process record or an env file; one already gone is fine.
fn remove_record(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(record = %path.display(), error = %e, "cannot remove the workload record");
        }
    }
}

/// The ticks of a lease's periodic workspace syncs: every `session`'s
/// interval, the first one interval from now; a day apart without one
/// (the branch is off then).
fn sync_ticks(session: Option<&LeaseStorage>) -> tokio::time::Interval {
    let every = session.map_or(Duration::from_secs(86_400), |s| s.interval);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

#[cfg(test)]
mod tests;
