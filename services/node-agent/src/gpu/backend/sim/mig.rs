//! The MIG instances of a simulated node's GPUs in MIG mode.
//!
//! They follow NVIDIA's placement rules (the geometry of `lh_placement`'s
//! MIG tables): an instance that would overlap another, start at a slot
//! its profile does not allow, or sit on a GPU not in MIG mode is refused,
//! as the driver refuses it. Instances outlive the agent on a real GPU, so
//! here they are kept in a file when the backend is given one: an agent
//! started again on the same node finds the instances the last one left.
//! The file is the GPU: it is read again before every look and change, so
//! an instance another backend of the node made or destroyed (an operator's
//! `nvidia-smi`, in a test) is seen, as on a real GPU.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lh_domain::catalog::mig_geometry;
use lh_placement::mig::{Geometry, Instance, MigLayout};

use super::super::{BackendError, MigDevice};

/// Most MIG instances the file of one node may list (7 per GPU on the
/// largest geometry, for at most this many GPUs).
const MAX_SIM_MIG_INSTANCES: usize = 7 * 64;

/// The instances of every MIG-mode GPU of one simulated node.
#[derive(Debug)]
pub(super) struct SimMig {
    geometry: Option<&'static Geometry>,
    mig_gpus: Vec<u32>,
    /// Per GPU index, its instances in creation order.
    instances: BTreeMap<u32, Vec<MigDevice>>,
    file: Option<PathBuf>,
}

impl SimMig {
    pub(super) fn new(model: &str, mig_gpus: &[u32], file: Option<PathBuf>) -> Self {
        let instances = file.as_deref().map(load).unwrap_or_default();
        Self {
            geometry: mig_geometry(model).ok(),
            mig_gpus: mig_gpus.to_vec(),
            instances,
            file,
        }
    }

    pub(super) fn devices(&self, gpu: u32) -> Vec<MigDevice> {
        self.instances.get(&gpu).cloned().unwrap_or_default()
    }

    /// Reads the instances again from the file, when there is one.
    pub(super) fn reload(&mut self) {
        if let Some(path) = &self.file {
            self.instances = load(path);
        }
    }

    pub(super) fn create(
        &mut self,
        gpu: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigDevice, BackendError> {
        let refuse = |why: String| BackendError::Mig { gpu, why };
        self.reload();
        if !self.mig_gpus.contains(&gpu) {
            return Err(refuse("the GPU is not in MIG mode".into()));
        }
        let geometry = self
            .geometry
            .ok_or_else(|| refuse("the GPU model has no MIG mode".into()))?;
        let start = u8::try_from(start).map_err(|_| refuse(format!("no slot {start}")))?;
        let existing = self.devices(gpu);
        let mut layout = self.layout(geometry, &existing).map_err(refuse)?;
        let uuid = format!("MIG-{}", uuid::Uuid::new_v4());
        lh_placement::mig::place_at(&mut layout, profile, start, uuid.clone())
            .map_err(|e| refuse(format!("{profile} at slot {start}: {e}")))?;
        let device = MigDevice {
            uuid,
            profile: profile.to_string(),
            gpu_instance_start: Some(u32::from(start)),
        };
        self.instances.entry(gpu).or_default().push(device.clone());
        self.save();
        Ok(device)
    }

    pub(super) fn destroy(&mut self, gpu: u32, uuid: &str) {
        self.reload();
        if let Some(list) = self.instances.get_mut(&gpu) {
            list.retain(|d| d.uuid != uuid);
        }
        self.save();
    }

    /// The GPU's instances as a layout, each held by its UUID, so that a
    /// new one is checked against NVIDIA's rules.
    fn layout(
        &self,
        geometry: &'static Geometry,
        existing: &[MigDevice],
    ) -> Result<MigLayout<String>, String> {
        let instances = existing
            .iter()
            .map(|d| {
                let profile = geometry
                    .profile(&d.profile)
                    .ok_or_else(|| format!("holds an unknown profile {}", d.profile))?;
                Ok(Instance {
                    profile,
                    start: d.gpu_instance_start.unwrap_or_default() as u8,
                    lease: Some(d.uuid.clone()),
                    persistent: false,
                    unowned: false,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        MigLayout::from_instances(geometry, instances).map_err(|e| e.to_string())
    }

    fn save(&self) {
        let Some(path) = &self.file else {
            return;
        };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let text = serde_json::to_vec(&self.instances).map_err(std::io::Error::other)?;
            // Several backends of one node may write at once.
            let tmp = path.with_extension(format!("{}.tmp", uuid::Uuid::new_v4().simple()));
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::warn!(file = %path.display(), error = %e, "cannot keep the simulated MIG instances");
        }
    }
}

fn load(path: &Path) -> BTreeMap<u32, Vec<MigDevice>> {
    let Ok(text) = std::fs::read(path) else {
        return BTreeMap::new();
    };
    match serde_json::from_slice::<BTreeMap<u32, Vec<MigDevice>>>(&text) {
        Ok(m) if m.values().map(Vec::len).sum::<usize>() <= MAX_SIM_MIG_INSTANCES => m,
        Ok(_) => {
            tracing::warn!(file = %path.display(), "too many simulated MIG instances; starting with none");
            BTreeMap::new()
        }
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "unreadable simulated MIG instances; starting with none");
            BTreeMap::new()
        }
    }
}

/// Where the simulated MIG instances of `node_id` in `fleet_file` are kept:
/// outside the repository, one file per fleet file and node, so parallel
/// test stacks (each with a fleet file of its own) never share instances.
pub(super) fn state_file(fleet_file: &Path, node_id: &str) -> PathBuf {
    let fleet = std::fs::canonicalize(fleet_file).unwrap_or_else(|_| fleet_file.to_path_buf());
    let key = lh_events::derived_id(&["sim-mig", &fleet.display().to_string(), node_id]);
    std::env::temp_dir()
        .join("lh-sim-mig")
        .join(format!("{key}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100(file: Option<PathBuf>) -> SimMig {
        SimMig::new("A100-40GB", &[0], file)
    }

    #[test]
    fn instances_follow_the_slot_rules() {
        let mut m = a100(None);
        let a = m.create(0, "3g.20gb", 4).unwrap();
        assert!(a.uuid.starts_with("MIG-"), "{a:?}");
        assert_eq!(a.gpu_instance_start, Some(4));
        // Overlapping slices, a start the profile does not allow, a
        // profile of another model, a GPU outside MIG mode: refused.
        for (gpu, profile, start) in [
            (0, "1g.5gb", 5),
            (0, "7g.40gb", 0),
            (0, "2g.10gb", 1),
            (0, "1g.10gb", 0),
            (1, "1g.5gb", 0),
        ] {
            let e = m.create(gpu, profile, start).unwrap_err();
            assert!(matches!(e, BackendError::Mig { .. }), "{e}");
        }
        let b = m.create(0, "3g.20gb", 0).unwrap();
        assert_eq!(m.devices(0), [a.clone(), b.clone()]);
        m.destroy(0, &a.uuid);
        assert_eq!(m.devices(0), [b]);
        // Its slices are free again.
        let c = m.create(0, "1g.5gb", 5).unwrap();
        assert_ne!(c.uuid, a.uuid);
        assert_eq!(m.devices(0).len(), 2);
    }

    #[test]
    fn instances_outlive_the_backend_in_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mig.json");
        let mut m = a100(Some(file.clone()));
        let a = m.create(0, "2g.10gb", 2).unwrap();
        let again = a100(Some(file.clone()));
        assert_eq!(again.devices(0), std::slice::from_ref(&a));
        m.destroy(0, &a.uuid);
        assert!(a100(Some(file.clone())).devices(0).is_empty());
    }

    #[test]
    fn a_change_made_through_another_backend_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mig.json");
        let mut agent = a100(Some(file.clone()));
        let mut operator = a100(Some(file));
        let by_hand = operator.create(0, "1g.5gb", 0).unwrap();
        agent.reload();
        assert_eq!(agent.devices(0), std::slice::from_ref(&by_hand));
        // Its slot is taken for the agent too.
        assert!(agent.create(0, "4g.20gb", 0).is_err());
        let mine = agent.create(0, "3g.20gb", 4).unwrap();
        operator.destroy(0, &by_hand.uuid);
        agent.reload();
        assert_eq!(agent.devices(0), [mine]);
    }
}
