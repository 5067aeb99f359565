//! The MIG instances this agent holds for its leases: created through the
//! backend when a MIG lease starts, destroyed once nothing runs on them,
//! and, after a restart, found again on the GPUs.
//!
//! The agent never switches a GPU's MIG mode (that needs a GPU reset, an
//! operator's action). At a restart, an instance in the slot of a lease
//! the log shows moved away from this node (lost while the agent was down)
//! is the previous agent's to destroy, and is destroyed. Any
//! other instance no lease of this node is placed on is *unowned*: not
//! reused and not destroyed (it may be an operator's), reported (a warning
//! and the `lh_node_mig_unowned_instances` gauge), and told to the
//! scheduler in the node's registration, so that it places no lease over
//! its slices. The agent reads the instances again every MIG period (an
//! operator may make or destroy one at any time) and registers again when
//! two reads in a row agree on a change: an instance between its lease's
//! end and its destruction is seen by one read, not two.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use lh_events::{AssignedGpu, MigInstance, NodeRegistered, StartedMigDevice};
use uuid::Uuid;

use super::backend::{GpuBackend, GpuDevice};

/// A MIG instance the log says a lease holds on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MigPlaced {
    pub(crate) lease_id: Uuid,
    pub(crate) placement: u64,
    pub(crate) gpu: u32,
    pub(crate) profile: String,
    pub(crate) start: u8,
}

impl MigPlaced {
    /// The MIG instances `gpus` (one placement of a lease) ask for.
    pub(crate) fn of(lease_id: Uuid, placement: u64, gpus: &[AssignedGpu]) -> Vec<MigPlaced> {
        gpus.iter()
            .filter_map(|g| {
                let m = g.mig_instance.as_ref()?;
                Some(MigPlaced {
                    lease_id,
                    placement,
                    gpu: g.index,
                    profile: m.profile.clone(),
                    start: m.start,
                })
            })
            .collect()
    }
}

/// An instance on a GPU that no lease placed here holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unowned {
    pub(crate) gpu: u32,
    pub(crate) uuid: String,
    pub(crate) profile: String,
    pub(crate) start: Option<u32>,
}

/// An instance of a lease placed here: the lease, its placement, the device.
pub(crate) type Owned = ((Uuid, u64), StartedMigDevice);

/// The instances on the GPUs after a restart, sorted.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    /// Of leases still placed here: kept for them.
    pub(crate) adopted: Vec<Owned>,
    /// In the slot of a lease moved away from this node: to destroy.
    pub(crate) left_over: Vec<StartedMigDevice>,
    /// Nobody's that the log knows: reported, left alone.
    pub(crate) unowned: Vec<Unowned>,
}

/// Sorts the instances on the GPUs (`inventory`) by the leases the log
/// shows placed here (`placed`) and those moved away from here (`over`),
/// matched by GPU, profile and start; a lease still placed wins a slot.
pub(crate) fn sort_out(inventory: &[GpuDevice], placed: &[MigPlaced], over: &[MigPlaced]) -> Found {
    let mut found = Found::default();
    for gpu in inventory {
        for d in &gpu.mig_devices {
            let here = |p: &&MigPlaced| {
                p.gpu == gpu.index
                    && p.profile == d.profile
                    && d.gpu_instance_start == Some(u32::from(p.start))
            };
            let device = StartedMigDevice {
                gpu_index: gpu.index,
                uuid: d.uuid.clone(),
            };
            if let Some(p) = placed.iter().find(here) {
                found.adopted.push(((p.lease_id, p.placement), device));
            } else if over.iter().any(|p| here(&p)) {
                found.left_over.push(device);
            } else {
                found.unowned.push(Unowned {
                    gpu: gpu.index,
                    uuid: d.uuid.clone(),
                    profile: d.profile.clone(),
                    start: d.gpu_instance_start,
                });
            }
        }
    }
    found
}

/// Most unowned instances told per GPU: no MIG geometry has room for more.
pub(crate) const MAX_UNOWNED_MIG_INSTANCES_PER_GPU: usize = 7;

/// Unowned instances per GPU index, sorted by start.
pub(crate) type UnownedByGpu = BTreeMap<u32, Vec<MigInstance>>;

/// `unowned` as the registration tells it. An instance whose start slice
/// the driver does not give cannot be placed on the GPU's slots, and is
/// only reported.
pub(crate) fn by_gpu(unowned: &[Unowned]) -> UnownedByGpu {
    let mut out = UnownedByGpu::new();
    for u in unowned {
        let Some(start) = u.start.and_then(|s| u8::try_from(s).ok()) else {
            continue;
        };
        out.entry(u.gpu).or_default().push(MigInstance {
            profile: u.profile.clone(),
            start,
        });
    }
    for list in out.values_mut() {
        list.sort_by(|a, b| (a.start, &a.profile).cmp(&(b.start, &b.profile)));
        list.truncate(MAX_UNOWNED_MIG_INSTANCES_PER_GPU);
    }
    out
}

/// The unowned instances `registration` declares, per GPU.
pub(crate) fn declared(registration: &NodeRegistered) -> UnownedByGpu {
    registration
        .gpus
        .iter()
        .filter(|g| !g.unowned_mig_instances.is_empty())
        .map(|g| (g.index, g.unowned_mig_instances.clone()))
        .collect()
}

/// Puts `unowned` into `inventory`'s GPUs in MIG mode (a GPU taken out of
/// it since, by a reset, holds none); whether that changed it.
pub(crate) fn declare(inventory: &mut NodeRegistered, unowned: &UnownedByGpu) -> bool {
    let mut changed = false;
    for g in &mut inventory.gpus {
        let now = match unowned.get(&g.index) {
            Some(list) if g.mig => list.clone(),
            _ => Vec::new(),
        };
        if g.unowned_mig_instances != now {
            g.unowned_mig_instances = now;
            changed = true;
        }
    }
    changed
}

/// The reads of the unowned instances: a change is declared once two reads
/// in a row agree on it.
#[derive(Debug, Default)]
pub(crate) struct UnownedReads {
    last: Option<UnownedByGpu>,
    declared: bool,
    /// UUIDs of instances seen held by a lease (or in the slot of one
    /// moved away), kept until a read no longer shows them: a lease's
    /// instance outlives the lease in the log until its workload has exited
    /// and it is destroyed, which may take a stop's grace period.
    leases: HashSet<String>,
}

impl UnownedReads {
    /// Instances made for a lease, before any read sees them.
    pub(crate) fn made_for_a_lease(&mut self, devices: &[StartedMigDevice]) {
        self.leases.extend(devices.iter().map(|d| d.uuid.clone()));
    }

    /// The unowned instances of one read (`gpus`, sorted out as `found`),
    /// leaving out those seen held by a lease while they still exist.
    pub(crate) fn unowned_in(&mut self, gpus: &[GpuDevice], found: &Found) -> UnownedByGpu {
        let present: HashSet<&str> = gpus
            .iter()
            .flat_map(|g| g.mig_devices.iter().map(|d| d.uuid.as_str()))
            .collect();
        self.leases.retain(|uuid| present.contains(uuid.as_str()));
        let of_leases = found.adopted.iter().map(|(_, d)| d).chain(&found.left_over);
        self.leases.extend(of_leases.map(|d| d.uuid.clone()));
        let unowned: Vec<Unowned> = found
            .unowned
            .iter()
            .filter(|u| !self.leases.contains(&u.uuid))
            .cloned()
            .collect();
        by_gpu(&unowned)
    }

    /// Takes one read; what to declare, when it agrees with the one before.
    pub(crate) fn read(&mut self, now: UnownedByGpu) -> Option<UnownedByGpu> {
        let agreed = self.last.as_ref() == Some(&now);
        self.last = Some(now);
        if !agreed {
            return None;
        }
        self.declared = true;
        self.last.clone()
    }

    /// Some read was declared since the agent started: until then, what
    /// the log last declared stands (a restart must not free the slots of
    /// instances that are still there).
    pub(crate) fn any_declared(&self) -> bool {
        self.declared
    }
}

/// The instances this agent holds, per lease and placement.
pub(crate) struct MigInstances {
    backend: Option<Arc<dyn GpuBackend>>,
    held: HashMap<(Uuid, u64), Vec<StartedMigDevice>>,
    /// One instance operation at a time on the host: a destroy sent before
    /// a create (an ended lease's slices going to the next one) is done
    /// before it.
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl MigInstances {
    pub(crate) fn new(backend: Option<Arc<dyn GpuBackend>>) -> Self {
        Self {
            backend,
            held: HashMap::new(),
            turn: Arc::default(),
        }
    }

    pub(crate) fn held(&self, lease_id: Uuid, placement: u64) -> Vec<StartedMigDevice> {
        self.held
            .get(&(lease_id, placement))
            .cloned()
            .unwrap_or_default()
    }

    /// Whether `gpus` ask for instances that are not held yet.
    pub(crate) fn to_create(&self, lease_id: Uuid, placement: u64, gpus: &[AssignedGpu]) -> bool {
        gpus.iter().any(|g| g.mig_instance.is_some())
            && !self.held.contains_key(&(lease_id, placement))
    }

    pub(crate) fn keep(&mut self, lease_id: Uuid, placement: u64, devices: Vec<StartedMigDevice>) {
        if !devices.is_empty() {
            self.held.insert((lease_id, placement), devices);
        }
    }

    /// Destroys the instances of `lease_id`'s placements for which
    /// `in_use` is false.
    pub(crate) fn release(&mut self, lease_id: Uuid, in_use: impl Fn(u64) -> bool) {
        let gone: Vec<(Uuid, u64)> = self
            .held
            .keys()
            .filter(|(l, p)| *l == lease_id && !in_use(*p))
            .copied()
            .collect();
        for key in gone {
            if let Some(devices) = self.held.remove(&key) {
                tracing::info!(lease = %lease_id, placement = key.1, instances = devices.len(), "MIG instances released");
                self.destroy(devices);
            }
        }
    }

    /// Destroys `devices` in the background.
    pub(crate) fn destroy(&self, devices: Vec<StartedMigDevice>) {
        let Some(backend) = self.backend.clone() else {
            return;
        };
        let turn = self.turn.clone();
        tokio::spawn(async move {
            let _turn = turn.lock().await;
            let _ =
                tokio::task::spawn_blocking(move || destroy_all(backend.as_ref(), &devices)).await;
        });
    }

    /// Creates the instances `gpus` ask for; all or none (those made
    /// before a failure are destroyed). The error says why, for the lease's
    /// end.
    pub(crate) fn creator(
        &self,
        gpus: &[AssignedGpu],
    ) -> impl std::future::Future<Output = Result<Vec<StartedMigDevice>, String>> + Send + 'static
    {
        let backend = self.backend.clone();
        let turn = self.turn.clone();
        let wanted: Vec<(u32, String, u32)> = gpus
            .iter()
            .filter_map(|g| {
                let m = g.mig_instance.as_ref()?;
                Some((g.index, m.profile.clone(), u32::from(m.start)))
            })
            .collect();
        async move {
            let backend = backend.ok_or("no GPU backend to create MIG instances with")?;
            let _turn = turn.lock().await;
            tokio::task::spawn_blocking(move || create_all(backend.as_ref(), &wanted))
                .await
                .map_err(|e| format!("MIG instance creation did not finish: {e}"))?
        }
    }

    /// After a restart: keeps the instances of leases placed here,
    /// destroys those of leases moved away, and reports the rest. Returns how many were adopted.
    pub(crate) async fn adopt(&mut self, placed: Vec<MigPlaced>, over: Vec<MigPlaced>) -> usize {
        let Some(backend) = self.backend.clone() else {
            return 0;
        };
        let inventory = match tokio::task::spawn_blocking(move || backend.inventory()).await {
            Ok(Ok(inventory)) => inventory,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot list the MIG instances on the GPUs");
                return 0;
            }
            Err(e) => {
                tracing::warn!(error = %e, "listing the MIG instances did not finish");
                return 0;
            }
        };
        let Found {
            adopted,
            left_over,
            unowned,
        } = sort_out(&inventory, &placed, &over);
        let count = adopted.len();
        for d in &left_over {
            tracing::warn!(gpu = d.gpu_index, uuid = %d.uuid,
                "a MIG instance in the slot of a lease moved away from this node is destroyed");
        }
        self.destroy(left_over);
        for (key, device) in adopted {
            tracing::info!(lease = %key.0, gpu = device.gpu_index, uuid = %device.uuid, "MIG instance of a lease placed here adopted");
            self.held.entry(key).or_default().push(device);
        }
        for u in &unowned {
            tracing::warn!(gpu = u.gpu, uuid = %u.uuid, profile = %u.profile, start = ?u.start,
                "a MIG instance that no lease placed here holds: left as it is, not reused");
        }
        metrics::gauge!("lh_node_mig_unowned_instances").set(unowned.len() as f64);
        count
    }
}

fn create_all(
    backend: &dyn GpuBackend,
    wanted: &[(u32, String, u32)],
) -> Result<Vec<StartedMigDevice>, String> {
    let mut made = Vec::new();
    for (gpu, profile, start) in wanted {
        match backend.create_mig_instance(*gpu, profile, *start) {
            Ok(d) => {
                tracing::info!(gpu, profile = %profile, start, uuid = %d.uuid, "MIG instance created");
                made.push(StartedMigDevice {
                    gpu_index: *gpu,
                    uuid: d.uuid,
                });
            }
            Err(e) => {
                destroy_all(backend, &made);
                metrics::counter!("lh_node_mig_create_failures_total").increment(1);
                return Err(format!("cannot create the MIG instance: {e}"));
            }
        }
    }
    Ok(made)
}

fn destroy_all(backend: &dyn GpuBackend, devices: &[StartedMigDevice]) {
    for d in devices {
        match backend.destroy_mig_instance(d.gpu_index, &d.uuid) {
            Ok(()) => tracing::info!(gpu = d.gpu_index, uuid = %d.uuid, "MIG instance destroyed"),
            Err(e) => {
                tracing::warn!(gpu = d.gpu_index, uuid = %d.uuid, error = %e, "cannot destroy the MIG instance")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::backend::MigDevice;

    fn gpu(index: u32, devices: &[(&str, &str, u32)]) -> GpuDevice {
        GpuDevice {
            index,
            uuid: format!("GPU-{index}"),
            model: "A100-40GB".into(),
            vram_mib: 40 * 1024,
            mig_enabled: true,
            mig_devices: devices
                .iter()
                .map(|(uuid, profile, start)| MigDevice {
                    uuid: uuid.to_string(),
                    profile: profile.to_string(),
                    gpu_instance_start: Some(*start),
                })
                .collect(),
            nvlink_peers: Vec::new(),
            numa_node: None,
        }
    }

    #[test]
    fn a_change_is_declared_once_two_reads_agree() {
        let one = |start| {
            UnownedByGpu::from([(
                0,
                vec![MigInstance {
                    profile: "1g.5gb".into(),
                    start,
                }],
            )])
        };
        let mut reads = UnownedReads::default();
        assert!(!reads.any_declared());
        assert_eq!(reads.read(one(0)), None);
        assert_eq!(reads.read(one(0)), Some(one(0)));
        assert!(reads.any_declared());
        // An instance seen once (its lease ended, its destruction under
        // way) is not declared; gone on the next read, nothing changes.
        let mut both = one(0);
        both.get_mut(&0).unwrap().extend(one(6)[&0].clone());
        assert_eq!(reads.read(both.clone()), None);
        assert_eq!(reads.read(one(0)), None);
        assert_eq!(reads.read(one(0)), Some(one(0)));
        assert_eq!(reads.read(UnownedByGpu::new()), None);
        assert_eq!(reads.read(UnownedByGpu::new()), Some(UnownedByGpu::new()));
    }

    #[test]
    fn a_lease_instance_is_never_unowned_until_it_is_destroyed() {
        let mut reads = UnownedReads::default();
        let a = Uuid::from_u128(1);
        let placed = |lease| MigPlaced {
            lease_id: lease,
            placement: 7,
            gpu: 0,
            profile: "3g.20gb".into(),
            start: 4,
        };
        let both = [gpu(0, &[("MIG-a", "3g.20gb", 4), ("MIG-x", "1g.5gb", 0)])];
        let found = sort_out(&both, &[placed(a)], &[]);
        let unowned = reads.unowned_in(&both, &found);
        assert_eq!(unowned[&0].len(), 1);
        assert_eq!(unowned[&0][0].start, 0);
        // Lease a ended; its instance waits for its workload's exit.
        let found = sort_out(&both, &[], &[]);
        assert_eq!(found.unowned.len(), 2);
        assert_eq!(reads.unowned_in(&both, &found), unowned);
        // Destroyed: a new instance in its slot is nobody's, unless it was
        // made for a lease.
        let again = [gpu(0, &[("MIG-b", "3g.20gb", 4), ("MIG-x", "1g.5gb", 0)])];
        let found = sort_out(&again, &[], &[]);
        assert_eq!(reads.unowned_in(&again, &found)[&0].len(), 2);
        reads.made_for_a_lease(&[StartedMigDevice {
            gpu_index: 0,
            uuid: "MIG-b".into(),
        }]);
        assert_eq!(reads.unowned_in(&again, &found), unowned);
    }

    #[test]
    fn unowned_instances_go_into_the_registration_by_gpu() {
        let u = |gpu, uuid: &str, profile: &str, start| Unowned {
            gpu,
            uuid: uuid.into(),
            profile: profile.into(),
            start,
        };
        let found = [
            u(1, "MIG-c", "1g.5gb", Some(6)),
            u(1, "MIG-b", "3g.20gb", Some(0)),
            u(0, "MIG-a", "2g.10gb", None),
        ];
        let unowned = by_gpu(&found);
        assert_eq!(unowned.keys().collect::<Vec<_>>(), [&1]);
        let starts: Vec<u8> = unowned[&1].iter().map(|m| m.start).collect();
        assert_eq!(starts, [0, 6]);
        let mut inventory = lh_events::fixtures::node("n", "z", 2, "A100-40GB", 40);
        assert!(!declare(&mut inventory, &unowned), "no GPU in MIG mode");
        inventory.gpus.iter_mut().for_each(|g| g.mig = true);
        assert!(declare(&mut inventory, &unowned));
        assert!(!declare(&mut inventory, &unowned));
        assert!(inventory.gpus[0].unowned_mig_instances.is_empty());
        assert_eq!(declared(&inventory), unowned);
        assert!(declare(&mut inventory, &UnownedByGpu::new()));
        assert!(declared(&inventory).is_empty());
    }

    #[test]
    fn instances_are_adopted_destroyed_or_reported_by_the_log() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let placed = vec![
            MigPlaced {
                lease_id: a,
                placement: 7,
                gpu: 0,
                profile: "3g.20gb".into(),
                start: 4,
            },
            MigPlaced {
                lease_id: b,
                placement: 9,
                gpu: 1,
                profile: "1g.5gb".into(),
                start: 6,
            },
        ];
        let inventory = [
            gpu(0, &[("MIG-a", "3g.20gb", 4), ("MIG-x", "3g.20gb", 0)]),
            // b's profile at another slot: not b's.
            gpu(1, &[("MIG-y", "1g.5gb", 5)]),
        ];
        // A lease moved away held 3g.20gb at 0 on GPU 0, and 3g.20gb at 4
        // before a took it.
        let over = |start| MigPlaced {
            lease_id: Uuid::from_u128(3),
            placement: 2,
            gpu: 0,
            profile: "3g.20gb".into(),
            start,
        };
        let device = |gpu_index, uuid: &str| StartedMigDevice {
            gpu_index,
            uuid: uuid.into(),
        };
        let found = sort_out(&inventory, &placed, &[over(0), over(4)]);
        assert_eq!(found.adopted, [((a, 7), device(0, "MIG-a"))]);
        assert_eq!(found.left_over, [device(0, "MIG-x")]);
        let uuids: Vec<&str> = found.unowned.iter().map(|u| u.uuid.as_str()).collect();
        assert_eq!(uuids, ["MIG-y"]);
        // Without the log's word, neither is ours to destroy.
        let found = sort_out(&inventory, &placed, &[]);
        assert!(found.left_over.is_empty());
        let uuids: Vec<&str> = found.unowned.iter().map(|u| u.uuid.as_str()).collect();
        assert_eq!(uuids, ["MIG-x", "MIG-y"]);
    }
}
