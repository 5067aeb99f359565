//! The parent cgroup of a lease's container, on an engine that manages
//! cgroups as plain directories (`--cgroup-manager cgroupfs`).
//!
//! The engine removes a container's own cgroup the moment it exits, and
//! with it the only record that the kernel's OOM killer ended it (podman
//! 4.3 on cgroup v1 does not report it either: `State.OOMKilled` stays
//! false, measured). So the agent holds the lease's memory limit itself, on
//! a parent it makes, `leasehold/lh-<lease>`, given to the engine as
//! `--cgroup-parent`: the kernel charges the container to it, kills inside
//! it when the limit is reached, and the parent is still there to be read
//! after the exit. The agent then removes it.
//!
//! cgroup v2: `memory.max`, `memory.swap.max` and `memory.events`'
//! `oom_kill`. cgroup v1: `memory.limit_in_bytes`, `memory.memsw.limit_in_bytes`
//! where swap is accounted; as the kernel here leaves `oom_control`'s
//! `oom_kill` at 0 after a kill on the parent's limit, and its `failcnt`s
//! too once the swap limit is set (both measured), a workload killed by
//! SIGKILL whose cgroup's peak reached its limit counts as OOM-killed.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cgroup::PARENT_DIR;

/// How near its limit a v1 cgroup's peak must have come to count as
/// having reached it: a few pages.
const AT_LIMIT_SLACK_BYTES: u64 = 64 * 1024;
/// Where the cgroup hierarchies are mounted.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// Removing a parent waits for the engine to remove what it made inside:
/// this many tries, [`REMOVE_RETRY`] apart.
const REMOVE_ATTEMPTS: u32 = 100;
const REMOVE_RETRY: Duration = Duration::from_millis(50);

/// Which cgroup version holds the memory controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryHierarchy {
    /// `<mount>/memory`, with the other controllers beside it.
    V1 { mount: PathBuf },
    /// `<mount>`, one tree for every controller.
    V2 { mount: PathBuf },
}

/// The lease parents of the containers of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCgroups {
    pub hierarchy: MemoryHierarchy,
}

impl ContainerCgroups {
    /// The memory controller under `mount` (`/sys/fs/cgroup`), or why
    /// there is none this agent may write to.
    pub fn detect(mount: &Path) -> Result<Self, String> {
        let v2 = mount.join("cgroup.controllers");
        let hierarchy = if fs::read_to_string(&v2)
            .is_ok_and(|c| c.split_whitespace().any(|name| name == "memory"))
        {
            MemoryHierarchy::V2 {
                mount: mount.to_path_buf(),
            }
        } else if mount.join("memory/memory.limit_in_bytes").exists() {
            MemoryHierarchy::V1 {
                mount: mount.to_path_buf(),
            }
        } else {
            return Err(format!(
                "no memory controller under {} (neither cgroup v2 nor v1)",
                mount.display()
            ));
        };
        let cgroups = ContainerCgroups { hierarchy };
        let parent = cgroups.memory_dir_of_parent();
        fs::create_dir_all(&parent)
            .map_err(|e| format!("cannot make {}: {e}", parent.display()))?;
        if let MemoryHierarchy::V2 { mount } = &cgroups.hierarchy {
            // The lease parents under it need the memory controller.
            let _ = fs::write(mount.join("cgroup.subtree_control"), "+memory");
            let _ = fs::write(parent.join("cgroup.subtree_control"), "+memory +pids +cpu");
        }
        Ok(cgroups)
    }

    fn memory_dir_of_parent(&self) -> PathBuf {
        match &self.hierarchy {
            MemoryHierarchy::V1 { mount } => mount.join("memory").join(PARENT_DIR),
            MemoryHierarchy::V2 { mount } => mount.join(PARENT_DIR),
        }
    }

    /// `/leasehold/<mark>`: what the engine is given as `--cgroup-parent`
    /// for the container of that mark (`lh-<lease>`, or a gang's part's:
    /// [`super::part_mark`]).
    pub fn parent_arg(mark: &str) -> String {
        format!("/{PARENT_DIR}/{mark}")
    }

    /// The container's parent in the memory hierarchy.
    pub fn memory_dir(&self, mark: &str) -> PathBuf {
        self.memory_dir_of_parent().join(mark)
    }

    /// Makes the container's parent with `limit_bytes` as its memory limit,
    /// swap included where it is accounted.
    pub fn prepare(&self, mark: &str, limit_bytes: u64) -> io::Result<String> {
        let dir = self.memory_dir(mark);
        fs::create_dir_all(&dir)?;
        let limit = limit_bytes.to_string();
        match &self.hierarchy {
            MemoryHierarchy::V1 { .. } => {
                fs::write(dir.join("memory.limit_in_bytes"), &limit)?;
                let memsw = dir.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    fs::write(memsw, &limit)?;
                }
            }
            MemoryHierarchy::V2 { .. } => {
                fs::write(dir.join("memory.max"), &limit)?;
                let swap = dir.join("memory.swap.max");
                if swap.exists() {
                    fs::write(swap, "0")?;
                }
            }
        }
        Ok(Self::parent_arg(mark))
    }

    /// Removes the lease's parent made by [`ContainerCgroups::prepare`]
    /// for a container that never started (nothing in it yet).
    pub fn remove_unused(&self, mark: &str) {
        let _ = fs::remove_dir(self.memory_dir(mark));
    }

    /// Whether the kernel's OOM killer ended the lease's workload, which
    /// exited with `killed` (SIGKILL) or not.
    pub fn oom_killed(&self, mark: &str, killed: bool) -> bool {
        let dir = self.memory_dir(mark);
        let counter = |file: &str, key: &str| -> u64 {
            fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|text| {
                    text.lines().find_map(|line| {
                        let (name, value) = line.split_once(' ')?;
                        (name == key).then(|| value.trim().parse().ok()).flatten()
                    })
                })
                .unwrap_or(0)
        };
        match &self.hierarchy {
            MemoryHierarchy::V2 { .. } => counter("memory.events", "oom_kill") > 0,
            MemoryHierarchy::V1 { .. } => {
                let number = |file: &str| -> u64 {
                    fs::read_to_string(dir.join(file))
                        .ok()
                        .and_then(|t| t.trim().parse().ok())
                        .unwrap_or(0)
                };
                let reached = |peak: &str, limit: &str| {
                    let limit = number(limit);
                    limit > 0 && number(peak).saturating_add(AT_LIMIT_SLACK_BYTES) >= limit
                };
                counter("memory.oom_control", "oom_kill") > 0
                    || (killed
                        && (number("memory.failcnt") > 0
                            || number("memory.memsw.failcnt") > 0
                            || reached("memory.max_usage_in_bytes", "memory.limit_in_bytes")
                            || reached(
                                "memory.memsw.max_usage_in_bytes",
                                "memory.memsw.limit_in_bytes",
                            )))
            }
        }
    }

    /// Removes the lease's parent in every hierarchy, and what the engine
    /// left in it (empty cgroups only: the kernel refuses the others).
    pub async fn remove(&self, mark: &str) {
        let dirs: Vec<PathBuf> = match &self.hierarchy {
            MemoryHierarchy::V2 { mount } => vec![mount.join(PARENT_DIR).join(mark)],
            MemoryHierarchy::V1 { mount } => fs::read_dir(mount)
                .map(|entries| {
                    entries
                        .flatten()
                        .map(|e| e.path().join(PARENT_DIR).join(mark))
                        .filter(|p| p.is_dir())
                        .collect()
                })
                .unwrap_or_default(),
        };
        for dir in dirs {
            remove_tree(&dir).await;
        }
    }
}

/// Removes a cgroup and the cgroups under it, deepest first, retrying
/// while the last processes leave.
async fn remove_tree(dir: &Path) {
    for attempt in 0..REMOVE_ATTEMPTS {
        if remove_once(dir).is_ok() || !dir.exists() {
            return;
        }
        if attempt + 1 < REMOVE_ATTEMPTS {
            tokio::time::sleep(REMOVE_RETRY).await;
        }
    }
    tracing::warn!(cgroup = %dir.display(), "cannot remove the container's parent cgroup");
}

fn remove_once(dir: &Path) -> io::Result<()> {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_once(&entry.path())?;
            }
        }
    }
    fs::remove_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn the_parent_is_named_by_the_lease() {
        assert_eq!(
            ContainerCgroups::parent_arg(&crate::workload::mark(Uuid::from_u128(1))),
            format!("/leasehold/lh-{}", Uuid::from_u128(1))
        );
    }

    #[test]
    fn oom_reads_the_counters_of_each_version() {
        let dir = tempfile::tempdir().unwrap();
        let lease = crate::workload::mark(Uuid::from_u128(2));
        let lease = lease.as_str();
        let v2 = ContainerCgroups {
            hierarchy: MemoryHierarchy::V2 {
                mount: dir.path().to_path_buf(),
            },
        };
        let d = v2.memory_dir(lease);
        fs::create_dir_all(&d).unwrap();
        fs::write(
            d.join("memory.events"),
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n",
        )
        .unwrap();
        assert!(!v2.oom_killed(lease, true));
        fs::write(d.join("memory.events"), "low 0\nmax 3\noom 1\noom_kill 1\n").unwrap();
        assert!(v2.oom_killed(lease, false));

        let v1 = ContainerCgroups {
            hierarchy: MemoryHierarchy::V1 {
                mount: dir.path().to_path_buf(),
            },
        };
        let d = v1.memory_dir(lease);
        fs::create_dir_all(&d).unwrap();
        fs::write(
            d.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
        )
        .unwrap();
        fs::write(d.join("memory.failcnt"), "0\n").unwrap();
        assert!(!v1.oom_killed(lease, true));
        fs::write(d.join("memory.failcnt"), "41855\n").unwrap();
        assert!(v1.oom_killed(lease, true), "killed at the limit");
        assert!(
            !v1.oom_killed(lease, false),
            "at the limit, but exited itself"
        );
    }
}
