//! cgroup v2 for the process runtime: one per lease, with memory limits.
//!
//! Where the host has cgroup v2 with the memory controller and the agent may
//! write there, each lease gets `<root>/leasehold/lh-<lease_id>/`, so that a
//! stop reaches everything the workload started (`cgroup.kill`), even what
//! left its process group; with a RAM share it also gets `memory.max` (hard
//! limit) and `memory.high` (soft limit, throttling and reclaim above it). The child moves itself in between fork and exec,
//! so nothing it starts escapes the limits. After the workload exits the
//! cgroup is killed (`cgroup.kill`) and removed.
//!
//! The limits are percentages of the lease's share: hard 80 %, soft 90 % by
//! default. In cgroup v2 a `memory.high` above `memory.max` has no effect,
//! so the soft limit written is `min(soft, hard)`; with the defaults both
//! are 80 %. Both percentages are
//! configurable ([`CgroupConfig`]).
//!
//! The root is configurable so that tests can point it at a directory that
//! mimics the cgroup files, and so that an operator can point it at a
//! delegated subtree (e.g. a systemd unit with `Delegate=yes`).

use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use uuid::Uuid;

use super::RuntimeError;

/// Where cgroup v2 is mounted on a unified-hierarchy host.
pub const DEFAULT_ROOT: &str = "/sys/fs/cgroup";
/// The directory under the root that holds one cgroup per lease.
pub const PARENT_DIR: &str = "leasehold";
pub const DEFAULT_HARD_LIMIT_PCT: u8 = 80;
pub const DEFAULT_SOFT_LIMIT_PCT: u8 = 90;
/// Removing a cgroup waits for its last processes to be gone (EBUSY until
/// then): this many tries, [`REMOVE_RETRY`] apart.
const REMOVE_ATTEMPTS: u32 = 50;
const REMOVE_RETRY: Duration = Duration::from_millis(20);

/// Where and how the process runtime makes lease cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupConfig {
    /// A cgroup v2 directory (the mount, or a delegated subtree).
    pub root: PathBuf,
    /// `memory.max` as a percentage of the lease's RAM share, 1..=100.
    pub hard_limit_pct: u8,
    /// `memory.high` as a percentage of the share, 1..=100; capped at the
    /// hard limit.
    pub soft_limit_pct: u8,
}

impl Default for CgroupConfig {
    fn default() -> Self {
        CgroupConfig {
            root: PathBuf::from(DEFAULT_ROOT),
            hard_limit_pct: DEFAULT_HARD_LIMIT_PCT,
            soft_limit_pct: DEFAULT_SOFT_LIMIT_PCT,
        }
    }
}

impl CgroupConfig {
    pub fn validate(&self) -> Result<(), RuntimeError> {
        for (name, pct) in [
            ("hard_limit_pct", self.hard_limit_pct),
            ("soft_limit_pct", self.soft_limit_pct),
        ] {
            if !(1..=100).contains(&pct) {
                return Err(RuntimeError::InvalidConfig(format!(
                    "{name} {pct} outside 1..=100"
                )));
            }
        }
        Ok(())
    }

    /// `<root>/leasehold`: the agent's parent cgroup, which holds only lease
    /// cgroups (a restarted agent removes those of leases not placed here).
    pub fn parent_dir(&self) -> PathBuf {
        self.root.join(PARENT_DIR)
    }

    /// `<root>/leasehold/lh-<lease_id>`, marked as the lease's.
    pub fn lease_dir(&self, lease_id: Uuid) -> PathBuf {
        self.parent_dir().join(super::mark(lease_id))
    }

    pub fn limits(&self, share_bytes: u64) -> MemoryLimits {
        memory_limits(share_bytes, self.hard_limit_pct, self.soft_limit_pct)
    }
}

/// The values written to `memory.max` and `memory.high`, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    pub max_bytes: u64,
    pub high_bytes: u64,
}

/// Hard and soft limit as percentages of `share_bytes`, rounded down; the
/// soft limit never above the hard one (it would have no effect).
pub fn memory_limits(share_bytes: u64, hard_pct: u8, soft_pct: u8) -> MemoryLimits {
    let pct = |p: u8| (u128::from(share_bytes) * u128::from(p) / 100) as u64;
    let max_bytes = pct(hard_pct);
    MemoryLimits {
        max_bytes,
        high_bytes: pct(soft_pct).min(max_bytes),
    }
}

/// `Ok` when lease cgroups can be made under `root`, or why not.
pub fn probe(root: &Path) -> Result<(), String> {
    let controllers_file = root.join("cgroup.controllers");
    let controllers = fs::read_to_string(&controllers_file)
        .map_err(|e| format!("no cgroup v2 at {}: {e}", root.display()))?;
    if !lists(&controllers, "memory") {
        return Err(format!(
            "{} does not list the memory controller",
            controllers_file.display()
        ));
    }
    let path = CString::new(root.as_os_str().as_bytes())
        .map_err(|_| format!("{} contains a NUL byte", root.display()))?;
    // SAFETY: access(2) reads a NUL-terminated path we own.
    if unsafe { libc::access(path.as_ptr(), libc::W_OK) } != 0 {
        return Err(format!(
            "{} is not writable: {}",
            root.display(),
            io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Whether a controller list (`cgroup.controllers`, `cgroup.subtree_control`)
/// names `controller`. A `+` prefix counts, as written by us into a plain
/// file that mimics cgroupfs.
fn lists(list: &str, controller: &str) -> bool {
    list.split_whitespace()
        .any(|c| c.trim_start_matches('+') == controller)
}

/// Enables the memory controller for the children of `dir` unless it is.
fn delegate_memory(dir: &Path) -> io::Result<()> {
    let path = dir.join("cgroup.subtree_control");
    let current = match fs::read_to_string(&path) {
        Ok(current) => current,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    if lists(&current, "memory") {
        return Ok(());
    }
    fs::write(&path, "+memory")
}

fn create_dir_if_missing(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        other => other,
    }
}

fn with_path(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// One lease's cgroup, created with its limits.
#[derive(Debug)]
pub(crate) struct LeaseCgroup {
    dir: PathBuf,
    /// `<dir>/cgroup.procs`, ready for the forked child.
    procs: CString,
}

impl LeaseCgroup {
    pub(crate) fn create(
        config: &CgroupConfig,
        lease_id: Uuid,
        limits: Option<MemoryLimits>,
    ) -> io::Result<LeaseCgroup> {
        let parent = config.root.join(PARENT_DIR);
        let dir = config.lease_dir(lease_id);
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in cgroup path"))?;
        delegate_memory(&config.root).map_err(|e| with_path(&config.root, e))?;
        create_dir_if_missing(&parent).map_err(|e| with_path(&parent, e))?;
        delegate_memory(&parent).map_err(|e| with_path(&parent, e))?;
        create_dir_if_missing(&dir).map_err(|e| with_path(&dir, e))?;
        let cgroup = LeaseCgroup { dir, procs };
        let write = |file: &str, bytes: u64| {
            let path = cgroup.dir.join(file);
            fs::write(&path, bytes.to_string()).map_err(|e| with_path(&path, e))
        };
        let Some(limits) = limits else {
            return Ok(cgroup);
        };
        if let Err(e) = write("memory.max", limits.max_bytes)
            .and_then(|()| write("memory.high", limits.high_bytes))
        {
            let _ = cgroup.try_remove();
            return Err(e);
        }
        Ok(cgroup)
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its `cgroup.procs`, which a process enters by writing its pid.
    pub(crate) fn procs(&self) -> &CStr {
        &self.procs
    }

    /// A `pre_exec` hook that moves the forked child into this cgroup.
    pub(crate) fn enter_hook(&self) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
        let procs = self.procs.clone();
        move || write_own_pid(&procs)
    }

    /// Kills what is left in the cgroup and removes it, retrying while the
    /// last processes exit. Failures are logged: the lease is over anyway.
    pub(crate) async fn remove(&self) {
        let kill = self.dir.join("cgroup.kill");
        if kill.exists() {
            if let Err(e) = fs::write(&kill, "1") {
                tracing::warn!(cgroup = %self.dir.display(), error = %e, "cannot kill cgroup");
            }
        }
        for _ in 0..REMOVE_ATTEMPTS {
            match self.try_remove() {
                Ok(()) => return,
                Err(e) if e.kind() == io::ErrorKind::ResourceBusy => {
                    tokio::time::sleep(REMOVE_RETRY).await
                }
                Err(e) => {
                    tracing::warn!(cgroup = %self.dir.display(), error = %e, "cannot remove cgroup");
                    return;
                }
            }
        }
        tracing::warn!(cgroup = %self.dir.display(), "cgroup still busy; left in place");
    }

    /// rmdir, as cgroupfs wants (its interface files go with the directory).
    /// A plain directory that mimics cgroupfs, as in tests, holds real
    /// files: it is removed with them.
    pub(crate) fn try_remove(&self) -> io::Result<()> {
        match fs::remove_dir(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => fs::remove_dir_all(&self.dir),
            other => other,
        }
    }
}

/// Writes the calling process's pid to `procs`. Runs in the forked child
/// before exec, so only async-signal-safe calls (getpid, open, write,
/// close) and no allocation.
pub(crate) fn write_own_pid(procs: &CStr) -> io::Result<()> {
    let mut digits = [0u8; 20];
    // SAFETY: getpid(2) cannot fail.
    let pid = unsafe { libc::getpid() };
    let text = format_decimal(pid as u64, &mut digits);
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC;
    // SAFETY: `procs` is NUL-terminated and outlives the call.
    let fd = unsafe { libc::open(procs.as_ptr(), flags, 0o644 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: writes `text.len()` bytes from a live buffer to our own fd.
    let written = unsafe { libc::write(fd, text.as_ptr().cast(), text.len()) };
    let result = if written < 0 {
        Err(io::Error::last_os_error())
    } else if written as usize != text.len() {
        Err(io::Error::from(io::ErrorKind::WriteZero))
    } else {
        Ok(())
    };
    // SAFETY: closes the fd opened above, once.
    unsafe { libc::close(fd) };
    result
}

/// `n` in decimal, without allocating.
fn format_decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[start..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn defaults_cap_the_soft_limit_at_the_hard_one() {
        let limits = CgroupConfig::default().limits(10 * GIB);
        assert_eq!(limits.max_bytes, 8 * GIB);
        assert_eq!(limits.high_bytes, 8 * GIB);
    }

    #[test]
    fn a_soft_limit_below_the_hard_one_is_kept() {
        let limits = memory_limits(10 * GIB, 90, 80);
        assert_eq!(limits.max_bytes, 9 * GIB);
        assert_eq!(limits.high_bytes, 8 * GIB);
    }

    #[test]
    fn percentages_round_down_and_do_not_overflow() {
        assert_eq!(memory_limits(999, 80, 50).max_bytes, 799);
        assert_eq!(memory_limits(999, 80, 50).high_bytes, 499);
        assert_eq!(memory_limits(u64::MAX, 100, 100).max_bytes, u64::MAX);
    }

    #[test]
    fn percentages_outside_1_to_100_are_refused() {
        for (hard, soft) in [(0, 90), (101, 90), (80, 0), (80, 200)] {
            let config = CgroupConfig {
                hard_limit_pct: hard,
                soft_limit_pct: soft,
                ..CgroupConfig::default()
            };
            assert!(config.validate().is_err(), "{hard} {soft}");
        }
        CgroupConfig::default().validate().unwrap();
    }

    #[test]
    fn controller_lists() {
        assert!(lists("cpuset cpu io memory pids", "memory"));
        assert!(lists("+memory", "memory"));
        assert!(!lists("cpu io", "memory"));
        assert!(!lists("memory_x", "memory"));
        assert!(!lists("", "memory"));
    }

    #[test]
    fn decimal_formatting() {
        let mut buf = [0u8; 20];
        assert_eq!(format_decimal(0, &mut buf), b"0");
        assert_eq!(format_decimal(4194304, &mut buf), b"4194304");
        assert_eq!(
            format_decimal(u64::MAX, &mut buf),
            u64::MAX.to_string().as_bytes()
        );
    }

    #[test]
    fn probe_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        assert!(probe(dir.path()).unwrap_err().contains("no cgroup v2"));
        fs::write(dir.path().join("cgroup.controllers"), "cpu io\n").unwrap();
        assert!(probe(dir.path()).unwrap_err().contains("memory"));
        fs::write(dir.path().join("cgroup.controllers"), "cpu io memory\n").unwrap();
        probe(dir.path()).unwrap();
    }

    #[test]
    fn lease_dir_is_under_the_leasehold_parent() {
        let config = CgroupConfig {
            root: PathBuf::from("/cg"),
            ..CgroupConfig::default()
        };
        let id = Uuid::from_u128(1);
        assert_eq!(
            config.lease_dir(id),
            PathBuf::from(format!("/cg/leasehold/lh-{id}"))
        );
    }
}
