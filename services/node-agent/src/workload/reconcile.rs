//! What a restarted agent finds on its host, and what it does about it.
//!
//! An agent that dies (kill -9, a crash, an upgrade) leaves its workloads
//! running: each leads a process group of its own, or is a container the
//! engine keeps. So every workload carries a mark that outlives the agent:
//!
//! * a process: a record `lh-<lease>-<placement>.json` in the agent's state
//!   directory with its pid and its start time (field 22 of
//!   `/proc/<pid>/stat`, so that a pid reused by an unrelated process is
//!   never taken for the workload), besides `LEASEHOLD_LEASE_ID` in its
//!   environment;
//! * a container: the name `lh-<lease>` and the labels
//!   [`LABEL_LEASE`] and [`LABEL_NODE`];
//! * a cgroup: `lh-<lease>` under the agent's parent cgroup.
//!
//! At start, once the fold has caught up with the log, the agent lists
//! these ([`Found`]) and [`decide`]s: a workload of a lease still placed here
//! (for the same placement) is adopted, supervised again, its exit reported
//! as any other; every other one (the lease ended, moved to another node
//! while the agent was down, or unknown) is stopped and removed. Each list
//! read is bounded by [`MOST_HOST_WORKLOADS`].

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::container::run_stop_command;
use super::engine::Engine;
use super::Exit;
pub use super::{lease_of_mark, mark, LABEL_LEASE, LABEL_NODE, MARK_PREFIX};

/// Most workloads of each kind (records, containers, cgroups) read from the
/// host at start; past it the rest are left alone, with a warning.
pub const MOST_HOST_WORKLOADS: usize = 1024;
/// Most bytes of a process record read (a record is well under 1 KiB).
const MOST_RECORD_BYTES: u64 = 4096;
/// Most directory entries looked at in the state directory or the parent
/// cgroup (the marked ones among them are bounded by the above).
const MOST_DIR_ENTRIES: usize = 16 * MOST_HOST_WORKLOADS;
/// Most bytes of the container list read: [`MOST_HOST_WORKLOADS`] names of
/// 39 bytes and a newline, with room to spare.
const MOST_CONTAINER_LIST_BYTES: u64 = 64 * 1024;
/// How long a container CLI call of the reconciliation may take.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(30);
/// How often an adopted process (no longer the agent's child, so it cannot
/// be waited for) is looked at.
const ADOPTED_POLL_INTERVAL: Duration = Duration::from_millis(200);
/// Removing a cgroup waits for its last processes to be gone: this many
/// tries, [`CGROUP_REMOVE_RETRY`] apart.
const CGROUP_REMOVE_ATTEMPTS: u32 = 50;
const CGROUP_REMOVE_RETRY: Duration = Duration::from_millis(20);
/// After SIGKILL, how long a stop waits to see the process gone.
const KILLED_WAIT: Duration = Duration::from_secs(5);

/// A process workload as the agent that started it recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    pub node_id: String,
    pub lease_id: Uuid,
    pub placement: u64,
    /// Leader of its own process group: pid and pgid are the same.
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat`, clock ticks since boot.
    pub start_ticks: u64,
}

impl ProcessRecord {
    pub fn file_name(&self) -> String {
        format!("{}-{}.json", mark(self.lease_id), self.placement)
    }

    /// Writes the record into `dir` (made if missing), whole or not at all.
    pub fn write(&self, dir: &Path) -> io::Result<PathBuf> {
        // The agent's alone: the state directory is open to lease users'
        // traversal, so that they reach their homes.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let path = dir.join(self.file_name());
        let partial = dir.join(format!(".{}.partial", self.file_name()));
        let json = serde_json::to_vec(self).map_err(io::Error::other)?;
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut file = fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&partial)?;
            file.write_all(&json)?;
        }
        fs::rename(&partial, &path)?;
        Ok(path)
    }
}

/// The start time of a live process, from `/proc/<pid>/stat`; `None` when
/// there is no such process or it is a zombie (dead, not yet reaped).
pub fn process_start_ticks(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

/// Field 22 (starttime) of a `/proc/<pid>/stat` line, unless field 3 says
/// the process is dead. The command name (field 2) is in parentheses and
/// may itself hold spaces and parentheses: fields are counted after the
/// last `)`.
fn parse_stat(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    let state = fields.next()?;
    if matches!(state, "Z" | "X" | "x") {
        return None;
    }
    // Field 3 was the state; starttime is field 22, 19 further on.
    fields.nth(18)?.parse().ok()
}

/// Whether the recorded process still runs: the same pid, started at the
/// same tick.
pub fn is_alive(pid: i32, start_ticks: u64) -> bool {
    process_start_ticks(pid) == Some(start_ticks)
}

/// A workload found on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A process record; `alive`: its pid runs with the recorded start time.
    Process {
        record: ProcessRecord,
        path: PathBuf,
        alive: bool,
    },
    Container {
        lease_id: Uuid,
        name: String,
    },
    Cgroup {
        lease_id: Uuid,
        dir: PathBuf,
    },
}

impl Found {
    pub fn lease_id(&self) -> Uuid {
        match self {
            Found::Process { record, .. } => record.lease_id,
            Found::Container { lease_id, .. } | Found::Cgroup { lease_id, .. } => *lease_id,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Found::Process { .. } => "process",
            Found::Container { .. } => "container",
            Found::Cgroup { .. } => "cgroup",
        }
    }
}

/// What becomes of a found workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Its lease is still placed here: supervised again, for this placement.
    Adopt { placement: u64 },
    /// Stopped and removed.
    Reap { why: &'static str },
    /// Nothing runs (the recorded process is gone, or its pid now belongs to
    /// another process, which is left alone): only the record goes.
    Forget,
}

/// Decides about each found workload, given the leases placed here that
/// should have one (with their placement). Pure.
///
/// A lease is adopted once: a second process or container of it is reaped.
/// A cgroup stays with its lease's adopted process, and is removed
/// otherwise (a lease that runs again gets a fresh one).
pub fn decide(found: &[Found], placed_here: &HashMap<Uuid, u64>) -> Vec<Decision> {
    let mut adopted = BTreeSet::new();
    let mut decisions: Vec<Decision> = found
        .iter()
        .map(|f| {
            let lease_id = f.lease_id();
            let placement = placed_here.get(&lease_id).copied();
            match (f, placement) {
                // Decided below, once it is known whose process is adopted.
                (Found::Cgroup { .. }, _) => Decision::Forget,
                (Found::Process { alive: false, .. }, _) => Decision::Forget,
                (_, None) => Decision::Reap {
                    why: "its lease is not placed on this node",
                },
                (Found::Process { record, .. }, Some(p)) if record.placement != p => {
                    Decision::Reap {
                        why: "it runs for an earlier placement of its lease",
                    }
                }
                (_, Some(_)) if adopted.contains(&lease_id) => Decision::Reap {
                    why: "another workload of its lease was adopted",
                },
                (_, Some(placement)) => {
                    adopted.insert(lease_id);
                    Decision::Adopt { placement }
                }
            }
        })
        .collect();
    for (f, decision) in found.iter().zip(decisions.iter_mut()) {
        if let Found::Cgroup { lease_id, .. } = f {
            *decision = match placed_here.get(lease_id) {
                Some(&placement) if adopted.contains(lease_id) => Decision::Adopt { placement },
                _ => Decision::Reap {
                    why: "no workload of its lease is adopted",
                },
            };
        }
    }
    decisions
}

/// The process records of `node_id` in `dir`, at most `most`, with whether
/// each process still runs. A missing directory holds none; a record that
/// does not parse is reported and skipped; another node's is left alone.
pub fn list_process_records(dir: &Path, node_id: &str, most: usize) -> Vec<Found> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list workload records");
            return Vec::new();
        }
    };
    let mut found = Vec::new();
    for entry in entries.take(MOST_DIR_ENTRIES).flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with(MARK_PREFIX) || !name.ends_with(".json") {
            continue;
        }
        if found.len() == most {
            tracing::warn!(dir = %dir.display(), most, "too many workload records; the rest are left");
            break;
        }
        match read_record(&path) {
            Ok(record) if record.node_id == node_id => {
                let alive = is_alive(record.pid, record.start_ticks);
                found.push(Found::Process {
                    record,
                    path,
                    alive,
                })
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(record = %path.display(), error = %e, "unreadable workload record")
            }
        }
    }
    found
}

fn read_record(path: &Path) -> io::Result<ProcessRecord> {
    use std::io::Read;
    let mut bytes = Vec::new();
    fs::File::open(path)?
        .take(MOST_RECORD_BYTES)
        .read_to_end(&mut bytes)?;
    serde_json::from_slice(&bytes).map_err(io::Error::other)
}

/// The lease cgroups (`lh-<lease>`) under `parent`, at most `most`.
pub fn list_cgroups(parent: &Path, most: usize) -> Vec<Found> {
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.take(MOST_DIR_ENTRIES).flatten() {
        let Some(lease_id) = lease_of_mark(&entry.file_name().to_string_lossy()) else {
            continue;
        };
        if !entry.path().is_dir() {
            continue;
        }
        if found.len() == most {
            tracing::warn!(parent = %parent.display(), most, "too many lease cgroups; the rest are left");
            break;
        }
        found.push(Found::Cgroup {
            lease_id,
            dir: entry.path(),
        });
    }
    found
}

/// The arguments of `<cli> ps` that list this node's lease containers,
/// running or not, one name a line. docker and podman take the same.
pub fn container_list_args(node_id: &str) -> Vec<String> {
    vec![
        "ps".into(),
        "--all".into(),
        "--filter".into(),
        format!("label={LABEL_NODE}={node_id}"),
        "--filter".into(),
        format!("label={LABEL_LEASE}"),
        "--format".into(),
        "{{.Names}}".into(),
    ]
}

/// The lease containers in the output of [`container_list_args`], at most
/// `most`; lines that name no lease are skipped.
pub fn parse_container_list(output: &str, most: usize) -> Vec<Found> {
    let found: Vec<Found> = output
        .lines()
        .map(str::trim)
        .filter_map(|name| {
            lease_of_mark(name).map(|lease_id| Found::Container {
                lease_id,
                name: name.to_string(),
            })
        })
        .take(most.saturating_add(1))
        .collect();
    if found.len() > most {
        tracing::warn!(most, "too many lease containers; the rest are left");
    }
    found.into_iter().take(most).collect()
}

/// Lists this node's lease containers with the CLI, reading at most
/// [`MOST_CONTAINER_LIST_BYTES`] of its output; none when it fails.
pub async fn list_containers(engine: &Engine, node_id: &str) -> Vec<Found> {
    let cli = &engine.cli;
    match tokio::time::timeout(CLI_TIMEOUT, read_container_list(engine, node_id)).await {
        Ok(Ok(output)) => parse_container_list(&output, MOST_HOST_WORKLOADS),
        Ok(Err(e)) => {
            tracing::warn!(cli = %cli.display(), error = %e, "cannot list containers");
            Vec::new()
        }
        Err(_) => {
            tracing::warn!(cli = %cli.display(), "listing containers timed out");
            Vec::new()
        }
    }
}

async fn read_container_list(engine: &Engine, node_id: &str) -> io::Result<String> {
    use tokio::io::AsyncReadExt;
    let cli = &engine.cli;
    let mut child = engine
        .command()
        .args(container_list_args(node_id))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut output = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        stdout
            .take(MOST_CONTAINER_LIST_BYTES)
            .read_to_end(&mut output)
            .await?;
    }
    if output.len() as u64 == MOST_CONTAINER_LIST_BYTES {
        tracing::warn!(
            most_bytes = MOST_CONTAINER_LIST_BYTES,
            "container list cut short"
        );
        let _ = child.start_kill();
    }
    let status = child.wait().await?;
    if !status.success() && (output.len() as u64) < MOST_CONTAINER_LIST_BYTES {
        return Err(io::Error::other(format!("{} ps: {status}", cli.display())));
    }
    Ok(String::from_utf8_lossy(&output).into_owned())
}

/// A workload the agent did not start in this life: no child to wait for.
#[derive(Debug)]
pub enum Adopted {
    /// Watched through `/proc`; its exit code cannot be known (only the
    /// dead agent could have reaped it).
    Process {
        pid: i32,
        start_ticks: u64,
        cgroup: Option<PathBuf>,
        /// The lease user it runs as, claimed again by this agent: no other
        /// lease takes it while it runs, and its end kills what is left of
        /// it and removes its home. Taken when it is cleaned up.
        user: std::sync::Mutex<Option<super::lease_user::LeaseUser>>,
    },
    /// Watched with `<cli> wait`, which gives its exit code.
    Container {
        engine: Engine,
        lease_id: Uuid,
        name: String,
        stop_margin: Duration,
        /// Where its memory limit is held, when the agent holds it.
        memory_cgroups: Option<super::container_cgroup::ContainerCgroups>,
        /// The tenant networks of this node: its own, if it has one, goes
        /// once it is removed and no other container uses it.
        networks: Box<super::tenant_network::TenantNetworks>,
        /// Why it failed, once it ended and the kernel or the engine said.
        failure: std::sync::Mutex<Option<lh_events::LeaseFailure>>,
        /// Its gang's link, for a gang member: released when it ends.
        gang_link: std::sync::Mutex<Option<Box<super::gang_link::LinkTask>>>,
    },
}

const NO_EXIT: Exit = Exit {
    code: None,
    signal: None,
};

impl Adopted {
    /// How a session enters it: a container by name; a process as its
    /// user, with the environment it was started with (read back from the
    /// kernel, as the agent that set it is gone).
    pub fn door(&self) -> Option<super::door::DoorTarget> {
        match self {
            Adopted::Container { engine, name, .. } => Some(super::door::DoorTarget::Container {
                engine: engine.clone(),
                name: name.clone(),
            }),
            Adopted::Process {
                pid, cgroup, user, ..
            } => {
                let user = user.lock().unwrap_or_else(|p| p.into_inner());
                let user = user.as_ref()?;
                let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
                let env = environ
                    .split(|b| *b == 0)
                    .filter_map(|entry| {
                        let entry = std::str::from_utf8(entry).ok()?;
                        let (name, value) = entry.split_once('=')?;
                        Some((name.to_string(), value.to_string()))
                    })
                    .collect();
                let cgroup_procs = cgroup.as_ref().and_then(|dir| {
                    std::ffi::CString::new(
                        dir.join("cgroup.procs")
                            .into_os_string()
                            .into_encoded_bytes(),
                    )
                    .ok()
                });
                Some(super::door::DoorTarget::Process {
                    uid: user.uid(),
                    home: user.home().to_path_buf(),
                    env,
                    cgroup_procs,
                })
            }
        }
    }

    /// Waits until the workload ends; cancel-safe.
    pub async fn wait(&self) -> Exit {
        let exit = match self {
            Adopted::Process {
                pid, start_ticks, ..
            } => {
                while is_alive(*pid, *start_ticks) {
                    tokio::time::sleep(ADOPTED_POLL_INTERVAL).await;
                }
                NO_EXIT
            }
            Adopted::Container {
                engine,
                name,
                memory_cgroups,
                failure,
                ..
            } => {
                let exit = container_wait(engine, name).await;
                // Before its cgroup goes: the OOM killer's mark is there.
                let oom = match (exit.code, memory_cgroups) {
                    (Some(0) | None, _) => false,
                    (Some(code), Some(cgroups)) => {
                        cgroups.oom_killed(name, code == super::container::EXIT_CODE_KILLED)
                    }
                    (Some(_), None) => super::engine_state::engine_saw_oom(engine, name).await,
                };
                if oom {
                    *failure.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(lh_events::LeaseFailure::OutOfMemory);
                }
                exit
            }
        };
        self.clean_up().await;
        exit
    }

    /// Why it failed, as the kernel or the engine said; `None` for an end
    /// of the workload's own, or one not known.
    pub fn failure(&self) -> Option<lh_events::LeaseFailure> {
        match self {
            Adopted::Container { failure, .. } => {
                *failure.lock().unwrap_or_else(|e| e.into_inner())
            }
            Adopted::Process { .. } => None,
        }
    }

    /// SIGTERM (`<cli> stop`), up to `grace` to exit, then SIGKILL.
    pub async fn stop(&self, grace: Duration) -> Exit {
        let exit = match self {
            Adopted::Process {
                pid, start_ticks, ..
            } => stop_process(*pid, *start_ticks, grace).await,
            Adopted::Container {
                engine,
                name,
                stop_margin,
                ..
            } => {
                run_stop_command(engine, name, grace, *stop_margin).await;
                NO_EXIT
            }
        };
        self.clean_up().await;
        exit
    }

    async fn clean_up(&self) {
        if let Adopted::Container {
            engine,
            name,
            memory_cgroups,
            networks,
            gang_link,
            ..
        } = self
        {
            remove_container(engine, name).await;
            let link = gang_link.lock().map(|mut l| l.take()).unwrap_or_default();
            if let Some(link) = link {
                link.release().await;
            }
            if let Some(cgroups) = memory_cgroups {
                cgroups.remove(name).await;
            }
            let networks = networks.as_ref().clone();
            let _ = tokio::task::spawn_blocking(move || networks.remove_all_unused()).await;
        }
        if let Adopted::Process { cgroup, user, .. } = self {
            if let Some(dir) = cgroup {
                kill_cgroup(dir);
                remove_cgroup(dir).await;
            }
            let user = user.lock().map(|mut u| u.take()).unwrap_or_default();
            // Killing the rest of its user and removing its home are
            // blocking work.
            if let Some(user) = user {
                let _ = tokio::task::spawn_blocking(move || drop(user)).await;
            }
        }
    }
}

/// Stops a process group whose leader is `pid`, if the leader is still the
/// recorded process. The signal that ended it, when it was ours.
pub async fn stop_process(pid: i32, start_ticks: u64, grace: Duration) -> Exit {
    if !is_alive(pid, start_ticks) {
        return NO_EXIT;
    }
    signal_group(pid, libc::SIGTERM);
    if wait_gone(pid, start_ticks, grace).await {
        return Exit {
            code: None,
            signal: Some(libc::SIGTERM),
        };
    }
    // Checked again right before: a pid is not reused while its zombie
    // waits for a reaper, and the recorded one just ran.
    if is_alive(pid, start_ticks) {
        signal_group(pid, libc::SIGKILL);
    }
    if !wait_gone(pid, start_ticks, KILLED_WAIT).await {
        tracing::warn!(pid, "workload process still there after SIGKILL");
    }
    Exit {
        code: None,
        signal: Some(libc::SIGKILL),
    }
}

async fn wait_gone(pid: i32, start_ticks: u64, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if !is_alive(pid, start_ticks) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(ADOPTED_POLL_INTERVAL.min(within)).await;
    }
}

fn signal_group(pgid: i32, signal: libc::c_int) {
    assert!(pgid > 1, "refusing to signal process group {pgid}");
    // SAFETY: killpg(2) has no memory-safety preconditions.
    if unsafe { libc::killpg(pgid, signal) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            tracing::warn!(pgid, error = %e, "cannot signal workload process group");
        }
    }
}

/// `<cli> wait <name>`: the container's exit code, or none when the CLI
/// cannot tell (e.g. the container was already removed).
async fn container_wait(engine: &Engine, name: &str) -> Exit {
    let output = engine
        .command()
        .args(["wait", name])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await;
    let code = output
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok());
    Exit { code, signal: None }
}

/// `<cli> rm --force <name>`; a failure is logged.
pub async fn remove_container(engine: &Engine, name: &str) {
    let output = engine
        .command()
        .args(["rm", "--force", name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status();
    match tokio::time::timeout(CLI_TIMEOUT, output).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(container = name, error = %e, "cannot remove container"),
        Err(_) => tracing::warn!(container = name, "removing the container timed out"),
    }
}

/// Kills every process in a lease cgroup (`cgroup.kill`, where the kernel
/// has it).
pub fn kill_cgroup(dir: &Path) {
    let kill = dir.join("cgroup.kill");
    if kill.exists() {
        if let Err(e) = fs::write(&kill, "1") {
            tracing::warn!(cgroup = %dir.display(), error = %e, "cannot kill cgroup");
        }
    }
}

/// Removes a lease cgroup, retrying while its last processes exit (EBUSY
/// until then); failures are logged. A plain directory that mimics
/// cgroupfs, as in tests, is removed with its files.
pub async fn remove_cgroup(dir: &Path) {
    for _ in 0..CGROUP_REMOVE_ATTEMPTS {
        let removed = match fs::remove_dir(dir) {
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => fs::remove_dir_all(dir),
            other => other,
        };
        match removed {
            Ok(()) => return,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) if e.kind() == io::ErrorKind::ResourceBusy => {
                tokio::time::sleep(CGROUP_REMOVE_RETRY).await
            }
            Err(e) => {
                tracing::warn!(cgroup = %dir.display(), error = %e, "cannot remove cgroup");
                return;
            }
        }
    }
    tracing::warn!(cgroup = %dir.display(), "cgroup still busy; left in place");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn process(n: u128, placement: u64, alive: bool) -> Found {
        Found::Process {
            record: ProcessRecord {
                node_id: "node-a".into(),
                lease_id: lease(n),
                placement,
                pid: 1000 + n as i32,
                start_ticks: 5,
            },
            path: PathBuf::from(format!("/state/lh-{n}.json")),
            alive,
        }
    }

    fn container(n: u128) -> Found {
        Found::Container {
            lease_id: lease(n),
            name: mark(lease(n)),
        }
    }

    fn cgroup(n: u128) -> Found {
        Found::Cgroup {
            lease_id: lease(n),
            dir: PathBuf::from(format!("/cg/leasehold/{}", mark(lease(n)))),
        }
    }

    #[test]
    fn a_lease_placed_here_is_adopted_and_the_rest_reaped() {
        let placed = HashMap::from([(lease(1), 10), (lease(2), 20)]);
        let found = [
            process(1, 10, true),
            process(2, 19, true),
            process(3, 30, true),
            container(4),
        ];
        let decisions = decide(&found, &placed);
        assert_eq!(decisions[0], Decision::Adopt { placement: 10 });
        assert!(
            matches!(decisions[1], Decision::Reap { why } if why.contains("earlier placement"))
        );
        assert!(matches!(decisions[2], Decision::Reap { why } if why.contains("not placed")));
        assert!(matches!(decisions[3], Decision::Reap { why } if why.contains("not placed")));
    }

    #[test]
    fn a_dead_or_reused_pid_is_only_forgotten() {
        let placed = HashMap::from([(lease(1), 10)]);
        assert_eq!(
            decide(&[process(1, 10, false), process(2, 7, false)], &placed),
            [Decision::Forget, Decision::Forget]
        );
    }

    #[test]
    fn a_lease_is_adopted_once() {
        let placed = HashMap::from([(lease(1), 10)]);
        let decisions = decide(&[container(1), container(1)], &placed);
        assert_eq!(decisions[0], Decision::Adopt { placement: 10 });
        assert!(matches!(decisions[1], Decision::Reap { .. }));
    }

    #[test]
    fn a_cgroup_stays_with_its_adopted_process_only() {
        let placed = HashMap::from([(lease(1), 10), (lease(2), 20)]);
        let found = [cgroup(1), process(1, 10, true), cgroup(2), cgroup(3)];
        let decisions = decide(&found, &placed);
        assert_eq!(decisions[0], Decision::Adopt { placement: 10 });
        assert!(
            matches!(decisions[2], Decision::Reap { .. }),
            "no process of lease 2"
        );
        assert!(
            matches!(decisions[3], Decision::Reap { .. }),
            "lease 3 unknown"
        );
    }

    #[test]
    fn stat_lines_parse_past_odd_command_names() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[0] = "S".into();
        fields[22 - 3] = "123456".into();
        let line = format!("42 (a) (b c) {}", fields.join(" "));
        assert_eq!(parse_stat(&line), Some(123456));
        fields[0] = "Z".into();
        assert_eq!(parse_stat(&format!("42 (x) {}", fields.join(" "))), None);
        assert_eq!(parse_stat("42 (x) S 1 2"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn this_process_has_a_start_time_and_a_wrong_one_is_not_it() {
        let pid = std::process::id() as i32;
        let ticks = process_start_ticks(pid).expect("own stat");
        assert!(is_alive(pid, ticks));
        assert!(!is_alive(pid, ticks + 1));
    }

    #[test]
    fn container_listing_parses_and_is_bounded() {
        let (a, b) = (lease(1), lease(2));
        let out = format!("lh-{a}\n\nsomething-else\n  lh-{b}  \nlh-not-a-uuid\n");
        let found = parse_container_list(&out, 10);
        assert_eq!(found, [container(1), container(2)]);
        assert_eq!(parse_container_list(&out, 1), [container(1)]);
        let args = container_list_args("node-a").join(" ");
        assert_eq!(
            args,
            "ps --all --filter label=leasehold.node=node-a --filter label=leasehold.lease --format {{.Names}}"
        );
    }

    #[test]
    fn records_round_trip_and_other_nodes_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let pid = std::process::id() as i32;
        let record = |node: &str, n| ProcessRecord {
            node_id: node.into(),
            lease_id: lease(n),
            placement: 3,
            pid,
            start_ticks: process_start_ticks(pid).unwrap(),
        };
        record("node-a", 1).write(dir.path()).unwrap();
        record("node-b", 2).write(dir.path()).unwrap();
        fs::write(dir.path().join("lh-garbage.json"), "{").unwrap();
        fs::write(dir.path().join("unrelated.txt"), "x").unwrap();
        let found = list_process_records(dir.path(), "node-a", 10);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            matches!(&found[0], Found::Process { record: r, alive: true, .. } if r.lease_id == lease(1))
        );
        assert!(list_process_records(&dir.path().join("missing"), "node-a", 10).is_empty());
        record("node-a", 3).write(dir.path()).unwrap();
        assert_eq!(list_process_records(dir.path(), "node-a", 1).len(), 1);
    }

    #[test]
    fn cgroups_are_listed_by_mark() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join(mark(lease(1)))).unwrap();
        fs::create_dir(dir.path().join("other")).unwrap();
        fs::write(dir.path().join(mark(lease(2))), "a file").unwrap();
        let found = list_cgroups(dir.path(), 10);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].lease_id(), lease(1));
        assert!(list_cgroups(&dir.path().join("missing"), 10).is_empty());
    }

    #[tokio::test]
    async fn a_cgroup_is_killed_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let cgroup = dir.path().join(mark(lease(1)));
        fs::create_dir(&cgroup).unwrap();
        fs::write(cgroup.join("cgroup.kill"), "0").unwrap();
        kill_cgroup(&cgroup);
        assert_eq!(fs::read_to_string(cgroup.join("cgroup.kill")).unwrap(), "1");
        remove_cgroup(&cgroup).await;
        assert!(!cgroup.exists());
        remove_cgroup(&cgroup).await;
    }
}
