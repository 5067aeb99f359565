//! CUDA MPS as what enforces a memory-sliced share (ADR 016): one MPS
//! control daemon per GPU that hosts shares, whose limits are never above
//! the smallest share it has hosted since it started.
//!
//! A limit set through the daemon binds a client when the client creates
//! its CUDA context, which may be long after it started, so a limit that
//! went up for a bigger share would reach a smaller share's late processes;
//! lowering only is what keeps every client within its own lease's share.
//!
//! [`MpsPlan`] decides (pure); [`Mps`] carries its steps out by driving
//! `nvidia-cuda-mps-control` through its stdin command protocol (one
//! command per invocation) and `nvidia-smi` for the GPU's compute mode.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use uuid::Uuid;

use super::{sm_limit_pct, Assignment};
// The driver's tools this module drives; `nvidia-smi` is looked for next
// to the control binary first, then on `PATH`.
pub use crate::gpu::backend::{MPS_CONTROL_BINARY, NVIDIA_SMI_BINARY};

/// Where a client finds its daemon; the agent sets it after the tenant's
/// variables (which may not name `CUDA_MPS_*` anyway).
pub const ENV_MPS_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// Where the daemon and its servers log.
pub const ENV_MPS_LOG_DIRECTORY: &str = "CUDA_MPS_LOG_DIRECTORY";
/// How long one control or `nvidia-smi` command may run before it is
/// killed: they run on the workload side's task, which waits on them.
pub const MAX_MPS_COMMAND_SECS: u64 = 10;
/// How many servers of one daemon get their limits lowered; a daemon per
/// GPU with one Linux user has one server at a time, a few while one
/// drains for another user.
pub const MAX_MPS_SERVERS_PER_GPU: usize = 16;
/// How long the last share's clients get to disconnect before its GPU's
/// daemon is left running instead of quit.
pub const MPS_CLIENTS_GONE_WAIT_MS: u64 = 2_000;
const MPS_CLIENT_POLL_MS: u64 = 100;
/// How many GPU daemon directories a restarted agent looks through: more
/// GPUs than any host has.
pub const MAX_MPS_DAEMON_DIRS: usize = 64;
/// How much of a command's output is read.
const MAX_MPS_OUTPUT_BYTES: u64 = 64 * 1024;
/// The GPU as its own daemon numbers it: the daemon sees only that GPU.
const DEVICE_IN_DAEMON: u32 = 0;

/// What a GPU's daemon lets each client have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpsLimits {
    /// Pinned device memory per client, MiB.
    pub vram_mib: u64,
    /// Active thread percentage per client (of the GPU's SMs), 1..=100.
    pub thread_pct: u32,
}

impl MpsLimits {
    /// A share's own limits; `None` for anything that is not a share.
    pub fn of_share(assignment: &Assignment) -> Option<Self> {
        Some(MpsLimits {
            vram_mib: assignment.vram_limit_mib?,
            thread_pct: sm_limit_pct(assignment.compute_milli?),
        })
    }

    /// Each limit the smaller of the two.
    pub fn min(self, other: MpsLimits) -> MpsLimits {
        MpsLimits {
            vram_mib: self.vram_mib.min(other.vram_mib),
            thread_pct: self.thread_pct.min(other.thread_pct),
        }
    }
}

/// A memory limit as the control daemon takes it: whole GiB as `<n>G`
/// (the form measured on the H200), else `<n>M`.
pub fn mem_limit_arg(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{}G", mib / 1024)
    } else {
        format!("{mib}M")
    }
}

/// A share on a GPU: its lease and the placement it runs for.
pub type ShareKey = (Uuid, u64);

/// What must happen to a GPU's daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpsStep {
    /// Exclusive-process compute mode, start (or adopt) the daemon, set
    /// its limits.
    Start(MpsLimits),
    /// Lower the defaults and every running server's limits.
    Lower { from: MpsLimits, to: MpsLimits },
    /// Quit the daemon, back to the default compute mode.
    Stop,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct GpuShares {
    index: u32,
    limits: MpsLimits,
    shares: BTreeSet<ShareKey>,
}

/// Which shares each GPU hosts and the limits its daemon holds, by GPU
/// UUID. Pure: [`Mps`] asks it what to do, does it, then records it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MpsPlan {
    gpus: BTreeMap<String, GpuShares>,
}

impl MpsPlan {
    /// What must happen on `gpu` before a share wanting `wants` starts
    /// there; `None` when its daemon's limits already hold it.
    pub fn step_to_admit(&self, gpu: &str, wants: MpsLimits) -> Option<MpsStep> {
        match self.gpus.get(gpu) {
            None => Some(MpsStep::Start(wants)),
            Some(g) => {
                let to = g.limits.min(wants);
                (to != g.limits).then_some(MpsStep::Lower { from: g.limits, to })
            }
        }
    }

    /// Records a share whose step was carried out.
    pub fn admitted(&mut self, gpu: &str, index: u32, share: ShareKey, wants: MpsLimits) {
        let g = self.gpus.entry(gpu.to_string()).or_insert(GpuShares {
            index,
            limits: wants,
            shares: BTreeSet::new(),
        });
        g.limits = g.limits.min(wants);
        g.shares.insert(share);
    }

    /// Forgets a share; returns the GPUs (UUID, index) it left without
    /// shares, whose daemon must stop.
    pub fn release(&mut self, share: ShareKey) -> Vec<(String, u32)> {
        let mut emptied = Vec::new();
        self.gpus.retain(|gpu, g| {
            if g.shares.remove(&share) && g.shares.is_empty() {
                emptied.push((gpu.clone(), g.index));
                return false;
            }
            true
        });
        emptied
    }

    /// The limits `gpu`'s daemon holds, while it hosts shares.
    pub fn limits(&self, gpu: &str) -> Option<MpsLimits> {
        self.gpus.get(gpu).map(|g| g.limits)
    }

    /// Whether the GPU with `index` hosts shares.
    pub fn hosts_index(&self, index: u32) -> bool {
        self.gpus.values().any(|g| g.index == index)
    }
}

/// Where the binaries are and where the daemons keep their pipes and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsConfig {
    pub control: PathBuf,
    pub nvidia_smi: PathBuf,
    /// `<state dir>/mps`: a directory per GPU under it.
    pub dir: PathBuf,
}

impl MpsConfig {
    /// The control binary the operator named, else the one on `PATH`;
    /// `nvidia-smi` next to it, else on `PATH`. `None` when there is no
    /// control binary to use.
    pub fn find(control: Option<PathBuf>, state_dir: &Path) -> Option<MpsConfig> {
        let control = control.or_else(|| on_path(MPS_CONTROL_BINARY))?;
        let beside = control
            .parent()
            .map(|d| d.join(NVIDIA_SMI_BINARY))
            .filter(|p| p.is_file());
        let nvidia_smi = beside
            .or_else(|| on_path(NVIDIA_SMI_BINARY))
            .unwrap_or_else(|| NVIDIA_SMI_BINARY.into());
        Some(MpsConfig {
            control,
            nvidia_smi,
            dir: state_dir.join("mps"),
        })
    }
}

fn on_path(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(binary))
        .find(|p| p.is_file())
}

#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("`{command}` failed: {why}")]
    Command { command: String, why: String },
    #[error("cannot prepare {dir}: {source}")]
    Dir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Unusable(String),
}

/// The MPS controller for this node: the control binary the operator
/// named (`--mps-control`), else the one on `PATH`, if its probe works.
/// `None`, with the reason logged, otherwise: the node then declares no
/// MPS enforcement.
pub fn for_node(control: Option<PathBuf>, state_dir: &Path) -> Option<Mps> {
    let named = control.is_some();
    let Some(config) = MpsConfig::find(control, state_dir) else {
        tracing::info!("no {MPS_CONTROL_BINARY} on PATH: shares are not enforced through MPS");
        return None;
    };
    let control = config.control.clone();
    match Mps::probe(config) {
        Ok(mps) => {
            tracing::info!(control = %control.display(), "MPS works here: it enforces shares");
            Some(mps)
        }
        Err(e) if named => {
            tracing::warn!(control = %control.display(), error = %e, "MPS does not work: shares are not enforced through it");
            None
        }
        Err(e) => {
            tracing::info!(control = %control.display(), error = %e, "MPS does not work: shares are not enforced through it");
            None
        }
    }
}

/// The MPS daemons of this node's GPUs.
#[derive(Debug)]
pub struct Mps {
    config: MpsConfig,
    plan: MpsPlan,
    /// Whether workloads run as lease users (the process runtime): each
    /// GPU's server then serves that GPU's share user.
    gpu_share_users: bool,
}

impl Mps {
    /// An MPS controller, if the control binary works here: it starts a
    /// daemon in a probe directory, answers
    /// `get_default_active_thread_percentage` with a number, and quits;
    /// and `nvidia-smi -L` answers.
    pub fn probe(config: MpsConfig) -> Result<Mps, MpsError> {
        let text = config.dir.to_string_lossy();
        if text.contains([':', ',']) {
            return Err(MpsError::Unusable(format!(
                "{text}: a container mounts the pipe directory, so no ':' or ','"
            )));
        }
        let mps = Mps {
            config,
            plan: MpsPlan::default(),
            gpu_share_users: false,
        };
        let probe = Daemon {
            pipe: mps.config.dir.join("probe").join("pipe"),
            log: mps.config.dir.join("probe").join("log"),
            gpu: None,
            server_uid: agent_uid(),
        };
        probe.make_dirs()?;
        // One a crashed agent left behind would answer for us.
        let _ = mps.control(&probe, &["quit"]);
        mps.control(&probe, &["-d"])?;
        let answer = mps.control(&probe, &["get_default_active_thread_percentage"]);
        let quit = mps.control(&probe, &["quit"]);
        let answer = answer?;
        quit?;
        if answer.trim().parse::<f64>().is_err() {
            return Err(MpsError::Unusable(format!(
                "get_default_active_thread_percentage answered {:?}, not a number",
                answer.trim()
            )));
        }
        let smi = mps.config.nvidia_smi.clone();
        run(&smi, &["-L"], None, &[]).map_err(|why| MpsError::Command {
            command: format!("{} -L", smi.display()),
            why,
        })?;
        Ok(mps)
    }

    /// The pipe directory of the daemon of the GPU with `index`.
    pub fn pipe_dir(&self, index: u32) -> PathBuf {
        self.daemon(index, None).pipe
    }

    /// Serves the GPUs' share users ([`super::lease_user::gpu_share_uid`]),
    /// as whom the process runtime runs the shares.
    pub fn serve_gpu_share_users(&mut self) {
        self.gpu_share_users = true;
    }

    /// The user `index`'s server serves.
    pub fn server_uid(&self, index: u32) -> u32 {
        if self.gpu_share_users {
            super::lease_user::gpu_share_uid(index)
        } else {
            agent_uid()
        }
    }

    /// The limits `gpu`'s daemon holds now.
    pub fn limits(&self, gpu: &str) -> Option<MpsLimits> {
        self.plan.limits(gpu)
    }

    /// Makes `gpu`'s daemon hold a share wanting `wants` before its
    /// workload starts; returns the pipe directory the workload connects
    /// through. An error: the share cannot be enforced and must not run.
    pub fn prepare(
        &mut self,
        share: ShareKey,
        index: u32,
        gpu: &str,
        wants: MpsLimits,
    ) -> Result<PathBuf, MpsError> {
        if gpu.is_empty() || gpu.contains(['/', ' ']) {
            return Err(MpsError::Unusable(format!("GPU UUID {gpu:?}")));
        }
        let daemon = self.daemon(index, Some(gpu));
        if let Some(step) = self.plan.step_to_admit(gpu, wants) {
            if let Err(e) = self.carry_out(&daemon, step) {
                if matches!(step, MpsStep::Start(_)) {
                    // Half started: leave the GPU as it was.
                    let _ = self.carry_out(&daemon, MpsStep::Stop);
                }
                return Err(e);
            }
        }
        self.plan.admitted(gpu, index, share, wants);
        Ok(daemon.pipe)
    }

    /// The share ended: a GPU it leaves without shares gets its daemon
    /// quit and its compute mode back.
    pub fn release(&mut self, share: ShareKey) {
        for (gpu, index) in self.plan.release(share) {
            let daemon = self.daemon(index, Some(&gpu));
            match self.carry_out(&daemon, MpsStep::Stop) {
                Ok(()) => tracing::info!(gpu = %gpu, "last share ended; MPS daemon quit"),
                Err(e) => tracing::warn!(gpu = %gpu, error = %e, "cannot stop the MPS daemon"),
            }
        }
    }

    /// After an agent restart: takes over the daemons of the GPUs whose
    /// shares' workloads were adopted (`adopted`: share, GPU index, GPU
    /// UUID, the share's limits), setting their limits as for a start, and
    /// quits the daemons a previous agent left on GPUs with no share now,
    /// unless a client is still connected. Each decision is logged.
    pub fn reconcile(&mut self, adopted: &[(ShareKey, u32, String, MpsLimits)]) {
        for (share, index, gpu, limits) in adopted {
            if let Err(e) = self.prepare(*share, *index, gpu, *limits) {
                tracing::warn!(gpu = %gpu, lease = %share.0, error = %e,
                    "cannot take over the MPS daemon of an adopted share; its limits are not re-set");
            }
        }
        for index in self.daemon_indices() {
            let mut daemon = self.daemon(index, None);
            if self.plan.hosts_index(index) {
                continue;
            }
            daemon.gpu = std::fs::read_to_string(daemon.gpu_file())
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty() && !t.contains(['/', ' ']));
            let Some(gpu) = daemon.gpu.clone() else {
                continue;
            };
            if self.control(&daemon, &["get_server_list"]).is_err() {
                continue;
            }
            match self.carry_out(&daemon, MpsStep::Stop) {
                Ok(()) => {
                    tracing::info!(gpu = %gpu, "MPS daemon a previous agent left with no share quit")
                }
                Err(e) => {
                    tracing::warn!(gpu = %gpu, error = %e, "MPS daemon a previous agent left is kept")
                }
            }
        }
    }

    /// The GPU indices that have a daemon directory, at most
    /// [`MAX_MPS_DAEMON_DIRS`].
    fn daemon_indices(&self) -> Vec<u32> {
        let Ok(entries) = std::fs::read_dir(&self.config.dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("gpu")?.parse().ok())
            .take(MAX_MPS_DAEMON_DIRS)
            .collect()
    }

    fn daemon(&self, index: u32, gpu: Option<&str>) -> Daemon {
        let dir = self.config.dir.join(format!("gpu{index}"));
        Daemon {
            pipe: dir.join("pipe"),
            log: dir.join("log"),
            gpu: gpu.map(str::to_string),
            server_uid: self.server_uid(index),
        }
    }

    fn carry_out(&self, daemon: &Daemon, step: MpsStep) -> Result<(), MpsError> {
        let gpu = daemon.gpu.as_deref().unwrap_or_default();
        match step {
            MpsStep::Start(limits) => {
                daemon.make_dirs()?;
                // A restarted agent that finds this daemon with no share
                // left must give this GPU its compute mode back.
                std::fs::write(daemon.gpu_file(), gpu).map_err(|source| MpsError::Dir {
                    dir: daemon.gpu_file(),
                    source,
                })?;
                self.compute_mode(gpu, "EXCLUSIVE_PROCESS")?;
                if self.control(daemon, &["get_server_list"]).is_ok() {
                    tracing::info!(
                        gpu,
                        "adopting the MPS daemon that answers on its pipe directory"
                    );
                } else {
                    self.control(daemon, &["-d"])?;
                    tracing::info!(gpu, "MPS daemon started");
                }
                if self.set_limits(daemon, limits)? == 0 {
                    // Started now, with the limits just set, so that it
                    // holds the exclusive GPU before any workload runs: a
                    // process that skips MPS would otherwise take the GPU
                    // without limits, and keep MPS off it.
                    let uid = daemon.server_uid.to_string();
                    self.control(daemon, &["start_server", "-uid", &uid])?;
                }
                Ok(())
            }
            MpsStep::Lower { from, to } => {
                tracing::info!(gpu, from_mib = from.vram_mib, to_mib = to.vram_mib,
                    from_pct = from.thread_pct, to_pct = to.thread_pct,
                    "mps limits lowered for a smaller share; the bigger shares' processes that connect later get these");
                self.set_limits(daemon, to).map(drop)
            }
            MpsStep::Stop => {
                // A client still connected is another share's (or one a
                // previous agent left), and a quit would end it: the daemon
                // and the mode stay for it. The clients of the share that
                // just ended may outlive its first process by a moment
                // (its children get the same signal, and exit after it).
                let mut waited_ms = 0;
                while let Some(clients) = self.connected_clients(daemon) {
                    if waited_ms >= MPS_CLIENTS_GONE_WAIT_MS {
                        return Err(MpsError::Unusable(format!(
                            "clients {clients:?} still connected: the daemon is left running"
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(MPS_CLIENT_POLL_MS));
                    waited_ms += MPS_CLIENT_POLL_MS;
                }
                let quit = self.control(daemon, &["quit"]);
                let mode = self.compute_mode(gpu, "DEFAULT");
                quit.and(mode)
            }
        }
    }

    /// The clients of the daemon's servers, if any are connected; `None`
    /// also where the daemon does not answer.
    fn connected_clients(&self, daemon: &Daemon) -> Option<Vec<u32>> {
        let servers = self.control(daemon, &["get_server_list"]).ok()?;
        let clients: Vec<u32> = server_pids(&servers)
            .into_iter()
            .filter_map(|server| {
                self.control(daemon, &["get_client_list", &server.to_string()])
                    .ok()
            })
            .flat_map(|listing| server_pids(&listing))
            .collect();
        (!clients.is_empty()).then_some(clients)
    }

    /// The defaults, for servers to come, and each running server's own,
    /// for its clients to come. Returns how many servers run.
    fn set_limits(&self, daemon: &Daemon, limits: MpsLimits) -> Result<usize, MpsError> {
        let mem = mem_limit_arg(limits.vram_mib);
        let device = DEVICE_IN_DAEMON.to_string();
        let pct = limits.thread_pct.to_string();
        self.control(
            daemon,
            &["set_default_device_pinned_mem_limit", &device, &mem],
        )?;
        self.control(daemon, &["set_default_active_thread_percentage", &pct])?;
        let servers = server_pids(&self.control(daemon, &["get_server_list"])?);
        for server in &servers {
            let server = server.to_string();
            self.control(
                daemon,
                &["set_device_pinned_mem_limit", &server, &device, &mem],
            )?;
            self.control(daemon, &["set_active_thread_percentage", &server, &pct])?;
        }
        Ok(servers.len())
    }

    fn compute_mode(&self, gpu: &str, mode: &str) -> Result<(), MpsError> {
        let smi = &self.config.nvidia_smi;
        let args = ["-i", gpu, "-c", mode];
        run(smi, &args, None, &[])
            .map(drop)
            .map_err(|why| MpsError::Command {
                command: format!("{} {}", smi.display(), args.join(" ")),
                why,
            })
    }

    /// `-d` starts the daemon; anything else is one command on stdin.
    fn control(&self, daemon: &Daemon, command: &[&str]) -> Result<String, MpsError> {
        let control = &self.config.control;
        let (args, stdin): (&[&str], Option<String>) = match command {
            ["-d"] => (&["-d"], None),
            _ => (&[], Some(format!("{}\n", command.join(" ")))),
        };
        run(control, args, stdin.as_deref(), &daemon.env()).map_err(|why| MpsError::Command {
            command: format!("{} {}", control.display(), command.join(" ")),
            why,
        })
    }
}

/// The daemon of one GPU (or the probe's, with no GPU).
struct Daemon {
    pipe: PathBuf,
    log: PathBuf,
    gpu: Option<String>,
    server_uid: u32,
}

impl Daemon {
    /// The UUID of the GPU the daemon was started for.
    fn gpu_file(&self) -> PathBuf {
        self.pipe.with_file_name("gpu-uuid")
    }

    fn env(&self) -> Vec<(&'static str, OsString)> {
        let mut env = vec![
            (ENV_MPS_PIPE_DIRECTORY, self.pipe.clone().into_os_string()),
            (ENV_MPS_LOG_DIRECTORY, self.log.clone().into_os_string()),
        ];
        if let Some(gpu) = &self.gpu {
            env.push((super::ENV_CUDA_VISIBLE_DEVICES, gpu.into()));
        }
        env
    }

    /// Both directories, writable by every user but sticky and not
    /// listable (01733, as /tmp but closed): a server runs as its clients'
    /// user and writes its log and sockets there, and no user may remove
    /// or replace another's (the root daemon's included), nor plant a link
    /// the daemon follows (the kernel's protected_symlinks).
    fn make_dirs(&self) -> Result<(), MpsError> {
        use std::os::unix::fs::PermissionsExt;
        for dir in [&self.pipe, &self.log] {
            let fail = |source| MpsError::Dir {
                dir: dir.clone(),
                source,
            };
            std::fs::create_dir_all(dir).map_err(fail)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1733)).map_err(fail)?;
        }
        Ok(())
    }
}

/// The agent's user: for containers run as root without a user namespace,
/// their workloads'.
fn agent_uid() -> u32 {
    // SAFETY: geteuid(2) cannot fail and has no preconditions.
    unsafe { libc::geteuid() }
}

/// The server pids `get_server_list` printed, one a line; at most
/// [`MAX_MPS_SERVERS_PER_GPU`].
pub fn server_pids(listing: &str) -> Vec<u32> {
    listing
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .take(MAX_MPS_SERVERS_PER_GPU)
        .collect()
}

/// Runs `program` with a clean environment (`PATH` and `env`), `stdin`
/// written to it, for at most [`MAX_MPS_COMMAND_SECS`]; its stdout when it
/// exits 0. `-d` forks a daemon that keeps no pipe of ours open.
fn run(
    program: &Path,
    args: &[&str],
    stdin: Option<&str>,
    env: &[(&str, OsString)],
) -> Result<String, String> {
    // A daemon keeps what it inherits open: reading its stdout would wait
    // for as long as it runs.
    let detaches = args.contains(&"-d");
    let output = || {
        if detaches {
            Stdio::null()
        } else {
            Stdio::piped()
        }
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| super::process::DEFAULT_PATH.into()),
        )
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(output())
        .stderr(output());
    let mut child = command.spawn().map_err(|e| e.to_string())?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A command that exits without reading is judged by its status.
        let _ = pipe.write_all(input.as_bytes());
    }
    let pid = child.id();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = String::new();
        let mut err = String::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.take(MAX_MPS_OUTPUT_BYTES).read_to_string(&mut out);
        }
        if let Some(s) = stderr.as_mut() {
            let _ = s.take(MAX_MPS_OUTPUT_BYTES).read_to_string(&mut err);
        }
        let _ = tx.send((child.wait(), out, err));
    });
    match rx.recv_timeout(Duration::from_secs(MAX_MPS_COMMAND_SECS)) {
        Ok((Ok(status), out, _)) if status.success() => Ok(out),
        Ok((Ok(status), out, err)) => {
            let said = if err.trim().is_empty() { out } else { err };
            Err(format!("{status}: {}", said.trim()))
        }
        Ok((Err(e), _, _)) => Err(e.to_string()),
        Err(_) => {
            if let Ok(pid) = i32::try_from(pid) {
                // SAFETY: kill(2) has no memory-safety preconditions; the
                // child is not reaped until the reader thread's wait.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            Err(format!("no answer within {MAX_MPS_COMMAND_SECS} s"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ShareKey = (Uuid::from_u128(1), 1);
    const B: ShareKey = (Uuid::from_u128(2), 1);
    const C: ShareKey = (Uuid::from_u128(3), 1);

    fn limits(gb: u64, pct: u32) -> MpsLimits {
        MpsLimits {
            vram_mib: gb * 1024,
            thread_pct: pct,
        }
    }

    #[test]
    fn given_shares_of_one_gpu_when_admitted_then_its_limits_only_go_down_until_it_empties() {
        let mut plan = MpsPlan::default();
        assert_eq!(
            plan.step_to_admit("GPU-a", limits(10, 30)),
            Some(MpsStep::Start(limits(10, 30)))
        );
        plan.admitted("GPU-a", 0, A, limits(10, 30));
        // Smaller memory, more compute: each limit on its own.
        assert_eq!(
            plan.step_to_admit("GPU-a", limits(4, 50)),
            Some(MpsStep::Lower {
                from: limits(10, 30),
                to: limits(4, 30)
            })
        );
        plan.admitted("GPU-a", 0, B, limits(4, 50));
        assert_eq!(plan.limits("GPU-a"), Some(limits(4, 30)));
        // Bigger: nothing to do, and it is not raised.
        assert_eq!(plan.step_to_admit("GPU-a", limits(20, 50)), None);
        plan.admitted("GPU-a", 0, C, limits(20, 50));
        assert_eq!(plan.limits("GPU-a"), Some(limits(4, 30)));
        // Another GPU has its own daemon.
        assert_eq!(
            plan.step_to_admit("GPU-b", limits(20, 50)),
            Some(MpsStep::Start(limits(20, 50)))
        );
        assert!(plan.release(A).is_empty());
        assert!(plan.release(B).is_empty());
        assert_eq!(plan.limits("GPU-a"), Some(limits(4, 30)), "not raised");
        assert_eq!(plan.release(C), [("GPU-a".to_string(), 0)]);
        assert_eq!(plan.limits("GPU-a"), None);
        assert!(plan.release(C).is_empty(), "released once");
    }

    #[test]
    fn a_placement_is_its_own_share() {
        let mut plan = MpsPlan::default();
        let moved = (A.0, 2);
        plan.admitted("GPU-a", 0, A, limits(10, 30));
        plan.admitted("GPU-a", 0, moved, limits(10, 30));
        assert!(plan.release(A).is_empty(), "the new placement still runs");
        assert_eq!(plan.release(moved).len(), 1);
    }

    #[test]
    fn memory_limits_read_as_the_daemon_takes_them() {
        assert_eq!(mem_limit_arg(10 * 1024), "10G");
        assert_eq!(mem_limit_arg(1536), "1536M");
        assert_eq!(server_pids("4242\n 77 \nnot a pid\n"), [4242, 77]);
        let many: String = (1..100).map(|p| format!("{p}\n")).collect();
        assert_eq!(server_pids(&many).len(), MAX_MPS_SERVERS_PER_GPU);
    }
}
