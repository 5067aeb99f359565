//! The process runtime: the lease's command as a child of the agent.
//!
//! The child leads its own process group (so a stop reaches everything it
//! started), gets a clean environment (`PATH`, the workload's variables and
//! the lease's, [`super::workload_env`]; never the agent's own, which holds
//! its credentials), stdin from /dev/null, and its stdout and stderr in its
//! log file ([`super::lease_log`]).
//! With usable cgroups it runs in a lease cgroup ([`super::cgroup`]), with
//! memory limits when it has a RAM share; when the cgroup cannot be made or
//! entered it runs without one, with a warning.
//!
//! Each lease runs as its own unprivileged user ([`super::lease_user`]), in
//! its own home, never as the agent: the agent's seed, state and other
//! leases' logs are out of its reach. It still sees the host's readable
//! files and devices, and a workload can unset `CUDA_VISIBLE_DEVICES`: such
//! a node declares `cgroup` or `none` isolation and takes only trusted
//! tenants' leases; the container runtime is the boundary for untrusted
//! tenants.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::{Child, Command};

use super::cgroup::{self, CgroupConfig, LeaseCgroup};
use super::lease_user::{LeaseUser, LeaseUsers};
use super::{
    is_share, output_of, validate_assignment, validate_env, workload_env, Assignment, Kind,
    RunningWorkload, Runtime, RuntimeError, Workload, ENV_LD_PRELOAD,
};

/// `PATH` for a workload when the agent has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs workloads as child processes.
#[derive(Debug, Clone)]
pub struct ProcessRuntime {
    /// `None` when the host has no usable cgroup v2 memory controller.
    cgroups: Option<CgroupConfig>,
    /// HAMi-core, preloaded into the workloads of shares.
    hami_core_lib: Option<PathBuf>,
    users: LeaseUsers,
}

impl ProcessRuntime {
    /// A runtime that puts leases with a RAM share into cgroups under
    /// `config.root` if the host allows it (probed once here; when it does
    /// not, one info line says why and workloads run without cgroups).
    /// Leases run as `users`.
    pub fn new(config: CgroupConfig, users: LeaseUsers) -> Result<Self, RuntimeError> {
        config.validate()?;
        match cgroup::probe(&config.root) {
            Ok(()) => Ok(ProcessRuntime {
                cgroups: Some(config),
                hami_core_lib: None,
                users,
            }),
            Err(why) => {
                tracing::info!(reason = %why, "cgroup v2 memory limits unavailable; workloads run without them");
                Ok(ProcessRuntime::without_cgroups(users))
            }
        }
    }

    pub fn without_cgroups(users: LeaseUsers) -> Self {
        ProcessRuntime {
            cgroups: None,
            hami_core_lib: None,
            users,
        }
    }

    /// The users leases run as.
    pub fn users(&self) -> &LeaseUsers {
        &self.users
    }

    /// Preloads HAMi-core (`lib`, checked by [`super::check_hami_core_lib`])
    /// into every share's workload, so that its caps are enforced.
    pub fn with_hami_core_lib(mut self, lib: PathBuf) -> Self {
        self.hami_core_lib = Some(lib);
        self
    }

    /// The parent of the lease cgroups, when leases get them.
    pub fn cgroup_parent(&self) -> Option<PathBuf> {
        self.cgroups.as_ref().map(CgroupConfig::parent_dir)
    }

    /// Whether leases get a cgroup.
    pub fn uses_cgroups(&self) -> bool {
        self.cgroups.is_some()
    }

    fn lease_cgroup(&self, assignment: &Assignment) -> Option<LeaseCgroup> {
        let config = self.cgroups.as_ref()?;
        let limits = assignment.memory_share_bytes.map(|b| config.limits(b));
        match LeaseCgroup::create(config, assignment.lease_id, limits) {
            Ok(cgroup) => Some(cgroup),
            Err(e) => {
                tracing::warn!(lease = %assignment.lease_id, error = %e,
                    "cannot create the lease cgroup; running without memory limits");
                None
            }
        }
    }
}

impl Runtime for ProcessRuntime {
    fn start(
        &self,
        assignment: &Assignment,
        workload: &Workload,
    ) -> Result<RunningWorkload, RuntimeError> {
        validate_assignment(assignment)?;
        validate_env(workload)?;
        if workload.command.is_empty() {
            return Err(RuntimeError::InvalidWorkload("no command".into()));
        }
        if let Some(image) = &workload.image {
            return Err(RuntimeError::InvalidWorkload(format!(
                "the process runtime cannot run image {image}"
            )));
        }
        let user = match assignment.mps_server_uid {
            Some(uid) if LeaseUsers::is_gpu_share_uid(uid) => {
                self.users.share(assignment.lease_id, uid)?
            }
            _ => self.users.take(assignment.lease_id)?,
        };
        let mut cgroup = self.lease_cgroup(assignment);
        let preload = self
            .hami_core_lib
            .as_deref()
            .filter(|_| is_share(assignment));
        let env = process_env(assignment, workload, &user, preload);
        let child = match spawn(assignment, workload, &env, cgroup.as_ref(), &user) {
            Ok(child) => child,
            Err(e) => match cgroup.take() {
                // The hook may be what failed: try once more without it.
                Some(unused) => {
                    tracing::warn!(lease = %assignment.lease_id, error = %e,
                        cgroup = %unused.dir().display(),
                        "cannot start in the lease cgroup; running without memory limits");
                    if let Err(e) = unused.try_remove() {
                        tracing::warn!(error = %e, "cannot remove the unused cgroup");
                    }
                    spawn(assignment, workload, &env, None, &user)?
                }
                None => return Err(e),
            },
        };
        tracing::info!(lease = %assignment.lease_id, pid = ?child.id(), uid = user.uid(),
            cgroup = cgroup.is_some(), "workload started");
        RunningWorkload::new(
            assignment.lease_id,
            child,
            Kind::Process {
                cgroup,
                user: Some(user),
                env,
            },
        )
    }
}

/// Everything a lease's processes see of the environment: `PATH`, its
/// home, the workload's and the lease's variables, HAMi-core for a share.
/// A session's command gets the same.
fn process_env(
    assignment: &Assignment,
    workload: &Workload,
    user: &LeaseUser,
    preload: Option<&Path>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert(
        "PATH".to_string(),
        std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.into()),
    );
    env.insert("HOME".to_string(), user.home().display().to_string());
    env.extend(workload_env(assignment, workload));
    if let Some(lib) = preload {
        env.insert(ENV_LD_PRELOAD.to_string(), lib.display().to_string());
    }
    env
}

fn spawn(
    assignment: &Assignment,
    workload: &Workload,
    env: &BTreeMap<String, String>,
    cgroup: Option<&LeaseCgroup>,
    user: &LeaseUser,
) -> Result<Child, RuntimeError> {
    let program = &workload.command[0];
    let (stdout, stderr) = output_of(assignment)?;
    let mut command = Command::new(program);
    command
        .args(&workload.command[1..])
        .env_clear()
        .envs(env)
        .current_dir(user.home())
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0);
    if let Some(cgroup) = cgroup {
        // SAFETY: the hook only makes async-signal-safe calls and does not
        // allocate (see `cgroup::write_own_pid`).
        unsafe {
            command.pre_exec(cgroup.enter_hook());
        }
    }
    // SAFETY: as above: plain system calls on values, no allocation. It
    // comes last: entering the cgroup needs root.
    unsafe {
        command.pre_exec(user.become_hook());
    }
    command.spawn().map_err(|source| RuntimeError::Spawn {
        program: program.clone(),
        source,
    })
}
