//! The container runtime: the lease's image run by the docker or podman CLI
//! with the NVIDIA flags.
//!
//! `<cli> run --rm --name lh-<lease_id>` stays in the foreground; its exit
//! code is the workload's (docker and podman pass the container's through;
//! 125 to 127 are the CLI's own errors). The GPUs are given by UUID:
//!
//! * docker (NVIDIA container toolkit): `--gpus "device=GPU-a,GPU-b"`, with
//!   the double quotes in the argument, because docker splits the value of
//!   `--gpus` on commas as CSV;
//! * podman (CDI): one `--device nvidia.com/gpu=<uuid>` per device; the CDI
//!   spec (`nvidia-ctk cdi generate`) must name devices by UUID.
//!
//! The lease's variables ([`super::lease_env`]) go in as `-e NAME=value`,
//! after the tenant's: those are written to a 0600 `--env-file` in the
//! agent's state directory, removed when the workload ends, so that they
//! neither show in the host's process list nor reach the CLI's own
//! environment (a tenant's `DOCKER_HOST` or `HTTPS_PROXY` would reconfigure
//! the CLI itself). The CLI runs with a cleared environment plus the few
//! variables of the agent's that it needs ([`CLI_ENV_ALLOWED`]). The image
//! must be an OCI image reference and comes after `--`, so that no image
//! string can be read as a flag. With a RAM share, `--memory` and
//! `--memory-reservation` are the hard and soft percentages of it, as for
//! the process runtime's cgroup.
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
//!
//! No container engine runs where this was written: it is tested against a
//! fake CLI that records its arguments (`tests/runtime.rs`).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use lh_domain::workload::check_image_reference;
use tokio::process::Command;
use uuid::Uuid;

use super::cgroup::{memory_limits, DEFAULT_HARD_LIMIT_PCT, DEFAULT_SOFT_LIMIT_PCT};
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
/// The agent's own variables the container CLI keeps: where it finds its
/// programs, its configuration and its daemon, as the operator set them.
/// Everything else of the agent's (its bus credentials, for one) stays out.
pub const CLI_ENV_ALLOWED: [&str; 14] = [
    "PATH",
    "HOME",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_CONTEXT",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "CONTAINER_HOST",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
];

/// Which CLI, for the flags that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CliFlavor {
    /// docker with the NVIDIA container toolkit (`--gpus`).
    Docker,
    /// podman with NVIDIA's CDI spec (`--device nvidia.com/gpu=…`).
    Podman,
}

/// Runs workloads as containers through a docker or podman CLI.
#[derive(Debug, Clone)]
pub struct ContainerRuntime {
    /// The CLI binary (`docker`, `/usr/bin/podman`, …).
    pub cli: PathBuf,
    pub flavor: CliFlavor,
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
            cli,
            flavor,
            hard_limit_pct: DEFAULT_HARD_LIMIT_PCT,
            soft_limit_pct: DEFAULT_SOFT_LIMIT_PCT,
            stop_margin: DEFAULT_STOP_MARGIN,
            node_id: None,
            env_dir: std::env::temp_dir().join("leasehold-env"),
            hami_core_lib: None,
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

    /// Labels every container with `node_id`.
    pub fn on_node(mut self, node_id: impl Into<String>) -> Self {
        self.node_id = Some(node_id.into());
        self
    }
}

/// `lh-<lease_id>`.
pub fn container_name(lease_id: Uuid) -> String {
    mark(lease_id)
}

/// The container CLI with a cleared environment but for
/// [`CLI_ENV_ALLOWED`] from the agent's.
pub(crate) fn cli_command(cli: &Path) -> Command {
    let mut command = Command::new(cli);
    command.env_clear();
    for name in CLI_ENV_ALLOWED {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command
}

/// The env file of the tenant's variables: one `NAME=value` a line, the
/// lease's own names left out (they win; [`run_args`] sets them after).
/// `None` when there is nothing to pass.
pub fn env_file_contents(assignment: &Assignment, workload: &Workload) -> Option<String> {
    let lease = lease_env(assignment);
    let lines: String = tenant_env(assignment.lease_id, workload)
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
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
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
/// in `env_file` when there are any.
pub fn run_args(
    runtime: &ContainerRuntime,
    assignment: &Assignment,
    workload: &Workload,
    image: &str,
    env_file: Option<&Path>,
) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--rm", "--name"].map(String::from).into();
    args.push(container_name(assignment.lease_id));
    match runtime.flavor {
        CliFlavor::Docker => {
            args.push("--gpus".into());
            args.push(format!("\"device={}\"", assignment.device_uuids.join(",")));
        }
        CliFlavor::Podman => {
            for uuid in &assignment.device_uuids {
                args.push("--device".into());
                args.push(format!("nvidia.com/gpu={uuid}"));
            }
        }
    }
    if let Some(share_bytes) = assignment.memory_share_bytes {
        let limits = memory_limits(share_bytes, runtime.hard_limit_pct, runtime.soft_limit_pct);
        args.push("--memory".into());
        args.push(limits.max_bytes.to_string());
        args.push("--memory-reservation".into());
        args.push(limits.high_bytes.to_string());
    }
    if let Some(path) = env_file {
        args.push("--env-file".into());
        args.push(path.display().to_string());
    }
    for (name, value) in lease_env(assignment) {
        args.push("-e".into());
        args.push(format!("{name}={value}"));
    }
    if let Some(lib) = runtime
        .hami_core_lib
        .as_ref()
        .filter(|_| is_share(assignment))
    {
        args.push("--volume".into());
        args.push(format!("{}:{HAMI_CORE_IN_CONTAINER}:ro", lib.display()));
        args.push("-e".into());
        args.push(format!("{ENV_LD_PRELOAD}={HAMI_CORE_IN_CONTAINER}"));
    }
    // At the same path inside: `CUDA_MPS_PIPE_DIRECTORY` names it.
    if let Some(pipe) = &assignment.mps_pipe_dir {
        args.push("--volume".into());
        args.push(format!("{0}:{0}", pipe.display()));
    }
    args.push("--label".into());
    args.push(format!("{LABEL_LEASE}={}", assignment.lease_id));
    if let Some(node_id) = &runtime.node_id {
        args.push("--label".into());
        args.push(format!("{LABEL_NODE}={node_id}"));
    }
    // docker and podman read their flags with spf13/pflag, where `--` ends
    // the options: whatever the image string is, it cannot become a flag.
    args.push("--".into());
    args.push(image.to_string());
    args.extend(workload.command.iter().cloned());
    args
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
        let Some(image) = workload.image.as_deref() else {
            return Err(RuntimeError::InvalidWorkload("no image".into()));
        };
        check_image_reference(image)
            .map_err(|e| RuntimeError::InvalidWorkload(format!("image {image:?}: {e}")))?;
        let env_file = match env_file_contents(assignment, workload) {
            Some(contents) => Some(
                write_env_file(&self.env_dir, assignment.lease_id, &contents).map_err(|e| {
                    RuntimeError::InvalidConfig(format!(
                        "cannot write the env file in {}: {e}",
                        self.env_dir.display()
                    ))
                })?,
            ),
            None => None,
        };
        let args = run_args(self, assignment, workload, image, env_file.as_deref());
        let spawned = super::output_of(assignment).and_then(|(stdout, stderr)| {
            cli_command(&self.cli)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .process_group(0)
                .spawn()
                .map_err(|source| RuntimeError::Spawn {
                    program: self.cli.display().to_string(),
                    source,
                })
        });
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                if let Some(path) = &env_file {
                    remove_env_file(path);
                }
                return Err(e);
            }
        };
        tracing::info!(lease = %assignment.lease_id, pid = ?child.id(), image, "container started");
        RunningWorkload::new(
            assignment.lease_id,
            child,
            Kind::Container {
                cli: self.cli.clone(),
                flavor: self.flavor,
                name: container_name(assignment.lease_id),
                stop_margin: self.stop_margin,
                env_file,
            },
        )
    }
}

/// Runs `<cli> stop`, waiting at most the grace plus the margin. A failure
/// is logged; the caller then waits for the `run` process and kills it if
/// it does not end.
pub(crate) async fn run_stop_command(
    cli: &Path,
    flavor: CliFlavor,
    name: &str,
    grace: Duration,
    margin: Duration,
) {
    let output = cli_command(cli)
        .args(stop_args(flavor, name, grace))
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
            mps_pipe_dir: None,
            mps_server_uid: None,
            log_file: None,
        }
    }

    fn workload() -> Workload {
        Workload {
            command: vec!["python".into(), "train.py".into()],
            image: Some("pytorch:2".into()),
            env: BTreeMap::from([("TOKEN".to_string(), "secret".to_string())]),
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
        );
        let expected = [
            "run".to_string(),
            "--rm".into(),
            "--name".into(),
            format!("lh-{id}"),
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
        let args = run_args(&ContainerRuntime::podman("podman"), &a, &w, "img", None);
        let joined = args.join(" ");
        assert!(
            joined.contains(" --device nvidia.com/gpu=GPU-1 "),
            "{joined}"
        );
        assert!(!joined.contains("--gpus"), "{joined}");
        assert!(
            joined.contains(" --memory 800 --memory-reservation 800 "),
            "{joined}"
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
        let args = run_args(&runtime, &share, &workload(), "img", Some(env_file));
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
        let whole = run_args(&runtime, &assignment(), &workload(), "img", None);
        assert!(!whole.iter().any(|a| a.contains("libvgpu")), "{whole:?}");
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
