//! The workloads a lease runs.
//!
//! A lease may carry a [`Workload`]: a command, and an image for the
//! container runtime. A [`Runtime`] starts it on the GPUs of an
//! [`Assignment`] and hands back a [`RunningWorkload`], whose exit ends the
//! lease with the exit code, or which the agent stops gracefully (SIGTERM, a
//! grace period, then SIGKILL).
//!
//! * [`ProcessRuntime`] runs the command as a child process in its own
//!   process group, with the GPU environment of [`lease_env`] and, where the
//!   host has a writable cgroup v2 memory controller, a cgroup with memory
//!   limits ([`cgroup`]).
//! * [`ContainerRuntime`] drives the docker or podman CLI with the NVIDIA
//!   flags ([`container`]).
//!
//! Everything that decides (environment, cgroup values, CLI arguments) is a
//! pure function tested on its own; this module only spawns, signals and
//! reaps. [`supervisor`] runs one task per lease around it. See
//! `docs/workloads.md`.

pub mod assignment;
pub mod cgroup;
pub mod container;
pub mod container_cgroup;
pub mod door;
pub mod engine;
mod engine_state;
pub(crate) mod executor;
pub mod gang;
pub mod gang_link;
mod host_calls;
pub mod lease_log;
pub mod lease_user;
pub mod mps;
pub mod process;
pub mod reconcile;
pub mod stderr;
pub mod store_relay;
pub mod supervisor;
pub mod tenant_network;

use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use lh_domain::workload::{bad_env_value, denied_env_name};
use serde::{Deserialize, Serialize};
use tokio::process::Child;
use uuid::Uuid;

pub use crate::state::Exit;
pub use assignment::{validate_assignment, Assignment};
pub use cgroup::{CgroupConfig, MemoryLimits};
pub use container::{CliFlavor, ContainerRuntime, Engine, GpuDevices, PullPolicy};
pub use process::ProcessRuntime;

/// `CUDA_VISIBLE_DEVICES`: the devices CUDA enumerates (UUIDs accepted).
pub const ENV_CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// `NVIDIA_VISIBLE_DEVICES`: the devices the NVIDIA container toolkit exposes.
pub const ENV_NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// `CUDA_DEVICE_MEMORY_LIMIT`: HAMi-core's device memory cap, e.g. `10240m`.
pub const ENV_CUDA_DEVICE_MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// `CUDA_DEVICE_SM_LIMIT`: HAMi-core's SM utilisation cap in percent.
pub const ENV_CUDA_DEVICE_SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
/// `LEASEHOLD_LEASE_ID`: the lease the workload runs for.
pub const ENV_LEASE_ID: &str = "LEASEHOLD_LEASE_ID";
/// `LD_PRELOAD`: how HAMi-core gets into a share's workload; set by the
/// agent after the tenant's variables (which may not name it anyway).
pub const ENV_LD_PRELOAD: &str = "LD_PRELOAD";
/// Where a container sees the HAMi-core library the agent bind-mounts.
pub const HAMI_CORE_IN_CONTAINER: &str = "/usr/local/leasehold/libvgpu.so";

/// Checks the HAMi-core library an operator names: an absolute path to a
/// file, without the `:` or `,` that would split a bind-mount argument.
pub fn check_hami_core_lib(path: &std::path::Path) -> Result<(), RuntimeError> {
    let text = path.to_string_lossy();
    if !path.is_absolute() || text.contains([':', ',']) {
        return Err(RuntimeError::InvalidConfig(format!(
            "--hami-core-lib {text}: an absolute path without ':' or ','"
        )));
    }
    if !path.is_file() {
        return Err(RuntimeError::InvalidConfig(format!(
            "--hami-core-lib {text}: no such file"
        )));
    }
    // Loaded into every share: one who may rewrite it runs code in all.
    let mode = std::os::unix::fs::MetadataExt::mode(
        &std::fs::metadata(path)
            .map_err(|e| RuntimeError::InvalidConfig(format!("--hami-core-lib {text}: {e}")))?,
    );
    if mode & 0o022 != 0 {
        return Err(RuntimeError::InvalidConfig(format!(
            "--hami-core-lib {text}: writable by other users (mode {:o}); make it 644",
            mode & 0o777
        )));
    }
    Ok(())
}

/// Whether the assignment is a memory-sliced share, whose caps HAMi-core
/// enforces.
pub fn is_share(assignment: &Assignment) -> bool {
    assignment.vram_limit_mib.is_some() || assignment.compute_milli.is_some()
}

/// The container label with the lease id.
pub const LABEL_LEASE: &str = "leasehold.lease";
/// The container label with the node id.
pub const LABEL_NODE: &str = "leasehold.node";
/// What every workload's mark starts with: a restarted agent finds what
/// its previous incarnation started by it ([`reconcile`]).
pub const MARK_PREFIX: &str = "lh-";

/// The mark of a lease's workload: `lh-<lease>`, the name of its container
/// and of its cgroup, and the start of its process record's name.
pub fn mark(lease_id: Uuid) -> String {
    format!("{MARK_PREFIX}{lease_id}")
}

/// The mark of one part of a lease (`part`: a gang's member other than the
/// first, see [`assignment::Assignment::part`]): `lh-<lease>.<part>`, or the
/// lease's own mark.
pub fn part_mark(lease_id: Uuid, part: Option<&str>) -> String {
    match part {
        Some(part) => format!("{}.{part}", mark(lease_id)),
        None => mark(lease_id),
    }
}

/// The lease a mark names (a part's mark included); `None` for anything
/// else.
pub fn lease_of_mark(name: &str) -> Option<Uuid> {
    let rest = name.strip_prefix(MARK_PREFIX)?;
    rest.split_once('.')
        .map_or(rest, |(lease, _)| lease)
        .parse()
        .ok()
}

/// One GPU's compute in thousandths; a share has 1..=1000.
pub const MILLI_PER_GPU: u32 = 1000;

/// What a lease runs. Travels with the lease (hence serde).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Program and arguments. Required by the process runtime; for the
    /// container runtime an empty command runs the image's default.
    pub command: Vec<String>,
    /// Container image; only the container runtime runs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Extra environment. The lease's own variables ([`lease_env`]) win
    /// over an entry of the same name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The container's network ([`tenant_network`]); none by default.
    #[serde(default, skip_serializing_if = "lh_events::WorkloadNetwork::is_none")]
    pub network: lh_events::WorkloadNetwork,
    /// Directories of the node's the container sees: its datasets
    /// read-only, its workspaces read and written (`crate::storage`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// The tenant's store, for a container that reaches its bucket itself
    /// ([`store_relay`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<lh_rpc::workload_env::StorageGrant>,
}

/// The signal a container's workload gets with a preemption notice.
pub const NOTICE_SIGNAL: &str = "USR1";
/// Where a container finds its lease's notices (`notice.json`).
pub const NOTICE_DIR_IN_CONTAINER: &str = "/run/leasehold";

/// A directory of the node's seen inside a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    pub host: std::path::PathBuf,
    /// Absolute, inside the container.
    pub path: String,
    pub writable: bool,
}

/// Where a workload's standard output and error go: both to its log file,
/// when it has one, opened for appending so that their lines interleave.
fn output_of(
    assignment: &Assignment,
) -> Result<(std::process::Stdio, std::process::Stdio), RuntimeError> {
    let cannot = |path: &std::path::Path, e: std::io::Error| {
        RuntimeError::InvalidConfig(format!("cannot open {}: {e}", path.display()))
    };
    match &assignment.log_file {
        Some(path) => {
            let stdout = lease_log::open(path).map_err(|e| cannot(path, e))?;
            let stderr = stdout.try_clone().map_err(|e| cannot(path, e))?;
            Ok((stdout.into(), stderr.into()))
        }
        None => Ok((
            std::process::Stdio::inherit(),
            std::process::Stdio::inherit(),
        )),
    }
}

impl From<ExitStatus> for Exit {
    fn from(status: ExitStatus) -> Self {
        Exit {
            code: status.code(),
            signal: status.signal(),
        }
    }
}

/// What [`RunningWorkload::stop`] had to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopOutcome {
    /// It had exited before the stop.
    AlreadyExited,
    /// It ended within the grace period after SIGTERM (`docker stop`).
    Terminated,
    /// The grace period ran out and it was SIGKILLed.
    Killed,
}

/// The result of a graceful stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    pub exit: Exit,
    pub outcome: StopOutcome,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("invalid assignment: {0}")]
    InvalidAssignment(String),
    #[error("invalid workload: {0}")]
    InvalidWorkload(String),
    #[error("invalid runtime configuration: {0}")]
    InvalidConfig(String),
    #[error("cannot enforce the share through MPS: {0}")]
    Mps(String),
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot wait for the workload: {0}")]
    Wait(#[source] io::Error),
    #[error("cannot signal process group {pgid}: {source}")]
    Signal {
        pgid: i32,
        #[source]
        source: io::Error,
    },
}

/// Starts workloads. `start` only spawns (it needs a tokio runtime, as
/// `tokio::process` does) and returns at once; waiting and stopping are
/// async on the [`RunningWorkload`]. A synchronous `start` keeps the trait
/// usable as `dyn Runtime` without an async-trait crate.
pub trait Runtime: Send + Sync {
    fn start(
        &self,
        assignment: &Assignment,
        workload: &Workload,
    ) -> Result<RunningWorkload, RuntimeError>;
}

/// The lease's own environment variables: the devices, HAMi-core's memory
/// and compute caps for a share, the MPS daemon's pipe directory for a
/// share that MPS enforces, and the lease id.
pub fn lease_env(assignment: &Assignment) -> BTreeMap<String, String> {
    let devices = assignment.device_uuids.join(",");
    let mut env = BTreeMap::new();
    env.insert(ENV_CUDA_VISIBLE_DEVICES.to_string(), devices.clone());
    env.insert(ENV_NVIDIA_VISIBLE_DEVICES.to_string(), devices);
    if let Some(mib) = assignment.vram_limit_mib {
        env.insert(ENV_CUDA_DEVICE_MEMORY_LIMIT.to_string(), format!("{mib}m"));
    }
    if let Some(milli) = assignment.compute_milli {
        env.insert(
            ENV_CUDA_DEVICE_SM_LIMIT.to_string(),
            sm_limit_pct(milli).to_string(),
        );
    }
    if let Some(pipe) = &assignment.mps_pipe_dir {
        env.insert(
            mps::ENV_MPS_PIPE_DIRECTORY.to_string(),
            pipe.display().to_string(),
        );
    }
    env.insert(ENV_LEASE_ID.to_string(), assignment.lease_id.to_string());
    env.extend(assignment.gang_env.clone());
    env
}

/// A compute share as HAMi-core's SM percentage: rounded down, so a share
/// never gets more than it pays for, but at least 1 (0 would mean no cap).
pub fn sm_limit_pct(compute_milli: u32) -> u32 {
    (compute_milli * 100 / MILLI_PER_GPU).clamp(1, 100)
}

/// The workload's environment with the lease's variables on top.
pub fn workload_env(assignment: &Assignment, workload: &Workload) -> BTreeMap<String, String> {
    let mut env = tenant_env(assignment.lease_id, workload);
    env.extend(lease_env(assignment));
    env
}

/// The tenant's variables that may reach a workload: the gateway refuses
/// the others, so one here comes from a log older than that rule or from a
/// forged event; it is dropped with a warning rather than failing the lease.
pub fn tenant_env(lease_id: Uuid, workload: &Workload) -> BTreeMap<String, String> {
    workload
        .env
        .iter()
        .filter(|(name, value)| {
            let why = denied_env_name(name).or_else(|| bad_env_value(value));
            if let Some(why) = why {
                tracing::warn!(lease = %lease_id, variable = %name, why, "tenant variable dropped");
            }
            why.is_none()
        })
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// Refuses environment variable names that cannot be passed on: empty, or
/// containing `=` or a NUL byte.
pub fn validate_env(workload: &Workload) -> Result<(), RuntimeError> {
    for name in workload.env.keys() {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(RuntimeError::InvalidWorkload(format!(
                "environment variable name {name:?}"
            )));
        }
    }
    Ok(())
}

/// A started workload. Wait for it or stop it: dropping it SIGKILLs its
/// process group without the cleanup of [`RunningWorkload::wait`] (a cgroup
/// directory, a container, may be left behind).
#[derive(Debug)]
pub struct RunningWorkload {
    lease_id: Uuid,
    child: Child,
    /// The child's pid, which is also its process group id.
    pgid: i32,
    status: Option<ExitStatus>,
    cleaned_up: bool,
    kind: Kind,
    /// Why it failed, as the runtime saw it (the engine's causes).
    failure: Option<lh_events::LeaseFailure>,
}

#[derive(Debug)]
enum Kind {
    Process {
        cgroup: Option<cgroup::LeaseCgroup>,
        /// Dropped when the workload is cleaned up: its processes die
        /// with it and its home goes.
        user: Option<lease_user::LeaseUser>,
        /// What it was started with: a session's command gets the same.
        env: BTreeMap<String, String>,
    },
    Container(Box<ContainerWorkload>),
}

/// What the agent keeps of a container it started.
#[derive(Debug)]
struct ContainerWorkload {
    engine: Engine,
    name: String,
    image: String,
    stop_margin: Duration,
    /// The tenant's variables, removed when the workload ends.
    env_file: Option<PathBuf>,
    /// Not running by then: the lease fails `start_timeout`.
    start_deadline: tokio::time::Instant,
    running_seen: bool,
    /// Where its memory limit is held, when the agent holds it.
    memory_cgroups: Option<container_cgroup::ContainerCgroups>,
    /// The tenant network it joined, left when it is removed.
    network: Option<(tenant_network::TenantNetworks, Uuid)>,
    /// Its way to the store, closed when it is removed.
    relay: Option<store_relay::RelayTask>,
    /// A gang member's link to the others, released when it is removed.
    gang_link: Option<gang_link::LinkTask>,
    /// Told once the engine says it runs; dropped if it never does.
    on_running: Option<tokio::sync::oneshot::Sender<()>>,
    /// The engine said it runs.
    ran: bool,
}

impl RunningWorkload {
    fn new(lease_id: Uuid, child: Child, kind: Kind) -> Result<Self, RuntimeError> {
        let pid = child
            .id()
            .ok_or_else(|| RuntimeError::Wait(io::Error::other("spawned child has no pid")))?;
        let pgid = i32::try_from(pid).expect("pids fit in pid_t");
        Ok(RunningWorkload {
            lease_id,
            child,
            pgid,
            status: None,
            cleaned_up: false,
            kind,
            failure: None,
        })
    }

    pub fn lease_id(&self) -> Uuid {
        self.lease_id
    }

    /// Pid of the workload process (of the `<cli> run` process for a
    /// container), which leads its own process group.
    pub fn pid(&self) -> u32 {
        self.pgid as u32
    }

    /// Why the workload failed, as the runtime saw it: known once
    /// [`RunningWorkload::wait`] or [`RunningWorkload::stop`] returned.
    pub fn failure(&self) -> Option<lh_events::LeaseFailure> {
        self.failure
    }

    /// Whether it ran: a process once spawned, a container once its
    /// engine said it runs.
    pub fn ran(&self) -> bool {
        match &self.kind {
            Kind::Container(c) => c.ran,
            Kind::Process { .. } => true,
        }
    }

    /// How a session enters it; `None` once its user is gone.
    pub fn door(&self) -> Option<door::DoorTarget> {
        match &self.kind {
            Kind::Container(c) => Some(door::DoorTarget::Container {
                engine: c.engine.clone(),
                name: c.name.clone(),
            }),
            Kind::Process { cgroup, user, env } => {
                let user = user.as_ref()?;
                Some(door::DoorTarget::Process {
                    uid: user.uid(),
                    home: user.home().to_path_buf(),
                    env: env.clone(),
                    cgroup_procs: cgroup.as_ref().map(|c| c.procs().to_owned()),
                })
            }
        }
    }

    /// For a container: answered once [`RunningWorkload::wait`] sees the
    /// engine run it (after its image is pulled and its process started),
    /// closed unanswered if it ends or is stopped first. `None` for a
    /// process, which runs once spawned.
    pub fn when_running(&mut self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        match &mut self.kind {
            Kind::Container(c) if !c.running_seen => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                c.on_running = Some(tx);
                Some(rx)
            }
            _ => None,
        }
    }

    /// Waits until the workload exits, kills what is left of its process
    /// group and removes its cgroup. A container that is not running by its
    /// start deadline is killed and fails `start_timeout`. Cancel-safe; once
    /// it has returned, later calls return the same exit at once.
    pub async fn wait(&mut self) -> Result<Exit, RuntimeError> {
        let status = match self.status {
            Some(status) => status,
            None => {
                let status = match &mut self.kind {
                    Kind::Container(c) if !c.running_seen => {
                        let started =
                            engine_state::until_running(&c.engine, &c.name, c.start_deadline);
                        tokio::select! {
                            status = self.child.wait() => Some(status.map_err(RuntimeError::Wait)?),
                            running = started => {
                                c.running_seen = true;
                                if running {
                                    c.ran = true;
                                    if let Some(tx) = c.on_running.take() {
                                        let _ = tx.send(());
                                    }
                                    None
                                } else {
                                    tracing::warn!(lease = %self.lease_id, container = %c.name,
                                        "the container is not running by its start deadline");
                                    self.failure = Some(lh_events::LeaseFailure::StartTimeout);
                                    Some(self.kill_and_reap().await?)
                                }
                            }
                        }
                    }
                    _ => None,
                };
                let mut status = match status {
                    Some(status) => status,
                    None => self.child.wait().await.map_err(RuntimeError::Wait)?,
                };
                // `run` failing on its own (125, 127) while the engine still
                // has the container: the container's exit is the engine's to
                // tell, not the CLI's.
                if let Kind::Container(c) = &self.kind {
                    if matches!(status.code(), Some(125 | 127)) {
                        if let Some(code) = engine_state::exit_code_of(&c.engine, &c.name).await {
                            if Some(code) != status.code() {
                                tracing::warn!(lease = %self.lease_id, run = ?status.code(), container = code,
                                    "the engine's run ended before its container; its exit is the container's");
                            }
                            status =
                                std::os::unix::process::ExitStatusExt::from_raw((code & 0xff) << 8);
                        }
                    }
                }
                self.status = Some(status);
                status
            }
        };
        self.clean_up().await;
        Ok(status.into())
    }

    /// Stops the workload gracefully: SIGTERM to its process group (for a
    /// container `<cli> stop` with the grace as its timeout), up to `grace`
    /// to exit, then SIGKILL. Returns how it ended; the process is reaped
    /// and cleaned up as by [`RunningWorkload::wait`].
    pub async fn stop(&mut self, grace: Duration) -> Result<Stopped, RuntimeError> {
        if self.status.is_none() {
            self.status = self.child.try_wait().map_err(RuntimeError::Wait)?;
        }
        if let Some(status) = self.status {
            self.clean_up().await;
            return Ok(Stopped {
                exit: status.into(),
                outcome: StopOutcome::AlreadyExited,
            });
        }
        let (status, outcome) = match &self.kind {
            Kind::Process { .. } => {
                signal_group(self.pgid, libc::SIGTERM)?;
                match tokio::time::timeout(grace, self.child.wait()).await {
                    Ok(status) => (status.map_err(RuntimeError::Wait)?, StopOutcome::Terminated),
                    Err(_) => (self.kill_and_reap().await?, StopOutcome::Killed),
                }
            }
            Kind::Container(c) => {
                let (engine, name, margin) = (c.engine.clone(), c.name.clone(), c.stop_margin);
                container::run_stop_command(&engine, &name, grace, margin).await;
                match tokio::time::timeout(margin, self.child.wait()).await {
                    Ok(status) => {
                        let status = status.map_err(RuntimeError::Wait)?;
                        (status, container::stop_outcome(status.into()))
                    }
                    Err(_) => {
                        tracing::warn!(lease = %self.lease_id, cli = %engine.cli.display(),
                            "container did not stop; killing the CLI process");
                        (self.kill_and_reap().await?, StopOutcome::Killed)
                    }
                }
            }
        };
        self.status = Some(status);
        self.clean_up().await;
        Ok(Stopped {
            exit: status.into(),
            outcome,
        })
    }

    /// Tells a container's first process that its lease is about to be
    /// preempted (SIGUSR1, as batch schedulers warn of an end): a process
    /// that first in a container ignores a signal it has no handler for,
    /// so only a workload that listens hears it. A process lease is told
    /// nothing: SIGUSR1 ends a process that does not handle it.
    pub async fn notify(&self) -> bool {
        match &self.kind {
            Kind::Container(c) => {
                container::run_signal_command(&c.engine, &c.name, NOTICE_SIGNAL).await
            }
            Kind::Process { .. } => false,
        }
    }

    async fn kill_and_reap(&mut self) -> Result<ExitStatus, RuntimeError> {
        signal_group(self.pgid, libc::SIGKILL)?;
        self.child.wait().await.map_err(RuntimeError::Wait)
    }

    /// After the leader exited: SIGKILL whatever it left in its process
    /// group, kill and remove the cgroup. The leader's pid cannot have been
    /// reused as a process group id yet: pids are handed out in increasing
    /// order up to `pid_max` and this runs right after the reap.
    async fn clean_up(&mut self) {
        if self.cleaned_up {
            return;
        }
        if let Err(e) = signal_group(self.pgid, libc::SIGKILL) {
            tracing::warn!(lease = %self.lease_id, error = %e, "cannot kill leftover processes");
        }
        match &mut self.kind {
            Kind::Process { cgroup, user, .. } => {
                // Its processes may have left the group: the cgroup kills
                // them where there is one, the user's end everywhere (on a
                // blocking thread: it scans /proc and removes its home).
                if let Some(cgroup) = cgroup {
                    cgroup.remove().await;
                }
                if let Some(user) = user.take() {
                    let _ = tokio::task::spawn_blocking(move || drop(user)).await;
                }
            }
            Kind::Container(c) => {
                if let Some(path) = &c.env_file {
                    container::remove_env_file(path);
                }
                let exit: Option<Exit> = self.status.map(Into::into);
                if self.failure.is_none() {
                    self.failure = container_failure(c, exit).await;
                }
                // Ended before a look saw it run: it ran if the engine made
                // it (a container exists only once its image is there).
                use lh_events::LeaseFailure::{EngineError, ImageMissing, StartTimeout};
                c.ran = c.ran
                    || (exit.is_some()
                        && !matches!(
                            self.failure,
                            Some(ImageMissing | EngineError | StartTimeout)
                        ));
                reconcile::remove_container(&c.engine, &c.name).await;
                c.relay = None;
                if let Some(cgroups) = &c.memory_cgroups {
                    cgroups.remove(&c.name).await;
                }
                if let Some((networks, tenant)) = c.network.take() {
                    let _ = tokio::task::spawn_blocking(move || networks.leave(tenant)).await;
                }
                if let Some(link) = c.gang_link.take() {
                    link.release().await;
                }
            }
        }
        self.cleaned_up = true;
    }
}

impl Drop for RunningWorkload {
    fn drop(&mut self) {
        if self.status.is_none() {
            // tokio reaps a dropped child in the background.
            let _ = signal_group(self.pgid, libc::SIGKILL);
        }
        if let Kind::Container(c) = &mut self.kind {
            if let Some(path) = &c.env_file {
                container::remove_env_file(path);
            }
            // Not cleaned up: its container, if left, is an orphan the
            // sweep removes; the count of its network must not stay.
            if let Some((networks, tenant)) = c.network.take() {
                std::thread::spawn(move || networks.leave(tenant));
            }
        }
    }
}

/// Why a container's workload failed, from the engine and the kernel:
/// `run` ended without making the container (the image missing, or the
/// engine refusing), or the OOM killer ended it. `None` for an exit of the
/// workload's own.
async fn container_failure(
    c: &ContainerWorkload,
    exit: Option<Exit>,
) -> Option<lh_events::LeaseFailure> {
    use lh_events::LeaseFailure;
    let exit = exit?;
    if exit.code == Some(0) {
        return None;
    }
    if engine_state::container_status(&c.engine, &c.name)
        .await
        .is_none()
    {
        return Some(if engine_state::image_exists(&c.engine, &c.image).await {
            LeaseFailure::EngineError
        } else {
            LeaseFailure::ImageMissing
        });
    }
    let killed =
        exit.code == Some(container::EXIT_CODE_KILLED) || exit.signal == Some(libc::SIGKILL);
    let oom = match &c.memory_cgroups {
        Some(cgroups) => cgroups.oom_killed(&c.name, killed),
        None => engine_state::engine_saw_oom(&c.engine, &c.name).await,
    };
    oom.then_some(LeaseFailure::OutOfMemory)
}

/// `killpg`; a group that no longer exists is not an error.
fn signal_group(pgid: i32, signal: libc::c_int) -> Result<(), RuntimeError> {
    assert!(pgid > 1, "refusing to signal process group {pgid}");
    // SAFETY: killpg(2) has no memory-safety preconditions.
    if unsafe { libc::killpg(pgid, signal) } == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::ESRCH) {
        return Ok(());
    }
    Err(RuntimeError::Signal {
        pgid,
        source: error,
    })
}

/// Makes `dir` readable and enterable by the agent's user only; the
/// directories above it that are missing get the usual mode. (A recursive
/// `DirBuilder` with mode 0700 would give them 0700 too, and shut the lease
/// users out of the homes below a state directory made so.)
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_private_dir_is_shut_and_the_dirs_made_above_it_are_not() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state").join("homes");
        super::create_private_dir(&dir).unwrap();
        let mode = |p: &std::path::Path| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).unwrap().permissions().mode() & 0o777
        };
        assert_eq!(mode(&dir), 0o700);
        // Searchable by others, whatever the umask left of 0777.
        assert_eq!(mode(&root.path().join("state")) & 0o001, 0o001);
        // Again: already there is fine.
        super::create_private_dir(&dir).unwrap();
    }

    use super::*;

    fn assignment() -> Assignment {
        Assignment {
            lease_id: Uuid::from_u128(7),
            device_uuids: vec!["GPU-aaa".into(), "MIG-bbb".into()],
            vram_limit_mib: None,
            compute_milli: None,
            memory_share_bytes: None,
            cpu_milli: None,
            mps_pipe_dir: None,
            mps_server_uid: None,
            log_file: None,
            tenant_id: None,
            gang_env: Default::default(),
            part: None,
            gang_link: None,
        }
    }

    #[test]
    fn whole_gpus_get_devices_and_lease_id_only() {
        let env = lease_env(&assignment());
        let keys: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                ENV_CUDA_VISIBLE_DEVICES,
                ENV_LEASE_ID,
                ENV_NVIDIA_VISIBLE_DEVICES
            ]
        );
        assert_eq!(env[ENV_CUDA_VISIBLE_DEVICES], "GPU-aaa,MIG-bbb");
        assert_eq!(env[ENV_NVIDIA_VISIBLE_DEVICES], "GPU-aaa,MIG-bbb");
        assert_eq!(env[ENV_LEASE_ID], Uuid::from_u128(7).to_string());
    }

    #[test]
    fn a_share_gets_hami_core_caps() {
        let a = Assignment {
            vram_limit_mib: Some(10 * 1024),
            compute_milli: Some(300),
            ..assignment()
        };
        let env = lease_env(&a);
        assert_eq!(env[ENV_CUDA_DEVICE_MEMORY_LIMIT], "10240m");
        assert_eq!(env[ENV_CUDA_DEVICE_SM_LIMIT], "30");
        assert!(!env.contains_key(mps::ENV_MPS_PIPE_DIRECTORY));
        let a = Assignment {
            mps_pipe_dir: Some("/state/mps/gpu0/pipe".into()),
            mps_server_uid: None,
            ..a
        };
        assert_eq!(
            lease_env(&a)[mps::ENV_MPS_PIPE_DIRECTORY],
            "/state/mps/gpu0/pipe"
        );
    }

    #[test]
    fn sm_limit_rounds_down_but_never_to_zero() {
        assert_eq!(sm_limit_pct(1), 1);
        assert_eq!(sm_limit_pct(9), 1);
        assert_eq!(sm_limit_pct(15), 1);
        assert_eq!(sm_limit_pct(333), 33);
        assert_eq!(sm_limit_pct(999), 99);
        assert_eq!(sm_limit_pct(1000), 100);
    }

    #[test]
    fn lease_variables_win_over_the_workload_env() {
        let workload = Workload {
            command: vec!["true".into()],
            image: None,
            env: BTreeMap::from([
                (ENV_CUDA_VISIBLE_DEVICES.to_string(), "all".to_string()),
                ("MY_VAR".to_string(), "x".to_string()),
            ]),
            network: Default::default(),
            mounts: Vec::new(),
            store: None,
        };
        let env = workload_env(&assignment(), &workload);
        assert_eq!(env[ENV_CUDA_VISIBLE_DEVICES], "GPU-aaa,MIG-bbb");
        assert_eq!(env["MY_VAR"], "x");
    }

    #[test]
    fn bad_assignments_are_refused() {
        let cases = [
            Assignment {
                device_uuids: vec![],
                ..assignment()
            },
            Assignment {
                device_uuids: vec!["GPU-a,GPU-b".into()],
                ..assignment()
            },
            Assignment {
                device_uuids: vec!["".into()],
                ..assignment()
            },
            Assignment {
                compute_milli: Some(0),
                ..assignment()
            },
            Assignment {
                compute_milli: Some(1001),
                ..assignment()
            },
            Assignment {
                vram_limit_mib: Some(0),
                ..assignment()
            },
            Assignment {
                memory_share_bytes: Some(0),
                ..assignment()
            },
        ];
        for case in cases {
            assert!(
                matches!(
                    validate_assignment(&case),
                    Err(RuntimeError::InvalidAssignment(_))
                ),
                "{case:?}"
            );
        }
        validate_assignment(&assignment()).unwrap();
    }

    #[test]
    fn bad_env_names_are_refused() {
        for name in ["", "A=B", "A\0"] {
            let workload = Workload {
                env: BTreeMap::from([(name.to_string(), "v".to_string())]),
                ..Workload::default()
            };
            assert!(validate_env(&workload).is_err(), "{name:?}");
        }
        let ok = Workload {
            env: BTreeMap::from([("A_1".to_string(), "x=y".to_string())]),
            ..Workload::default()
        };
        validate_env(&ok).unwrap();
    }

    #[test]
    fn workload_round_trips_through_json() {
        let workload = Workload {
            command: vec!["python".into(), "train.py".into()],
            image: Some("nvcr.io/nvidia/pytorch:24.01-py3".into()),
            env: BTreeMap::from([("EPOCHS".to_string(), "3".to_string())]),
            network: Default::default(),
            mounts: vec![Mount {
                host: "/var/lib/leasehold/data/x".into(),
                path: "/data".into(),
                writable: false,
            }],
            store: None,
        };
        let json = serde_json::to_string(&workload).unwrap();
        assert_eq!(serde_json::from_str::<Workload>(&json).unwrap(), workload);
        let bare: Workload = serde_json::from_str(r#"{"command":["true"]}"#).unwrap();
        assert_eq!(bare.image, None);
        assert!(bare.env.is_empty());
    }
}
