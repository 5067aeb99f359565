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
//! The lease's variables ([`super::lease_env`]) go in as `-e NAME=value`;
//! the workload's own variables as `-e NAME`, so that the CLI takes the
//! value from its environment and tenant secrets do not show in the host's
//! process list. With a RAM share, `--memory` and `--memory-reservation` are
//! the hard and soft percentages of it, as for the process runtime's cgroup.
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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use uuid::Uuid;

use super::cgroup::{memory_limits, DEFAULT_HARD_LIMIT_PCT, DEFAULT_SOFT_LIMIT_PCT};
use super::{
    lease_env, mark, validate_assignment, validate_env, Assignment, Exit, Kind, RunningWorkload,
    Runtime, RuntimeError, StopOutcome, Workload, LABEL_LEASE, LABEL_NODE,
};

/// How long past the grace period a stop waits for the CLI before it kills
/// the `run` process.
pub const DEFAULT_STOP_MARGIN: Duration = Duration::from_secs(10);
/// `<cli> run`'s exit code when the container was SIGKILLed (128 + 9).
pub const EXIT_CODE_KILLED: i32 = 137;

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
        }
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

/// The arguments of `<cli> run` for a lease.
pub fn run_args(
    runtime: &ContainerRuntime,
    assignment: &Assignment,
    workload: &Workload,
    image: &str,
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
    let lease = lease_env(assignment);
    for (name, value) in &lease {
        args.push("-e".into());
        args.push(format!("{name}={value}"));
    }
    for name in passed_through(&lease, workload).keys() {
        args.push("-e".into());
        args.push((*name).clone());
    }
    args.push("--label".into());
    args.push(format!("{LABEL_LEASE}={}", assignment.lease_id));
    if let Some(node_id) = &runtime.node_id {
        args.push("--label".into());
        args.push(format!("{LABEL_NODE}={node_id}"));
    }
    args.push(image.to_string());
    args.extend(workload.command.iter().cloned());
    args
}

/// The workload variables passed by name (`-e NAME`), with their values for
/// the CLI's environment: all but those the lease sets.
fn passed_through<'w>(
    lease: &BTreeMap<String, String>,
    workload: &'w Workload,
) -> BTreeMap<&'w String, &'w String> {
    workload
        .env
        .iter()
        .filter(|(name, _)| !lease.contains_key(*name))
        .collect()
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
        let image = match workload.image.as_deref() {
            Some(image) if !image.trim().is_empty() => image,
            _ => return Err(RuntimeError::InvalidWorkload("no image".into())),
        };
        let args = run_args(self, assignment, workload, image);
        let child = Command::new(&self.cli)
            .args(&args)
            .envs(passed_through(&lease_env(assignment), workload))
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|source| RuntimeError::Spawn {
                program: self.cli.display().to_string(),
                source,
            })?;
        tracing::info!(lease = %assignment.lease_id, pid = ?child.id(), image, "container started");
        RunningWorkload::new(
            assignment.lease_id,
            child,
            Kind::Container {
                cli: self.cli.clone(),
                flavor: self.flavor,
                name: container_name(assignment.lease_id),
                stop_margin: self.stop_margin,
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
    let output = Command::new(cli)
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

    fn assignment() -> Assignment {
        Assignment {
            lease_id: Uuid::from_u128(0xabc),
            device_uuids: vec!["GPU-1".into(), "GPU-2".into()],
            vram_limit_mib: None,
            compute_milli: None,
            memory_share_bytes: None,
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
        );
        let expected = [
            "run".to_string(),
            "--rm".into(),
            "--name".into(),
            format!("lh-{id}"),
            "--gpus".into(),
            "\"device=GPU-1,GPU-2\"".into(),
            "-e".into(),
            "CUDA_VISIBLE_DEVICES=GPU-1,GPU-2".into(),
            "-e".into(),
            format!("LEASEHOLD_LEASE_ID={id}"),
            "-e".into(),
            "NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2".into(),
            "-e".into(),
            "TOKEN".into(),
            "--label".into(),
            format!("leasehold.lease={id}"),
            "--label".into(),
            "leasehold.node=node-a".into(),
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
        let args = run_args(&ContainerRuntime::podman("podman"), &a, &w, "img");
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
    fn the_lease_overrides_a_workload_variable_of_the_same_name() {
        let w = Workload {
            env: BTreeMap::from([("NVIDIA_VISIBLE_DEVICES".to_string(), "all".to_string())]),
            ..workload()
        };
        let args = run_args(&ContainerRuntime::docker("docker"), &assignment(), &w, "i");
        assert!(!args.contains(&"NVIDIA_VISIBLE_DEVICES".to_string()));
        assert!(!args.iter().any(|a| a.contains("all")));
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
