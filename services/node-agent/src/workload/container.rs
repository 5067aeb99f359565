//! The container runtime: the lease's image run by the docker or podman CLI.
//!
//! `<cli> run --name lh-<lease_id>` stays in the foreground; its exit
//! code is the workload's (docker and podman pass the container's through;
//! 125 to 127 are the CLI's own errors). The container is removed by the
//! agent after its exit, once the agent has read why it ended. The GPUs
//! are given by UUID:
//!
//! * docker (NVIDIA container toolkit): `--gpus "device=GPU-a,GPU-b"`, with
//!   the double quotes in the argument, because docker splits the value of
//!   `--gpus` on commas as CSV;
//! * podman (CDI): one `--device nvidia.com/gpu=<uuid>` per device; the CDI
//!   spec (`nvidia-ctk cdi generate`) must name devices by UUID;
//! * simulated GPUs ([`GpuDevices::StandIn`]): one stand-in character
//!   device per GPU, made by the agent, passed with `--device`.
//!
//! Every container is confined the same way ([`run_args`]; the tests on a
//! real engine are `tests/container_engine.rs`): a read-only root with a
//! writable `/scratch` (tmpfs); no capability; `no-new-privileges`; the
//! engine's default seccomp profile; with podman a user namespace of its
//! own (`--userns=auto`, from the host's `containers` subordinate ids), so
//! that root inside is an unprivileged id outside; no network; no host
//! path; process, file and CPU limits and a memory limit from the lease's
//! size; no log kept by the engine (the lease log is the one copy).
//!
//! The lease's variables ([`super::lease_env`]) go in as `-e NAME=value`,
//! after the tenant's: those are written to a 0600 `--env-file` in the
//! agent's state directory, removed when the workload ends, so that they
//! neither show in the host's process list nor reach the CLI's own
//! environment (a tenant's `DOCKER_HOST` or `HTTPS_PROXY` would reconfigure
//! the CLI itself). The CLI runs with a cleared environment plus the few
//! variables of the agent's that it needs ([`CLI_ENV_ALLOWED`]). The image
//! must be an OCI image reference and comes after `--`, so that no image
//! string can be read as a flag.
//!
//! The container carries its lease's mark for a restarted agent
//! ([`super::reconcile`]): the name, and the labels `leasehold.lease` and
//! (when the runtime knows its node) `leasehold.node`.
//!
//! A stop is `<cli> stop --timeout <s> lh-<lease_id>` (podman: `--time`),
//! which sends SIGTERM, waits, then SIGKILLs the container; the `run`
//! process then exits (137 when the container was killed). If the CLI does
//! not finish within the margin after that, the `run` process group is
//! SIGKILLed.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use lh_domain::workload::check_image_reference;
use lh_events::WorkloadNetwork;
use uuid::Uuid;

use super::cgroup::{memory_limits, DEFAULT_HARD_LIMIT_PCT, DEFAULT_SOFT_LIMIT_PCT};
use super::container_cgroup::ContainerCgroups;
pub use super::engine::{CliFlavor, Engine, CLI_ENV_ALLOWED};
use super::tenant_network::{TenantNetworks, LABEL_TENANT};
use super::{
    is_share, lease_env, mark, tenant_env, validate_assignment, validate_env, Assignment, Exit,
    Kind, RunningWorkload, Runtime, RuntimeError, StopOutcome, Workload, ENV_LD_PRELOAD,
    HAMI_CORE_IN_CONTAINER, LABEL_LEASE, LABEL_NODE,
};

/// How long past the grace period a stop waits for the CLI before it kills
/// the `run` process.
pub const DEFAULT_STOP_MARGIN: Duration = Duration::from_secs(10);
/// `<cli> run`'s exit code when the container was SIGKILLed (128 + 9).
pub const EXIT_CODE_KILLED: i32 = 137;
/// Most processes and threads of one container, by default.
pub const DEFAULT_PIDS_MAX: u32 = 4096;
/// Most open files of one container's processes, by default: under the
/// hard limit a sandboxed agent is commonly given (20,000 here).
pub const DEFAULT_NOFILE_MAX: u32 = 16_384;
/// How long a container may take from `run` to running (a pull included),
/// by default.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(900);
/// `/scratch` of a lease without a memory limit, bytes.
pub const DEFAULT_SCRATCH_BYTES: u64 = 1 << 30;
/// Where a container's writable scratch space is; its root is read-only.
pub const SCRATCH_DIR: &str = "/scratch";
/// The ids of one container's user namespace (podman `--userns=auto`).
pub const USERNS_SIZE: u32 = 65_536;

/// When the engine fetches the image (`--pull`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PullPolicy {
    /// Only an image the engine does not hold yet.
    Missing,
    /// Never: a lease of an image the node lacks fails `image_missing`.
    Never,
    /// Every start.
    Always,
    /// When the registry has a newer one.
    Newer,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Missing => "missing",
            PullPolicy::Never => "never",
            PullPolicy::Always => "always",
            PullPolicy::Newer => "newer",
        }
    }
}

/// How a lease's GPUs reach its container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuDevices {
    /// Through the NVIDIA toolkit (docker `--gpus`) or its CDI spec (podman).
    Toolkit,
    /// Simulated GPUs: a stand-in character device per GPU at
    /// `<dir>/<uuid>`, made by the agent on the first start, passed with
    /// `--device` and seen at the same path inside (a user namespace
    /// cannot make device nodes, so the engine binds the host's path).
    StandIn { dir: PathBuf },
}

/// Runs workloads as containers through a docker or podman CLI.
#[derive(Debug, Clone)]
pub struct ContainerRuntime {
    /// The CLI binary (`docker`, `/usr/bin/podman`, …).
    pub cli: PathBuf,
    /// The image a workload that names none runs in (`LH_DEFAULT_IMAGE`);
    /// without one such a workload does not start here.
    pub default_image: Option<String>,
    pub flavor: CliFlavor,
    /// Flags before the subcommand of every call.
    pub global_args: Vec<String>,
    pub pull: PullPolicy,
    /// podman: a user namespace per container (`--userns=auto`).
    pub user_namespace: bool,
    pub pids_max: u32,
    pub nofile_max: u32,
    /// From `run` to running; past it the lease fails `start_timeout`.
    pub start_timeout: Duration,
    pub gpu_devices: GpuDevices,
    /// Where the agent holds the memory limits itself (a cgroupfs engine):
    /// see [`super::container_cgroup`]. `None`: the engine's `--memory`.
    pub memory_cgroups: Option<ContainerCgroups>,
    /// `--memory` as a percentage of the lease's RAM share.
    pub hard_limit_pct: u8,
    /// `--memory-reservation` as a percentage of the share, capped at the
    /// hard limit.
    pub soft_limit_pct: u8,
    /// See [`DEFAULT_STOP_MARGIN`].
    pub stop_margin: Duration,
    /// The node whose agent runs the containers, put on each as a label so
    /// that a restarted agent finds its own.
    pub node_id: Option<String>,
    /// Where the tenant's env files go while their workloads run.
    pub env_dir: PathBuf,
    /// HAMi-core, bind-mounted read-only and preloaded into the containers
    /// of shares.
    pub hami_core_lib: Option<PathBuf>,
    /// The tenants' networks, for the containers that ask for theirs.
    pub tenant_networks: TenantNetworks,
    /// The host-wide lock around a change of gangs' links
    /// ([`super::gang_link`]).
    pub gang_link_lock_file: PathBuf,
}

impl ContainerRuntime {
    pub fn docker(cli: impl Into<PathBuf>) -> Self {
        Self::with_flavor(cli.into(), CliFlavor::Docker)
    }

    pub fn podman(cli: impl Into<PathBuf>) -> Self {
        Self::with_flavor(cli.into(), CliFlavor::Podman)
    }

    fn with_flavor(cli: PathBuf, flavor: CliFlavor) -> Self {
        ContainerRuntime {
            cli: cli.clone(),
            default_image: None,
            flavor,
            global_args: Vec::new(),
            pull: PullPolicy::Missing,
            user_namespace: flavor == CliFlavor::Podman,
            pids_max: DEFAULT_PIDS_MAX,
            nofile_max: DEFAULT_NOFILE_MAX,
            start_timeout: DEFAULT_START_TIMEOUT,
            gpu_devices: GpuDevices::Toolkit,
            memory_cgroups: None,
            hard_limit_pct: DEFAULT_HARD_LIMIT_PCT,
            soft_limit_pct: DEFAULT_SOFT_LIMIT_PCT,
            stop_margin: DEFAULT_STOP_MARGIN,
            node_id: None,
            env_dir: std::env::temp_dir().join("leasehold-env"),
            hami_core_lib: None,
            tenant_networks: TenantNetworks::new(
                Engine {
                    cli: cli.clone(),
                    flavor,
                    global_args: Vec::new(),
                },
                None,
            ),
            gang_link_lock_file: PathBuf::from(super::gang_link::DEFAULT_LOCK_FILE),
        }
    }

    /// See [`ContainerRuntime::hami_core_lib`]; `lib` checked by
    /// [`super::check_hami_core_lib`].
    pub fn with_hami_core_lib(mut self, lib: PathBuf) -> Self {
        self.hami_core_lib = Some(lib);
        self
    }

    /// Writes the tenant's env files under `dir` (the agent's state
    /// directory in service; a temporary directory by default).
    pub fn env_files_in(mut self, dir: impl Into<PathBuf>) -> Self {
        self.env_dir = dir.into();
        self
    }

    /// The engine this runtime drives.
    pub fn engine(&self) -> Engine {
        Engine {
            cli: self.cli.clone(),
            flavor: self.flavor,
            global_args: self.global_args.clone(),
        }
    }

    /// Gives every call of the CLI `args` before its subcommand.
    pub fn with_global_args(mut self, args: Vec<String>) -> Self {
        self.global_args = args;
        self.tenant_networks.engine = self.engine();
        self
    }

    /// Labels every container with `node_id`.
    pub fn on_node(mut self, node_id: impl Into<String>) -> Self {
        self.node_id = Some(node_id.into());
        self.tenant_networks.node_id = self.node_id.clone();
        self
    }
}

/// `lh-<lease_id>`.
pub fn container_name(lease_id: Uuid) -> String {
    mark(lease_id)
}

/// The name of the container `assignment` runs in: its lease's, or its
/// part's ([`super::part_mark`]).
pub fn container_name_of(assignment: &Assignment) -> String {
    super::part_mark(assignment.lease_id, assignment.part.as_deref())
}

/// The env file of the tenant's variables: one `NAME=value` a line, the
/// lease's own names left out (they win; [`run_args`] sets them after).
/// `None` when there is nothing to pass.
pub fn env_file_contents(assignment: &Assignment, workload: &Workload) -> Option<String> {
    let lease = lease_env(assignment);
    let mut env = tenant_env(assignment.lease_id, workload);
    // The platform's store variables win over the tenant's own.
    if let Some(grant) = &workload.store {
        env.extend(super::store_relay::store_env(grant));
    }
    let lines: String = env
        .iter()
        .filter(|(name, _)| !lease.contains_key(*name))
        .map(|(name, value)| format!("{name}={value}\n"))
        .collect();
    (!lines.is_empty()).then_some(lines)
}

/// `<dir>/lh-<lease_id>.env`.
pub fn env_file_path(dir: &Path, lease_id: Uuid) -> PathBuf {
    dir.join(format!("{}.env", mark(lease_id)))
}

/// Writes `contents` to `<dir>/lh-<lease_id>.env`, readable by the agent's
/// user only, in a directory only it can enter.
pub fn write_env_file(dir: &Path, lease_id: Uuid, contents: &str) -> io::Result<PathBuf> {
    super::create_private_dir(dir)?;
    let path = env_file_path(dir, lease_id);
    // A file left by a crash may be anyone's and any mode: start afresh.
    remove_env_file(&path);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    file.write_all(contents.as_bytes())?;
    Ok(path)
}

pub(crate) fn remove_env_file(path: &Path) {
    if let Err(e) = fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(file = %path.display(), error = %e, "cannot remove the env file");
        }
    }
}

/// The arguments of `<cli> run` for a lease, with the tenant's variables
/// in `env_file` when there are any, and its memory limit held by the
/// agent in `cgroup_parent` when there is one.
pub fn run_args(
    runtime: &ContainerRuntime,
    assignment: &Assignment,
    workload: &Workload,
    image: &str,
    env_file: Option<&Path>,
    cgroup_parent: Option<&str>,
    network: Option<&str>,
) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--name"].map(String::from).into();
    args.push(container_name_of(assignment));
    args.push("--pull".into());
    args.push(runtime.pull.as_str().into());
    let limits = assignment
        .memory_share_bytes
        .map(|share| memory_limits(share, runtime.hard_limit_pct, runtime.soft_limit_pct));
    // Confinement: see the module's documentation.
    let scratch = limits.map_or(DEFAULT_SCRATCH_BYTES, |l| l.max_bytes);
    args.push("--read-only".into());
    let mut flag = |name: &str, value: String| {
        args.push(name.into());
        args.push(value);
    };
    flag(
        "--tmpfs",
        format!("{SCRATCH_DIR}:rw,nosuid,nodev,size={scratch},mode=1777"),
    );
    flag("--cap-drop", "ALL".into());
    flag("--security-opt", "no-new-privileges".into());
    if runtime.user_namespace && runtime.flavor == CliFlavor::Podman {
        flag("--userns", format!("auto:size={USERNS_SIZE}"));
    }
    flag("--network", network.unwrap_or("none").into());
    flag("--log-driver", "none".into());
    flag("--pids-limit", runtime.pids_max.to_string());
    flag("--ulimit", format!("nofile={0}:{0}", runtime.nofile_max));
    flag("--ulimit", format!("nproc={0}:{0}", runtime.pids_max));
    if let Some(milli) = assignment.cpu_milli {
        flag("--cpus", format!("{}.{:03}", milli / 1000, milli % 1000));
    }
    match (cgroup_parent, limits) {
        (Some(parent), _) => {
            flag("--cgroup-parent", parent.into());
            // podman puts its monitor (conmon) in `<parent>/conmon`, under
            // the lease's limit: a workload at its limit then starves or
            // OOM-kills the one process that records how it ended, and the
            // run ends in 127 with no exit code (seen under load). The
            // monitor stays in the agent's cgroups instead.
            if runtime.flavor == CliFlavor::Podman {
                flag("--cgroups", "no-conmon".into());
            }
        }
        (None, Some(limits)) => {
            flag("--memory", limits.max_bytes.to_string());
            flag("--memory-reservation", limits.high_bytes.to_string());
            // No swap beyond the limit.
            flag("--memory-swap", limits.max_bytes.to_string());
        }
        (None, None) => {}
    }
    match (&runtime.gpu_devices, runtime.flavor) {
        (GpuDevices::StandIn { dir }, _) => {
            for uuid in &assignment.device_uuids {
                flag("--device", dir.join(uuid).display().to_string());
            }
        }
        (GpuDevices::Toolkit, CliFlavor::Docker) => {
            flag(
                "--gpus",
                format!("\"device={}\"", assignment.device_uuids.join(",")),
            );
        }
        (GpuDevices::Toolkit, CliFlavor::Podman) => {
            for uuid in &assignment.device_uuids {
                flag("--device", format!("nvidia.com/gpu={uuid}"));
            }
        }
    }
    if let Some(path) = env_file {
        flag("--env-file", path.display().to_string());
    }
    for (name, value) in lease_env(assignment) {
        flag("-e", format!("{name}={value}"));
    }
    if let Some(lib) = runtime
        .hami_core_lib
        .as_ref()
        .filter(|_| is_share(assignment))
    {
        flag(
            "--volume",
            format!("{}:{HAMI_CORE_IN_CONTAINER}:ro", lib.display()),
        );
        flag("-e", format!("{ENV_LD_PRELOAD}={HAMI_CORE_IN_CONTAINER}"));
    }
    // At the same path inside: `CUDA_MPS_PIPE_DIRECTORY` names it.
    if let Some(pipe) = &assignment.mps_pipe_dir {
        flag("--volume", format!("{0}:{0}", pipe.display()));
    }
    for mount in &workload.mounts {
        // Podman's `U` hands a workspace to the container's own root (a
        // user namespace of its own); a dataset is readable by all as it
        // is, and stays the node's.
        let options = match (mount.writable, runtime.flavor) {
            (false, _) => "ro,nosuid,nodev",
            (true, CliFlavor::Podman) => "rw,nosuid,nodev,U",
            (true, _) => "rw,nosuid,nodev",
        };
        flag(
            "--volume",
            format!("{}:{}:{options}", mount.host.display(), mount.path),
        );
    }
    flag("--label", format!("{LABEL_LEASE}={}", assignment.lease_id));
    if let Some(node_id) = &runtime.node_id {
        flag("--label", format!("{LABEL_NODE}={node_id}"));
    }
    if let (Some(_), Some(tenant)) = (network, assignment.tenant_id) {
        flag("--label", format!("{LABEL_TENANT}={tenant}"));
    }
    // docker and podman read their flags with spf13/pflag, where `--` ends
    // the options: whatever the image string is, it cannot become a flag.
    args.push("--".into());
    args.push(image.to_string());
    args.extend(workload.command.iter().cloned());
    args
}

/// Makes the stand-in device of each GPU of `assignment` under `dir`: a
/// character device like `/dev/null`, which the container may open and
/// write to without effect. A UUID that is not letters, digits and `-` is
/// refused: it becomes a path.
pub fn make_stand_in_devices(dir: &Path, assignment: &Assignment) -> Result<(), RuntimeError> {
    use std::os::unix::ffi::OsStrExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| RuntimeError::InvalidConfig(format!("cannot make {}: {e}", dir.display())))?;
    for uuid in &assignment.device_uuids {
        if uuid.is_empty() || !uuid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(RuntimeError::InvalidAssignment(format!(
                "device {uuid:?}: a stand-in device is named by letters, digits and '-'"
            )));
        }
        let path = dir.join(uuid);
        if path.exists() {
            continue;
        }
        let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| RuntimeError::InvalidAssignment(format!("device {uuid:?}")))?;
        // SAFETY: mknod(2) reads a NUL-terminated path we own; 1:3 is the
        // null device.
        let made =
            unsafe { libc::mknod(c_path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        if made != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(RuntimeError::InvalidConfig(format!(
                    "cannot make the stand-in device {}: {e}",
                    path.display()
                )));
            }
        }
        // The mode given to mknod is masked by the umask.
        let _ = fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666));
    }
    Ok(())
}

/// The arguments of `<cli> stop`: the grace in whole seconds, rounded up.
pub fn stop_args(flavor: CliFlavor, name: &str, grace: Duration) -> Vec<String> {
    let grace_s = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
    let timeout_flag = match flavor {
        CliFlavor::Docker => "--timeout",
        CliFlavor::Podman => "--time",
    };
    vec![
        "stop".into(),
        timeout_flag.into(),
        grace_s.to_string(),
        name.into(),
    ]
}

/// How a container ended after `<cli> stop`, from the `run` exit.
pub fn stop_outcome(exit: Exit) -> StopOutcome {
    if exit.code == Some(EXIT_CODE_KILLED) || exit.signal == Some(libc::SIGKILL) {
        StopOutcome::Killed
    } else {
        StopOutcome::Terminated
    }
}

impl Runtime for ContainerRuntime {
    fn start(
        &self,
        assignment: &Assignment,
        workload: &Workload,
    ) -> Result<RunningWorkload, RuntimeError> {
        validate_assignment(assignment)?;
        validate_env(workload)?;
        // A gang member's ranks meet the others over the gang's link, not
        // at the members' host names, which a container cannot reach.
        let linked;
        let assignment = match &assignment.gang_link {
            Some(link) => {
                let mut with_link = assignment.clone();
                with_link.gang_env.extend(link.env());
                linked = with_link;
                &linked
            }
            None => assignment,
        };
        let Some(image) = workload.image.as_deref().or(self.default_image.as_deref()) else {
            return Err(RuntimeError::InvalidWorkload(
                "no image, and this node runs none by default (LH_DEFAULT_IMAGE)".into(),
            ));
        };
        check_image_reference(image)
            .map_err(|e| RuntimeError::InvalidWorkload(format!("image {image:?}: {e}")))?;
        if let GpuDevices::StandIn { dir } = &self.gpu_devices {
            make_stand_in_devices(dir, assignment)?;
        }
        let lease_id = assignment.lease_id;
        let relay_target = match &workload.store {
            None => None,
            Some(_) if self.flavor != CliFlavor::Podman => {
                return Err(RuntimeError::InvalidConfig(
                    "a container reaches the object store only under podman, which can make \
                     a container without starting it (workload.object_store)"
                        .into(),
                ))
            }
            Some(grant) => {
                Some(super::store_relay::Target::of(grant).map_err(RuntimeError::InvalidConfig)?)
            }
        };
        // Whatever is made for the container before it runs is undone if
        // it cannot be started.
        let mut made = MadeForStart::default();
        let child = self.spawn(
            assignment,
            workload,
            image,
            relay_target.is_some(),
            &mut made,
        );
        let mut child = match child {
            Ok(child) => child,
            Err(e) => {
                made.undo(self);
                return Err(e);
            }
        };
        let start_deadline = tokio::time::Instant::now() + self.start_timeout;
        let relay = match (relay_target, child.stdin.take()) {
            (Some(target), Some(launcher)) => Some(super::store_relay::spawn_open(
                self.engine(),
                container_name_of(assignment),
                start_deadline,
                target,
                launcher,
            )),
            _ => None,
        };
        tracing::info!(lease = %lease_id, pid = ?child.id(), image, "container started");
        RunningWorkload::new(
            lease_id,
            child,
            Kind::Container(Box::new(super::ContainerWorkload {
                engine: self.engine(),
                name: container_name_of(assignment),
                image: image.to_string(),
                stop_margin: self.stop_margin,
                env_file: made.env_file,
                start_deadline,
                running_seen: false,
                memory_cgroups: made.cgroup_parent.and(self.memory_cgroups.clone()),
                network: made
                    .tenant_network
                    .map(|tenant| (self.tenant_networks.clone(), tenant)),
                relay,
                gang_link: assignment.gang_link.clone().map(|link| {
                    super::gang_link::spawn_attach(
                        self.engine(),
                        container_name_of(assignment),
                        link,
                        self.gang_link_lock_file.clone(),
                        start_deadline,
                    )
                }),
                on_running: None,
                ran: false,
            })),
        )
    }
}

/// What [`ContainerRuntime::spawn`] made for a container on the host.
#[derive(Default)]
struct MadeForStart {
    tenant_network: Option<Uuid>,
    /// The container's mark and its parent cgroup, where the agent made one.
    cgroup_parent: Option<(String, String)>,
    env_file: Option<PathBuf>,
}

impl MadeForStart {
    fn undo(self, runtime: &ContainerRuntime) {
        if let Some(path) = &self.env_file {
            remove_env_file(path);
        }
        if let (Some((mark, _)), Some(cgroups)) = (&self.cgroup_parent, &runtime.memory_cgroups) {
            cgroups.remove_unused(mark);
        }
        if let Some(tenant) = self.tenant_network {
            runtime.tenant_networks.leave(tenant);
        }
    }
}

impl ContainerRuntime {
    /// Makes what the container needs on the host (its tenant's network,
    /// its parent cgroup, its env file), noting each in `made`, and spawns
    /// `<cli> run`; or, for a container with a store relay, the launcher
    /// that makes it and starts it on the agent's word, with its standard
    /// input the agent's to write ([`super::store_relay`]).
    fn spawn(
        &self,
        assignment: &Assignment,
        workload: &Workload,
        image: &str,
        relayed: bool,
        made: &mut MadeForStart,
    ) -> Result<tokio::process::Child, RuntimeError> {
        let lease_id = assignment.lease_id;
        let network = match workload.network {
            WorkloadNetwork::None => None,
            WorkloadNetwork::Tenant => {
                let tenant = assignment.tenant_id.ok_or_else(|| {
                    RuntimeError::InvalidAssignment(
                        "a tenant network needs the lease's tenant".into(),
                    )
                })?;
                let name = self.tenant_networks.join(tenant)?;
                made.tenant_network = Some(tenant);
                Some(name)
            }
        };
        if let (Some(cgroups), Some(share)) = (&self.memory_cgroups, assignment.memory_share_bytes)
        {
            let limit = memory_limits(share, self.hard_limit_pct, self.soft_limit_pct);
            let mark = container_name_of(assignment);
            let parent = cgroups.prepare(&mark, limit.max_bytes).map_err(|e| {
                RuntimeError::InvalidConfig(format!(
                    "cannot make the container's parent cgroup {}: {e}",
                    cgroups.memory_dir(&mark).display()
                ))
            })?;
            made.cgroup_parent = Some((mark, parent));
        }
        if let Some(contents) = env_file_contents(assignment, workload) {
            made.env_file = Some(write_env_file(&self.env_dir, lease_id, &contents).map_err(
                |e| {
                    RuntimeError::InvalidConfig(format!(
                        "cannot write the env file in {}: {e}",
                        self.env_dir.display()
                    ))
                },
            )?);
        }
        let args = run_args(
            self,
            assignment,
            workload,
            image,
            made.env_file.as_deref(),
            made.cgroup_parent
                .as_ref()
                .map(|(_, parent)| parent.as_str()),
            network.as_deref(),
        );
        let (stdout, stderr) = super::output_of(assignment)?;
        let engine = self.engine();
        let (mut command, stdin) = if relayed {
            let name = container_name_of(assignment);
            let mut launcher = engine.launcher_command();
            launcher
                .arg("-c")
                .arg(super::store_relay::launcher_script(&engine, &name))
                .arg("sh")
                .args(&args[1..]);
            (launcher, Stdio::piped())
        } else {
            let mut run = engine.command();
            run.args(&args);
            (run, Stdio::null())
        };
        command
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .map_err(|source| RuntimeError::Spawn {
                program: self.cli.display().to_string(),
                source,
            })
    }
}

/// Runs `<cli> stop`, waiting at most the grace plus the margin. A failure
/// is logged; the caller then waits for the `run` process and kills it if
/// it does not end.
/// How long `<cli> kill --signal` may take.
const SIGNAL_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `signal` (`USR1`) to the container's first process.
pub(crate) async fn run_signal_command(engine: &Engine, name: &str, signal: &str) -> bool {
    let output = engine
        .command()
        .args(["kill", "--signal", signal, name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(SIGNAL_COMMAND_TIMEOUT, output).await {
        Ok(Ok(output)) if output.status.success() => true,
        Ok(Ok(output)) => {
            tracing::warn!(container = name, status = %output.status,
                stderr = %String::from_utf8_lossy(&output.stderr).trim(), "container signal failed");
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(container = name, error = %e, "cannot run container kill");
            false
        }
        Err(_) => {
            tracing::warn!(container = name, "container kill timed out");
            false
        }
    }
}

pub(crate) async fn run_stop_command(
    engine: &Engine,
    name: &str,
    grace: Duration,
    margin: Duration,
) {
    let output = engine
        .command()
        .args(stop_args(engine.flavor, name, grace))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(grace + margin, output).await {
        Ok(Ok(output)) if output.status.success() => {}
        Ok(Ok(output)) => tracing::warn!(container = name, status = %output.status,
            stderr = %String::from_utf8_lossy(&output.stderr).trim(), "container stop failed"),
        Ok(Err(e)) => tracing::warn!(container = name, error = %e, "cannot run container stop"),
        Err(_) => tracing::warn!(container = name, "container stop timed out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn assignment() -> Assignment {
        Assignment {
            lease_id: Uuid::from_u128(0xabc),
            device_uuids: vec!["GPU-1".into(), "GPU-2".into()],
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

    fn workload() -> Workload {
        Workload {
            command: vec!["python".into(), "train.py".into()],
            image: Some("pytorch:2".into()),
            env: BTreeMap::from([("TOKEN".to_string(), "secret".to_string())]),
            network: Default::default(),
            mounts: Vec::new(),
            store: None,
        }
    }

    #[test]
    fn docker_run_for_whole_gpus() {
        let id = Uuid::from_u128(0xabc);
        let args = run_args(
            &ContainerRuntime::docker("docker").on_node("node-a"),
            &assignment(),
            &workload(),
            "pytorch:2",
            Some(Path::new("/state/env/lh-x.env")),
            None,
            None,
        );
        let expected = [
            "run".to_string(),
            "--name".into(),
            format!("lh-{id}"),
            "--pull".into(),
            "missing".into(),
            "--read-only".into(),
            "--tmpfs".into(),
            "/scratch:rw,nosuid,nodev,size=1073741824,mode=1777".into(),
            "--cap-drop".into(),
            "ALL".into(),
            "--security-opt".into(),
            "no-new-privileges".into(),
            "--network".into(),
            "none".into(),
            "--log-driver".into(),
            "none".into(),
            "--pids-limit".into(),
            "4096".into(),
            "--ulimit".into(),
            "nofile=16384:16384".into(),
            "--ulimit".into(),
            "nproc=4096:4096".into(),
            "--gpus".into(),
            "\"device=GPU-1,GPU-2\"".into(),
            "--env-file".into(),
            "/state/env/lh-x.env".into(),
            "-e".into(),
            "CUDA_VISIBLE_DEVICES=GPU-1,GPU-2".into(),
            "-e".into(),
            format!("LEASEHOLD_LEASE_ID={id}"),
            "-e".into(),
            "NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2".into(),
            "--label".into(),
            format!("leasehold.lease={id}"),
            "--label".into(),
            "leasehold.node=node-a".into(),
            "--".into(),
            "pytorch:2".into(),
            "python".into(),
            "train.py".into(),
        ];
        assert_eq!(args, expected);
    }

    #[test]
    fn podman_run_for_a_share_with_memory() {
        let a = Assignment {
            device_uuids: vec!["GPU-1".into()],
            vram_limit_mib: Some(10240),
            compute_milli: Some(500),
            memory_share_bytes: Some(1000),
            ..assignment()
        };
        let w = Workload {
            command: vec![],
            ..workload()
        };
        let args = run_args(
            &ContainerRuntime::podman("podman"),
            &a,
            &w,
            "img",
            None,
            None,
            None,
        );
        let joined = args.join(" ");
        assert!(
            joined.contains(" --device nvidia.com/gpu=GPU-1 "),
            "{joined}"
        );
        assert!(!joined.contains("--gpus"), "{joined}");
        assert!(
            joined.contains(" --memory 800 --memory-reservation 800 --memory-swap 800 "),
            "{joined}"
        );
        assert!(
            joined.contains(" --userns auto:size=65536 "),
            "podman: a user namespace of its own: {joined}"
        );
        assert!(
            joined.contains(",size=800,"),
            "scratch within the limit: {joined}"
        );
        assert!(joined.contains(" -e CUDA_DEVICE_MEMORY_LIMIT=10240m "));
        assert!(joined.contains(" -e CUDA_DEVICE_SM_LIMIT=50 "));
        assert_eq!(
            args.last().unwrap(),
            "img",
            "no command: the image's default"
        );
    }

    #[test]
    fn the_env_file_holds_the_tenants_variables_but_no_lease_or_denied_one() {
        let w = Workload {
            env: BTreeMap::from([
                ("NVIDIA_VISIBLE_DEVICES".to_string(), "all".to_string()),
                ("LD_PRELOAD".to_string(), "/evil.so".to_string()),
                ("DOCKER_HOST".to_string(), "tcp://evil:2375".to_string()),
                ("SPLIT".to_string(), "a\nLD_PRELOAD=/evil.so".to_string()),
                ("TOKEN".to_string(), "s=cret value".to_string()),
            ]),
            ..workload()
        };
        assert_eq!(
            env_file_contents(&assignment(), &w).as_deref(),
            Some("TOKEN=s=cret value\n")
        );
        let bare = Workload {
            env: BTreeMap::new(),
            ..workload()
        };
        assert_eq!(env_file_contents(&assignment(), &bare), None);
    }

    #[test]
    fn the_env_file_is_private_to_the_agent() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let env_dir = dir.path().join("env");
        let path = write_env_file(&env_dir, Uuid::from_u128(1), "A=b\n").unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&env_dir), 0o700);
        assert_eq!(fs::read_to_string(&path).unwrap(), "A=b\n");
        remove_env_file(&path);
        assert!(!path.exists());
    }

    #[test]
    fn a_share_that_mps_enforces_gets_the_daemons_pipe_directory() {
        let share = Assignment {
            vram_limit_mib: Some(10240),
            compute_milli: Some(500),
            mps_pipe_dir: Some("/state/mps/gpu0/pipe".into()),
            mps_server_uid: None,
            ..assignment()
        };
        let args = run_args(
            &ContainerRuntime::docker("docker"),
            &share,
            &Workload::default(),
            "img",
            None,
            None,
            None,
        );
        let after =
            |flag: &str, value: &str| args.windows(2).any(|w| w[0] == flag && w[1] == value);
        assert!(
            after("--volume", "/state/mps/gpu0/pipe:/state/mps/gpu0/pipe"),
            "{args:?}"
        );
        assert!(
            after("-e", "CUDA_MPS_PIPE_DIRECTORY=/state/mps/gpu0/pipe"),
            "{args:?}"
        );
        let whole = run_args(
            &ContainerRuntime::docker("docker"),
            &assignment(),
            &Workload::default(),
            "img",
            None,
            None,
            None,
        );
        assert!(!whole.iter().any(|a| a.contains("CUDA_MPS")), "{whole:?}");
    }

    #[test]
    fn a_share_gets_hami_core_mounted_and_preloaded_after_the_tenants_variables() {
        let runtime =
            ContainerRuntime::docker("docker").with_hami_core_lib("/opt/hami/libvgpu.so".into());
        let share = Assignment {
            device_uuids: vec!["GPU-1".into()],
            vram_limit_mib: Some(10240),
            compute_milli: Some(500),
            ..assignment()
        };
        let env_file = Path::new("/state/env/lh-x.env");
        let args = run_args(
            &runtime,
            &share,
            &workload(),
            "img",
            Some(env_file),
            None,
            None,
        );
        let at = |arg: &str| args.iter().position(|a| a == arg).unwrap();
        let volume = at("/opt/hami/libvgpu.so:/usr/local/leasehold/libvgpu.so:ro");
        let preload = at("LD_PRELOAD=/usr/local/leasehold/libvgpu.so");
        assert_eq!(args[volume - 1], "--volume");
        assert!(
            at("--env-file") < preload,
            "the agent's LD_PRELOAD comes last"
        );
        assert!(preload < at("--"));
        // A whole GPU runs without it.
        let whole = run_args(
            &runtime,
            &assignment(),
            &workload(),
            "img",
            None,
            None,
            None,
        );
        assert!(!whole.iter().any(|a| a.contains("libvgpu")), "{whole:?}");
    }

    #[test]
    fn a_held_memory_limit_goes_by_parent_and_the_cpu_share_as_cpus() {
        let a = Assignment {
            memory_share_bytes: Some(1000),
            cpu_milli: Some(1500),
            ..assignment()
        };
        let runtime = ContainerRuntime {
            gpu_devices: GpuDevices::StandIn {
                dir: "/dev/leasehold-sim/node-a".into(),
            },
            ..ContainerRuntime::podman("podman")
        };
        let args = run_args(
            &runtime,
            &a,
            &workload(),
            "img",
            None,
            Some("/leasehold/lh-x"),
            None,
        );
        let joined = args.join(" ");
        assert!(
            joined.contains(" --cgroup-parent /leasehold/lh-x "),
            "{joined}"
        );
        assert!(
            !joined.contains("--memory"),
            "the parent holds it: {joined}"
        );
        assert!(joined.contains(" --cgroups no-conmon "), "{joined}");
        assert!(joined.contains(" --cpus 1.500 "), "{joined}");
        assert!(
            joined.contains(" --device /dev/leasehold-sim/node-a/GPU-1 --device /dev/leasehold-sim/node-a/GPU-2 "),
            "{joined}"
        );
        assert!(!joined.contains("nvidia.com/gpu"), "{joined}");
    }

    #[test]
    fn a_stand_in_device_is_not_made_from_a_path() {
        let dir = tempfile::tempdir().unwrap();
        for uuid in ["../etc", "GPU-1/x", "GPU:1", ""] {
            let a = Assignment {
                device_uuids: vec![uuid.into()],
                ..assignment()
            };
            assert!(
                matches!(
                    make_stand_in_devices(dir.path(), &a),
                    Err(RuntimeError::InvalidAssignment(_))
                ),
                "{uuid:?}"
            );
        }
    }

    #[test]
    fn stop_rounds_the_grace_up_to_seconds() {
        assert_eq!(
            stop_args(CliFlavor::Docker, "lh-x", Duration::from_millis(1500)),
            ["stop", "--timeout", "2", "lh-x"]
        );
        assert_eq!(
            stop_args(CliFlavor::Podman, "lh-x", Duration::from_secs(30)),
            ["stop", "--time", "30", "lh-x"]
        );
        assert_eq!(
            stop_args(CliFlavor::Docker, "lh-x", Duration::ZERO),
            ["stop", "--timeout", "0", "lh-x"]
        );
    }

    #[test]
    fn exit_137_means_killed() {
        let exit = |code, signal| Exit { code, signal };
        assert_eq!(stop_outcome(exit(Some(137), None)), StopOutcome::Killed);
        assert_eq!(stop_outcome(exit(None, Some(9))), StopOutcome::Killed);
        assert_eq!(stop_outcome(exit(Some(143), None)), StopOutcome::Terminated);
        assert_eq!(stop_outcome(exit(Some(0), None)), StopOutcome::Terminated);
    }
}
