//! What a lease is given on this node, as a runtime needs it: the devices it
//! may see (a MIG GPU's device the backend made for the lease), a share's
//! VRAM and compute caps, and its part of the host's RAM. Pure functions of
//! the placement and the host, so that what a workload gets is tested
//! without starting one.

use std::path::PathBuf;

use lh_events::{AssignedGpu, StartedMigDevice};
use uuid::Uuid;

use super::{RuntimeError, MILLI_PER_GPU};

/// What the lease was given on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub lease_id: Uuid,
    /// GPU or MIG instance UUIDs (`GPU-…`, `MIG-…`); at least one.
    pub device_uuids: Vec<String>,
    /// VRAM cap of a memory-sliced share of one GPU, MiB.
    pub vram_limit_mib: Option<u64>,
    /// Compute of a share of one GPU, 1..=1000 milli.
    pub compute_milli: Option<u32>,
    /// The lease's share of the node's RAM, bytes; the cgroup and container
    /// memory limits are percentages of it.
    pub memory_share_bytes: Option<u64>,
    /// The lease's share of the node's CPUs, in thousandths of a core: a
    /// container's `--cpus`.
    pub cpu_milli: Option<u64>,
    /// The pipe directory of the MPS daemon that enforces the share
    /// ([`mps`](super::mps)); the workload connects through it as an MPS client.
    pub mps_pipe_dir: Option<PathBuf>,
    /// The user the GPU's MPS server serves, when MPS enforces the share:
    /// the process runtime runs the lease as that user.
    pub mps_server_uid: Option<u32>,
    /// The file the workload's standard output and error go to
    /// ([`lease_log`](super::lease_log)); the agent's own when `None`.
    pub log_file: Option<PathBuf>,
    /// Whose lease it is: a container on its tenant's network joins that
    /// one ([`tenant_network`](super::tenant_network)).
    pub tenant_id: Option<Uuid>,
    /// A gang's rendezvous ([`gang`](super::gang)): part of the lease's own
    /// variables.
    pub gang_env: std::collections::BTreeMap<String, String>,
    /// Set for a gang's member other than the first: what tells its
    /// workload's names apart from the first's where both share a
    /// container engine ([`super::part_mark`]).
    pub part: Option<String>,
    /// A gang member's link to the others, for a container
    /// ([`gang_link`](super::gang_link)).
    pub gang_link: Option<super::gang_link::GangLink>,
}

/// Refuses assignments that would give a workload the wrong devices or
/// limits: no device, a UUID that would split or corrupt the list, a share
/// out of range, a zero limit.
pub fn validate_assignment(assignment: &Assignment) -> Result<(), RuntimeError> {
    let invalid = |why: String| Err(RuntimeError::InvalidAssignment(why));
    if assignment.device_uuids.is_empty() {
        return invalid("no device UUIDs".into());
    }
    for uuid in &assignment.device_uuids {
        let bad_char = |c: char| c == ',' || c == '"' || c == '=' || c.is_whitespace();
        if uuid.is_empty() || uuid.contains(bad_char) {
            return invalid(format!("device UUID {uuid:?}"));
        }
    }
    if let Some(milli) = assignment.compute_milli {
        if !(1..=MILLI_PER_GPU).contains(&milli) {
            return invalid(format!("compute_milli {milli} outside 1..=1000"));
        }
    }
    if assignment.vram_limit_mib == Some(0) {
        return invalid("vram_limit_mib is 0".into());
    }
    if assignment.memory_share_bytes == Some(0) {
        return invalid("memory_share_bytes is 0".into());
    }
    Ok(())
}

/// What a node has to share out between its leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    pub memory_bytes: u64,
    pub gpu_count: u32,
    /// The host's CPUs in thousandths of a core; `None`: no CPU limit.
    pub cpu_milli: Option<u64>,
    /// What the catalogue gives with each whole GPU of the node's model:
    /// a lease never gets more than that, even on a roomier host.
    pub per_gpu: Option<lh_domain::catalog::HostShare>,
}

impl Host {
    /// The lease's RAM: its part of the host's, at most what the catalogue
    /// gives with its GPUs.
    pub fn memory_share(&self, gpus: &[AssignedGpu]) -> Option<u64> {
        let part = memory_share_bytes(self.memory_bytes, self.gpu_count, gpus)?;
        Some(match self.per_gpu {
            Some(per_gpu) => part.min(catalogue_part(per_gpu.memory_bytes, gpus)?),
            None => part,
        })
    }

    /// The lease's CPU in thousandths of a core: its part of the host's, at
    /// most what the catalogue gives with its GPUs, and never under a tenth
    /// of a core (a smaller quota starves even a shell).
    pub fn cpu_share(&self, gpus: &[AssignedGpu]) -> Option<u64> {
        let part = memory_share_bytes(self.cpu_milli?, self.gpu_count, gpus)?;
        let capped = match self.per_gpu {
            Some(per_gpu) => part.min(catalogue_part(per_gpu.cpu_milli, gpus)?),
            None => part,
        };
        Some(capped.max(MIN_CPU_MILLI))
    }
}

/// The least CPU a lease is given, in thousandths of a core.
pub const MIN_CPU_MILLI: u64 = 100;

/// `per_gpu` for the GPUs held: a whole GPU's, or a share's part of it.
fn catalogue_part(per_gpu: u64, gpus: &[AssignedGpu]) -> Option<u64> {
    let held_milli: u64 = gpus
        .iter()
        .map(|g| u64::from(g.milli.unwrap_or(MILLI_PER_GPU)))
        .sum();
    u64::try_from(u128::from(per_gpu) * u128::from(held_milli) / u128::from(MILLI_PER_GPU))
        .ok()
        .filter(|&v| v > 0)
}

/// The host's CPUs, in thousandths of a core.
pub fn host_cpu_milli() -> Option<u64> {
    std::thread::available_parallelism()
        .ok()
        .map(|n| n.get() as u64 * 1000)
}

/// What a lease holds on this node, as the runtime needs it: device UUIDs
/// (for a MIG GPU, the MIG device the backend created for the lease; none
/// made leaves an empty UUID, which the runtime refuses), and a share's
/// VRAM and compute caps.
pub fn assignment(
    lease_id: Uuid,
    gpus: &[AssignedGpu],
    mig_devices: &[StartedMigDevice],
    memory_share_bytes: Option<u64>,
) -> Assignment {
    let device_uuids = gpus
        .iter()
        .map(|g| match &g.mig_instance {
            Some(_) => mig_devices
                .iter()
                .find(|d| d.gpu_index == g.index)
                .map(|d| d.uuid.clone())
                .unwrap_or_default(),
            None => g.uuid.clone(),
        })
        .collect();
    let share = gpus
        .first()
        .filter(|g| g.mig_instance.is_none())
        .and_then(|g| g.milli.zip(g.vram_gb));
    Assignment {
        lease_id,
        device_uuids,
        vram_limit_mib: share.map(|(_, v)| u64::from(v) * 1024),
        compute_milli: share.map(|(m, _)| m),
        memory_share_bytes,
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

/// A lease's part of the host's RAM: the part of the host's GPU compute it
/// holds (a whole GPU 1000 milli, a share or a MIG instance its milli).
/// `None` when there is nothing to divide.
pub fn memory_share_bytes(
    host_memory_bytes: u64,
    host_gpus: u32,
    gpus: &[AssignedGpu],
) -> Option<u64> {
    let held_milli: u64 = gpus
        .iter()
        .map(|g| u64::from(g.milli.unwrap_or(MILLI_PER_GPU)))
        .sum();
    let host_milli = u64::from(host_gpus) * u64::from(MILLI_PER_GPU);
    if host_milli == 0 || held_milli == 0 || host_memory_bytes == 0 {
        return None;
    }
    let share = u128::from(host_memory_bytes) * u128::from(held_milli.min(host_milli))
        / u128::from(host_milli);
    u64::try_from(share).ok().filter(|&b| b > 0)
}

/// `MemTotal` of `/proc/meminfo`, bytes; `None` where it cannot be read.
pub fn host_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&meminfo)
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::MigInstance;

    fn gpu(uuid: &str) -> AssignedGpu {
        AssignedGpu {
            index: 0,
            uuid: uuid.into(),
            milli: None,
            vram_gb: None,
            mig_instance: None,
        }
    }

    #[test]
    fn given_a_host_when_leases_hold_parts_of_its_gpus_then_they_get_that_part_of_its_ram() {
        const GIB: u64 = 1 << 30;
        let whole = [gpu("GPU-a"), gpu("GPU-b")];
        assert_eq!(memory_share_bytes(64 * GIB, 8, &whole), Some(16 * GIB));
        let quarter = [AssignedGpu {
            milli: Some(250),
            ..gpu("GPU-a")
        }];
        assert_eq!(memory_share_bytes(64 * GIB, 2, &quarter), Some(8 * GIB));
        // More than the host (a stale inventory): never more than all of it.
        assert_eq!(memory_share_bytes(64 * GIB, 1, &whole), Some(64 * GIB));
        assert_eq!(memory_share_bytes(64 * GIB, 0, &whole), None);
        assert_eq!(memory_share_bytes(0, 8, &whole), None);
        assert_eq!(memory_share_bytes(64 * GIB, 8, &[]), None);
        assert_eq!(
            parse_mem_total("MemTotal:       16303140 kB\nMemFree: 1 kB\n"),
            Some(16_303_140 * 1024)
        );
        assert_eq!(parse_mem_total("nothing"), None);
    }

    #[test]
    fn a_lease_gets_no_more_of_the_host_than_the_catalogue_gives_with_its_gpus() {
        const GIB: u64 = 1 << 30;
        let host = Host {
            memory_bytes: 2048 * GIB,
            gpu_count: 8,
            cpu_milli: Some(256_000),
            per_gpu: lh_domain::catalog::host_share_per_gpu("A100-40GB"),
        };
        let two = [gpu("GPU-a"), gpu("GPU-b")];
        // The host would give 512 GiB and 64 cores; the catalogue 288 and 24.
        assert_eq!(host.memory_share(&two), Some(288 * GIB));
        assert_eq!(host.cpu_share(&two), Some(24_000));
        // A small host (this machine: 2 cores, 24 GiB) gives its part.
        let small = Host {
            memory_bytes: 24 * GIB,
            cpu_milli: Some(2000),
            ..host
        };
        assert_eq!(small.memory_share(&two), Some(6 * GIB));
        assert_eq!(small.cpu_share(&two), Some(500));
        let sliver = [AssignedGpu {
            milli: Some(10),
            ..gpu("GPU-a")
        }];
        assert_eq!(small.cpu_share(&sliver), Some(MIN_CPU_MILLI));
        let unlimited = Host {
            cpu_milli: None,
            per_gpu: None,
            ..small
        };
        assert_eq!(unlimited.cpu_share(&two), None);
        assert_eq!(unlimited.memory_share(&two), Some(6 * GIB));
    }

    #[test]
    fn assignments_name_devices_and_cap_shares() {
        let l = Uuid::nil();
        let whole = assignment(l, &[gpu("GPU-a"), gpu("GPU-b")], &[], None);
        assert_eq!(whole.device_uuids, ["GPU-a", "GPU-b"]);
        assert_eq!((whole.vram_limit_mib, whole.compute_milli), (None, None));
        let share = assignment(
            l,
            &[AssignedGpu {
                milli: Some(300),
                vram_gb: Some(10),
                ..gpu("GPU-a")
            }],
            &[],
            Some(7),
        );
        assert_eq!(share.memory_share_bytes, Some(7));
        assert_eq!(
            (share.vram_limit_mib, share.compute_milli),
            (Some(10 * 1024), Some(300))
        );
        let on_mig = [AssignedGpu {
            milli: Some(428),
            vram_gb: Some(20),
            mig_instance: Some(MigInstance {
                profile: "3g.20gb".into(),
                start: 4,
            }),
            ..gpu("GPU-a")
        }];
        let made = [StartedMigDevice {
            gpu_index: on_mig[0].index,
            uuid: "MIG-5f0c6e3a-1b2d-4c8e-9a7f-0d1e2f3a4b5c".into(),
        }];
        let mig = assignment(l, &on_mig, &made, None);
        assert_eq!(mig.device_uuids, [made[0].uuid.as_str()]);
        assert_eq!(mig.vram_limit_mib, None, "MIG isolates memory itself");
        // No instance made: nothing a runtime accepts.
        let unmade = assignment(l, &on_mig, &[], None);
        assert!(validate_assignment(&unmade).is_err());
    }
}
