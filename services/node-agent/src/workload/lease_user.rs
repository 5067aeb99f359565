//! Each lease's own unprivileged user, for the process runtime.
//!
//! A workload that ran as the agent could read the agent's NATS seed and
//! speak as the node. So every lease runs as a user of its own, taken from
//! a range no account uses ([`FIRST_LEASE_UID`], [`LEASE_UID_COUNT`]):
//! with no supplementary groups, `no_new_privs` (a setuid binary cannot
//! lift it back), at most [`MAX_PROCESSES_PER_LEASE`] processes, and a home
//! of its own (0700) under the node's lease homes, its working directory.
//! Two leases never share a user: a user is free only while no lease
//! holds it and no process of it is alive. When the lease ends, every
//! process of its user is killed and its home removed.
//!
//! Changing users needs root: an agent that is not root cannot run the
//! process runtime at all (the container runtime is the way then).

use std::collections::BTreeSet;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{chown, DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use uuid::Uuid;

use super::RuntimeError;

/// The first uid (and gid) a lease runs as: far above the accounts a host
/// makes and the subordinate ranges (`/etc/subuid`) container engines use.
pub const FIRST_LEASE_UID: u32 = 2_000_000_000;
/// How many leases of one node may run at once under the process runtime.
pub const LEASE_UID_COUNT: u32 = 65_536;
/// The uids after the lease users: one per GPU, for the shares of that GPU
/// that MPS enforces. An MPS server serves the clients of one user only
/// (a second user's wait until it quits), so the shares of one GPU run as
/// that GPU's user: still never the agent, but not apart from each other.
pub const GPU_SHARE_UID_COUNT: u32 = 1_024;
/// `RLIMIT_NPROC` of a lease's user: a fork bomb ends there, not at the host.
/// Threads count too: a large multi-GPU job runs thousands.
pub const MAX_PROCESSES_PER_LEASE: u64 = 16_384;
/// Where an agent claims a lease user, host-wide: one lock file per uid,
/// held (`flock`) while a lease runs as it. The kernel lets go of a dead
/// agent's claims; a user is free only while unclaimed and with no live
/// process, so several agents of one host never share one.
pub const LEASE_USER_CLAIMS_DIR: &str = "/run/leasehold/lease-users";
/// The directory of lease homes, inside the agent's state directory.
pub const LEASE_HOMES_DIR: &str = "leases";

/// The user the shares of GPU `index` run as, under MPS.
pub fn gpu_share_uid(index: u32) -> u32 {
    FIRST_LEASE_UID + LEASE_UID_COUNT + index.min(GPU_SHARE_UID_COUNT - 1)
}

/// The users leases run as on this node, and which are taken.
#[derive(Debug, Clone)]
pub struct LeaseUsers {
    first_uid: u32,
    count: u32,
    homes: PathBuf,
    claims: PathBuf,
}

impl LeaseUsers {
    /// The lease users of a node whose state directory is `state_dir`.
    /// Refused unless the agent is root. The state directory becomes 0711
    /// (its other entries are the agent's own, 0700 and 0600) so that a
    /// lease reaches its home by its full path, and cannot list the rest.
    pub fn for_node(state_dir: &Path) -> Result<Self, RuntimeError> {
        let (first_uid, count) = (FIRST_LEASE_UID, LEASE_UID_COUNT);
        let bad = |why: String| RuntimeError::InvalidConfig(why);
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(bad(
                "the process runtime runs each lease as its own user, which \
                 needs root; run the agent as root, or use the container runtime"
                    .into(),
            ));
        }
        let homes = state_dir.join(LEASE_HOMES_DIR);
        let cannot = |path: &Path, e: io::Error| bad(format!("{}: {e}", path.display()));
        super::create_private_dir(&homes).map_err(|e| cannot(&homes, e))?;
        let claims = PathBuf::from(LEASE_USER_CLAIMS_DIR);
        super::create_private_dir(&claims).map_err(|e| cannot(&claims, e))?;
        for dir in [state_dir, homes.as_path()] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
                .map_err(|e| cannot(dir, e))?;
        }
        let state_dir = std::fs::canonicalize(state_dir).map_err(|e| cannot(state_dir, e))?;
        for dir in state_dir.ancestors().skip(1) {
            let meta = std::fs::metadata(dir).map_err(|e| cannot(dir, e))?;
            let mode = meta.mode() & 0o7777;
            // One another user may write, unless sticky (/tmp), could have
            // the homes swapped under the agent's chown.
            if mode & 0o022 != 0 && mode & 0o1000 == 0 {
                return Err(bad(format!(
                    "{}: writable by other users (mode {:o}); lease homes below it are not safe",
                    dir.display(),
                    mode & 0o777
                )));
            }
            // Search without read: a lease reaches its home and its GPU's
            // MPS pipes by their paths, and lists nothing on the way. The
            // agent does not open a directory of the host's by itself: an
            // operator chooses which are.
            if mode & 0o001 == 0 {
                return Err(bad(format!(
                    "{}: a lease user cannot pass through it to its home (mode {:o}); \
                     make it searchable by others (chmod o+x), or keep the node's \
                     state (--state-dir) below directories that are",
                    dir.display(),
                    mode & 0o777
                )));
            }
        }
        Ok(LeaseUsers {
            first_uid,
            count,
            homes,
            claims,
        })
    }

    /// Where the homes of leases are.
    pub fn homes(&self) -> &Path {
        &self.homes
    }

    /// Whether `uid` is one of the lease users.
    pub fn contains(&self, uid: u32) -> bool {
        uid >= self.first_uid && uid - self.first_uid < self.count
    }

    /// Whether `uid` is the user of a GPU's MPS shares.
    pub fn is_gpu_share_uid(uid: u32) -> bool {
        let first = FIRST_LEASE_UID + LEASE_UID_COUNT;
        uid >= first && uid - first < GPU_SHARE_UID_COUNT
    }

    /// `lease_id` as the user of its GPU's MPS shares (`uid`), in a home
    /// of its own. Ending it removes the home and leaves the user's
    /// processes to their own leases' process groups and cgroups.
    pub fn share(&self, lease_id: Uuid, uid: u32) -> Result<LeaseUser, RuntimeError> {
        if !Self::is_gpu_share_uid(uid) {
            return Err(RuntimeError::InvalidConfig(format!(
                "uid {uid} is not a GPU's share user"
            )));
        }
        let home = self.make_home(lease_id, uid)?;
        Ok(LeaseUser {
            uid,
            home,
            claim: None,
        })
    }

    fn make_home(&self, lease_id: Uuid, uid: u32) -> Result<PathBuf, RuntimeError> {
        let home = self.homes.join(lease_id.to_string());
        let cannot = |e: io::Error| RuntimeError::InvalidConfig(format!("{}: {e}", home.display()));
        // What an earlier run of the same lease left is not handed on.
        remove_home(&home);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&home)
            .map_err(cannot)?;
        chown(&home, Some(uid), Some(uid)).map_err(cannot)?;
        Ok(home)
    }

    /// The user `uid` that a workload of `lease_id`, started by an agent
    /// before this one, runs as: claimed again, so that no other lease
    /// takes it while it runs and its end is as a started one's. `None`
    /// for a uid that is no lease's, or a lease user another live agent
    /// holds (then it is that agent's to end).
    pub fn adopt(&self, lease_id: Uuid, uid: u32) -> Option<LeaseUser> {
        let claim = if self.contains(uid) {
            Some(self.claim(uid)?)
        } else if Self::is_gpu_share_uid(uid) {
            None
        } else {
            return None;
        };
        Some(LeaseUser {
            uid,
            home: self.homes.join(lease_id.to_string()),
            claim,
        })
    }

    /// Takes a free user for `lease_id` and makes its home, empty.
    pub fn take(&self, lease_id: Uuid) -> Result<LeaseUser, RuntimeError> {
        let alive = uids_with_processes();
        // From a place of the lease's own, not the lowest free: a user is
        // handed on as rarely as the range allows.
        let start = (lease_id.as_u128() % u128::from(self.count)) as u32;
        for offset in 0..self.count {
            let uid = self.first_uid + (start + offset) % self.count;
            if alive.contains(&uid) {
                continue;
            }
            let Some(claim) = self.claim(uid) else {
                continue;
            };
            // Claimed: whatever started since the scan is checked again.
            if uids_with_processes().contains(&uid) {
                continue;
            }
            let home = self.make_home(lease_id, uid)?;
            return Ok(LeaseUser {
                uid,
                home,
                claim: Some(claim),
            });
        }
        Err(RuntimeError::InvalidConfig(format!(
            "all {} lease users are taken on this host",
            self.count
        )))
    }

    /// The claim on `uid`, unless another holds it.
    fn claim(&self, uid: u32) -> Option<std::fs::File> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.claims.join(uid.to_string()))
            .ok()?;
        // SAFETY: flock(2) on a descriptor this function owns.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        locked.then_some(file)
    }

    /// Homes of leases not in `keep`, left by workloads that ended with an
    /// agent that is gone; removed.
    pub fn remove_homes_except(&self, keep: &dyn Fn(Uuid) -> bool) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.homes) else {
            return 0;
        };
        let homes: Vec<(Uuid, PathBuf, u32)> = entries
            .flatten()
            .filter_map(|entry| {
                let lease = Uuid::parse_str(entry.file_name().to_str()?).ok()?;
                let owner = entry.metadata().map(|m| m.uid()).unwrap_or(0);
                Some((lease, entry.path(), owner))
            })
            .collect();
        // The users of the leases kept: one a workload adopted after a
        // restart runs as holds no claim of this agent, and a stale home
        // of the same user must not end it.
        let kept_users: BTreeSet<u32> = homes
            .iter()
            .filter(|(lease, _, _)| keep(*lease))
            .map(|(_, _, owner)| *owner)
            .collect();
        let mut removed = 0;
        for (lease, path, owner) in homes {
            if keep(lease) {
                continue;
            }
            if self.contains(owner) && !kept_users.contains(&owner) {
                // A claimed user is a running lease's, of another agent.
                let Some(_claim) = self.claim(owner) else {
                    continue;
                };
                kill_uid(owner);
                remove_owned_scratch(owner);
            }
            remove_home(&path);
            removed += 1;
        }
        removed
    }
}

/// The user a lease's workload runs as, while it runs.
#[derive(Debug)]
pub struct LeaseUser {
    uid: u32,
    home: PathBuf,
    /// The lease's alone, let go when it ends; `None` for a GPU's share
    /// user, which other leases' workloads may run as too.
    claim: Option<std::fs::File>,
}

impl LeaseUser {
    pub fn uid(&self) -> u32 {
        self.uid
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// A `pre_exec` hook that becomes this user, for good: after any hook
    /// that needs root (entering the lease cgroup).
    pub fn become_hook(&self) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
        let id = self.uid;
        move || become_user(id)
    }

    /// Kills every process of this user and removes its home; the user is
    /// free again once nothing of it is alive.
    fn end(&mut self) {
        let uid = self.uid;
        if uid == 0 {
            return;
        }
        if self.claim.is_some() {
            let left = kill_uid(uid);
            remove_owned_scratch(uid);
            if left > 0 {
                // Never handed on while any of it lives: this agent keeps
                // the claim for its lifetime; after it, a new lease skips
                // a user with live processes.
                tracing::error!(
                    uid,
                    left,
                    "processes of an ended lease's user survive SIGKILL; its user is not reused"
                );
                std::mem::forget(self.claim.take());
            }
        }
        remove_home(&self.home);
        // Let go only now: nothing of the user is left for the next lease.
        self.claim = None;
        self.uid = 0;
    }
}

impl Drop for LeaseUser {
    fn drop(&mut self) {
        self.end();
    }
}

/// Refuses a secret file (`variable` names it) that anyone but its owner
/// may read or write: workloads of the process runtime run on the same
/// host, and one that read the agent's seed would speak as the node.
pub fn check_secret_private(variable: &str, path: &Path) -> Result<(), RuntimeError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| RuntimeError::InvalidConfig(format!("{variable}={}: {e}", path.display())))?;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(RuntimeError::InvalidConfig(format!(
            "{variable}={}: mode {mode:o} lets other users read it, leases \
             included; make it 600 (chmod 600)",
            path.display()
        )));
    }
    Ok(())
}

/// Only async-signal-safe calls: this runs between fork and exec.
pub(crate) fn become_user(uid: u32) -> io::Result<()> {
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    let nproc = libc::rlimit {
        rlim_cur: MAX_PROCESSES_PER_LEASE as libc::rlim_t,
        rlim_max: MAX_PROCESSES_PER_LEASE as libc::rlim_t,
    };
    // SAFETY: each call takes plain values or a pointer to a live local.
    unsafe {
        // Descriptors a C library opened without O_CLOEXEC close at the
        // exec (std's own error pipe is close-on-exec already). A kernel
        // older than close_range(2) flags leaves them as they are.
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        check(libc::setrlimit(libc::RLIMIT_NPROC, &nproc))?;
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setgid(uid))?;
        check(libc::setuid(uid))?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        // setuid(2) from root drops every saved id; make sure of it.
        if libc::getuid() != uid || libc::geteuid() != uid || libc::setuid(0) == 0 {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
    }
    Ok(())
}

/// Rounds of [`kill_uid`] before it gives up on a user.
const MAX_KILL_ROUNDS: usize = 100;

/// SIGKILL, from root, to every process of `uid`, round after round until
/// a scan finds none: a process may fork between a scan and its kill, but
/// not after its kill, and `RLIMIT_NPROC` bounds how many there can be.
/// Sent by the agent, not as the user, so that the user cannot kill the
/// killer first. How many are left when it gives up (0: none).
fn kill_uid(uid: u32) -> usize {
    for round in 0..MAX_KILL_ROUNDS {
        let pids = pids_of(uid);
        if pids.is_empty() {
            return 0;
        }
        for pid in &pids {
            // SAFETY: kill(2) with a pid read from /proc; a pid that has
            // exited since is ESRCH, and the scan is per uid, so a reused
            // pid belongs to this user too.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        if round > 0 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    pids_of(uid).len()
}

/// What a lease left where every user may write (`/tmp`, `/var/tmp`,
/// `/dev/shm`): removed, so that the next lease of the user finds none of
/// it. Only what the user owns at the top of each.
fn remove_owned_scratch(uid: u32) {
    for dir in ["/tmp", "/var/tmp", "/dev/shm"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.uid() != uid {
                continue;
            }
            let removed = if meta.is_dir() {
                std::fs::remove_dir_all(entry.path())
            } else {
                std::fs::remove_file(entry.path())
            };
            if let Err(e) = removed {
                tracing::warn!(path = %entry.path().display(), error = %e, "cannot remove what an ended lease left");
            }
        }
    }
}

fn remove_home(home: &Path) {
    let meta = match std::fs::symlink_metadata(home) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::warn!(home = %home.display(), error = %e, "cannot remove a lease's home");
            return;
        }
    };
    // What a lease made in its home goes first, removed by its own user:
    // `rm` walks a tree of any depth, where one walk of root's would run
    // out of descriptors or stack, and as that user it can remove nothing
    // the lease could not have removed itself.
    if meta.is_dir() && meta.uid() != 0 {
        empty_as(meta.uid(), home);
    }
    // Then root removes what is left: the home itself, in a directory the
    // user may not write. remove_dir_all does not follow links.
    let removed = if meta.is_dir() {
        std::fs::remove_dir_all(home)
    } else {
        std::fs::remove_file(home)
    };
    match removed {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(home = %home.display(), error = %e, "cannot remove a lease's home")
        }
    }
}

/// Longest `rm` may take to empty a lease's home.
const HOME_EMPTYING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes what is in `home` as `uid`, on the home's file system only:
/// `rm -rf` of the home, which empties it and then may not remove the home
/// itself (its parent is root's).
fn empty_as(uid: u32, home: &Path) {
    use std::os::unix::process::CommandExt;
    // std drops the supplementary groups before it changes the user.
    let child = std::process::Command::new("rm")
        .args(["-rf", "--one-file-system", "--"])
        .arg(home)
        .current_dir("/")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .gid(uid)
        .uid(uid)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            tracing::warn!(home = %home.display(), error = %e, "cannot empty a lease's home as its user");
            return;
        }
    };
    let deadline = std::time::Instant::now() + HOME_EMPTYING_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!(home = %home.display(), "emptying a lease's home took too long; stopped");
                return;
            }
        }
    }
}

/// The processes whose real, effective, saved or filesystem uid is `uid`.
fn pids_of(uid: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            // A zombie is dead already; its parent reaps it.
            let zombie = status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'));
            (!zombie && parse_uids(&status).contains(&uid)).then_some(pid)
        })
        .collect()
}

/// The real uids of every live process, from `/proc/<pid>/status`.
fn uids_with_processes() -> BTreeSet<u32> {
    let mut uids = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return uids;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.as_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        if let Ok(status) = std::fs::read_to_string(entry.path().join("status")) {
            uids.extend(parse_uids(&status));
        }
    }
    uids
}

/// The real, effective, saved and filesystem uids of a `status` file.
fn parse_uids(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|ids| {
            ids.split_whitespace()
                .filter_map(|u| u.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_others_may_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("node.nk");
        std::fs::write(&seed, "SUAX\n").unwrap();
        std::fs::set_permissions(&seed, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = check_secret_private("LH_NATS_NKEY_SEED_FILE", &seed).unwrap_err();
        assert!(err.to_string().contains("mode 644"), "{err}");
        std::fs::set_permissions(&seed, std::fs::Permissions::from_mode(0o600)).unwrap();
        check_secret_private("LH_NATS_NKEY_SEED_FILE", &seed).unwrap();
        assert!(check_secret_private("X", &dir.path().join("none")).is_err());
    }

    /// The agent opens no directory of the host's to other users by
    /// itself: an operator chooses.
    #[test]
    fn a_state_directory_below_one_lease_users_cannot_pass_is_refused_and_left_as_it_is() {
        let base = lh_testkit::shared_tempdir();
        let closed = base.path().join("closed");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&closed)
            .unwrap();
        let err = LeaseUsers::for_node(&closed.join("state")).unwrap_err();
        assert!(err.to_string().contains("chmod o+x"), "{err}");
        let mode = std::fs::metadata(&closed).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700, "the agent changed a directory it does not own");
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o711)).unwrap();
        LeaseUsers::for_node(&closed.join("state")).expect("searchable: taken");
    }

    /// Deeper than root's one walk of a tree can go: a descriptor per level
    /// (the agent's limit is 20,000 here) and a stack frame per level.
    const DEEP_HOME_LEVELS: usize = 30_000;

    #[test]
    fn a_home_of_any_depth_is_removed_with_its_lease() {
        use std::os::unix::process::CommandExt;
        let state = lh_testkit::shared_tempdir();
        let users = LeaseUsers::for_node(state.path()).unwrap();
        let user = users.take(Uuid::new_v4()).unwrap();
        let home = user.home().to_path_buf();
        let uid = user.uid();
        let level = std::ffi::CString::new("d").unwrap();
        let mut lease = std::process::Command::new("true");
        lease.current_dir(&home);
        // SAFETY: only system calls between fork and exec.
        unsafe {
            lease.pre_exec(move || {
                if libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                    return Err(io::Error::last_os_error());
                }
                for _ in 0..DEEP_HOME_LEVELS {
                    if libc::mkdir(level.as_ptr(), 0o700) != 0 || libc::chdir(level.as_ptr()) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        assert!(lease.status().unwrap().success(), "the lease made its tree");
        drop(user);
        assert!(!home.exists(), "{} is left", home.display());
    }

    #[test]
    fn the_uids_of_a_status_file_are_read() {
        let status = "Name:\tsh\nState:\tS (sleeping)\nUid:\t2000000001\t2000000001\t2000000001\t2000000001\nGid:\t0\t0\t0\t0\n";
        assert_eq!(parse_uids(status), vec![2_000_000_001; 4]);
        assert!(parse_uids("Name:\tx\n").is_empty());
    }
}
