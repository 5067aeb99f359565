//! The simulated fleet file (`dev/fleet.toml`): nodes and their GPUs.

use std::path::{Path, PathBuf};

use lh_events::{GpuInfo, GpuSharing, Isolation, NodeEnrolled, NodeRegistered};
use serde::Deserialize;

use super::script::{FaultScript, FaultScriptError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    pub node: Vec<SimNode>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimNode {
    pub id: String,
    pub zone: String,
    pub hostname: String,
    pub gpu_model: String,
    pub gpu_count: u32,
    pub vram_gb: u32,
    /// Indices of the GPUs in MIG mode (they take MIG leases only).
    #[serde(default)]
    pub mig_gpus: Vec<u32>,
    /// A fault script for the simulated backend (`docs/gpu-backends.md`),
    /// relative to the fleet file. Without one the node stays healthy.
    #[serde(default)]
    pub faults: Option<PathBuf>,
    /// Utilisation a simulated GPU reads while a lease holds it (percent,
    /// default 70); a fault script's `utilization` overrides it.
    #[serde(default)]
    pub busy_utilization_pct: Option<u32>,
    /// The interconnect label it declares (`NodeRegistered::fabric`).
    #[serde(default)]
    pub fabric: Option<String>,
    /// What the simulated node declares it isolates workloads with
    /// (`none`, `cgroup`, `container`); none when absent. Only the `sim`
    /// runtime declares it: a real runtime declares what it does.
    #[serde(default)]
    pub isolation: Isolation,
    /// What the simulated node declares enforces GPU shares (`mig`,
    /// `hami-core`, `none`); none when absent, as for [`SimNode::isolation`].
    #[serde(default)]
    pub gpu_sharing: GpuSharing,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetFileError {
    #[error("cannot read fleet file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("fleet file {path} is invalid: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
    #[error("node {node:?} in fleet file {path}: {source}")]
    Faults {
        node: String,
        path: String,
        source: Box<FaultScriptError>,
    },
    #[error("node {node:?} in fleet file {path}: {why}")]
    Invalid {
        node: String,
        path: String,
        why: String,
    },
    #[error("node {node:?} is not in fleet file {path} (it has: {known})")]
    UnknownNode {
        node: String,
        path: String,
        known: String,
    },
}

impl FleetFile {
    pub fn load(path: &Path) -> Result<Self, FleetFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| FleetFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let file: FleetFile = toml::from_str(&text).map_err(|source| FleetFileError::Parse {
            path: path.display().to_string(),
            source,
        })?;
        for n in &file.node {
            n.check().map_err(|why| FleetFileError::Invalid {
                node: n.id.clone(),
                path: path.display().to_string(),
                why,
            })?;
            // A bad fault script fails the start, not the first fault.
            n.fault_script(path)
                .map_err(|source| FleetFileError::Faults {
                    node: n.id.clone(),
                    path: path.display().to_string(),
                    source: Box::new(source),
                })?;
        }
        Ok(file)
    }

    pub fn node(&self, node_id: &str, path: &Path) -> Result<&SimNode, FleetFileError> {
        self.node
            .iter()
            .find(|n| n.id == node_id)
            .ok_or_else(|| FleetFileError::UnknownNode {
                node: node_id.to_string(),
                path: path.display().to_string(),
                known: self
                    .node
                    .iter()
                    .map(|n| n.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

impl SimNode {
    pub fn busy_utilization_pct(&self) -> u32 {
        self.busy_utilization_pct.unwrap_or(70)
    }

    /// What an operator enrolls this simulated node for: what it declares,
    /// no more (`lh node enroll`, `make up`).
    pub fn enrollment(&self) -> NodeEnrolled {
        let mut gpu_sharing = Vec::new();
        if !self.mig_gpus.is_empty() {
            gpu_sharing.push(GpuSharing::Mig);
        }
        if !self.gpu_sharing.is_none() && !gpu_sharing.contains(&self.gpu_sharing) {
            gpu_sharing.push(self.gpu_sharing);
        }
        NodeEnrolled {
            node_id: self.id.clone(),
            zone: self.zone.clone(),
            max_gpus: self.gpu_count,
            gpu_models: vec![self.gpu_model.clone()],
            max_isolation: self.isolation,
            gpu_sharing,
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.busy_utilization_pct.is_some_and(|p| p > 100) {
            return Err("busy_utilization_pct must be within 0..=100".into());
        }
        if let Some(fabric) = self
            .fabric
            .as_deref()
            .filter(|f| !lh_events::fabric_label_is_valid(f))
        {
            return Err(format!(
                "fabric {fabric:?} is no label: 1 to {} of ASCII letters, digits, '.', '_' and '-'",
                lh_events::MAX_FABRIC_LABEL_BYTES
            ));
        }
        // The node offers what tenants can ask for, so its GPUs are
        // described by the catalogue the gateway and the scheduler check
        // against.
        match lh_domain::catalog::vram_gb(&self.gpu_model) {
            None => {
                let known: Vec<_> = lh_domain::catalog::model_names().collect();
                return Err(format!(
                    "gpu_model {} is not in the GPU catalogue ({})",
                    self.gpu_model,
                    known.join(", ")
                ));
            }
            Some(vram_gb) if vram_gb != self.vram_gb => {
                return Err(format!(
                    "vram_gb is {} but the catalogue gives {} {vram_gb} GB",
                    self.vram_gb, self.gpu_model
                ));
            }
            Some(_) => {}
        }
        if self.mig_gpus.is_empty() {
            return Ok(());
        }
        if let Err(why) = lh_domain::catalog::mig_geometry(&self.gpu_model) {
            return Err(format!("mig_gpus given but {why}"));
        }
        match self.mig_gpus.iter().find(|&&i| i >= self.gpu_count) {
            Some(i) => Err(format!(
                "mig_gpus names GPU {i} but the node has {} GPUs",
                self.gpu_count
            )),
            None => Ok(()),
        }
    }

    /// The node's fault script, if it names one; a relative path is taken
    /// from the fleet file's directory.
    pub fn fault_script(&self, fleet_file: &Path) -> Result<Option<FaultScript>, FaultScriptError> {
        let Some(faults) = &self.faults else {
            return Ok(None);
        };
        let path = fleet_file
            .parent()
            .map_or_else(|| faults.clone(), |dir| dir.join(faults));
        let script = FaultScript::load(&path)?;
        script.check_gpus(self.gpu_count, &path.display().to_string())?;
        Ok(Some(script))
    }

    /// The inventory a real host would report; GPU UUIDs are stable per
    /// (node, index) so a restart registers the same devices.
    pub fn inventory(&self) -> NodeRegistered {
        NodeRegistered {
            node_id: self.id.clone(),
            zone: self.zone.clone(),
            hostname: self.hostname.clone(),
            gpus: (0..self.gpu_count)
                .map(|index| GpuInfo {
                    index,
                    uuid: format!(
                        "GPU-{}",
                        lh_events::derived_id(&["sim-gpu", &self.id, &index.to_string()])
                    ),
                    model: self.gpu_model.clone(),
                    vram_gb: self.vram_gb,
                    mig: self.mig_gpus.contains(&index),
                    unowned_mig_instances: Vec::new(),
                })
                .collect(),
            isolation: self.isolation,
            gpu_sharing: self.gpu_sharing,
            fabric: self.fabric.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One node of two A100-40GB, and `extra` keys.
    fn one_node(extra: &str) -> Result<FleetFile, toml::de::Error> {
        toml::from_str(&format!(
            "[[node]]\nid = \"node-a\"\nzone = \"z1\"\nhostname = \"h\"\n\
             gpu_model = \"A100-40GB\"\ngpu_count = 2\nvram_gb = 40\n{extra}"
        ))
    }

    #[test]
    fn parses_and_finds_nodes() {
        let f = one_node("").unwrap();
        let inv = f.node("node-a", Path::new("x")).unwrap().inventory();
        assert_eq!(inv.gpus.len(), 2);
        assert_ne!(inv.gpus[0].uuid, inv.gpus[1].uuid);
        assert_eq!(inv, f.node("node-a", Path::new("x")).unwrap().inventory());
        let err = f.node("node-z", Path::new("x")).unwrap_err().to_string();
        assert!(err.contains("node-a"), "{err}");
        // Nothing declared: nothing enforced.
        assert_eq!(
            (inv.isolation, inv.gpu_sharing),
            (Isolation::None, GpuSharing::None)
        );
    }

    #[test]
    fn a_node_declares_the_enforcement_its_fleet_entry_names() {
        let f = one_node("isolation = \"container\"\ngpu_sharing = \"hami-core\"\n").unwrap();
        let inv = f.node("node-a", Path::new("x")).unwrap().inventory();
        assert_eq!(
            (inv.isolation, inv.gpu_sharing),
            (Isolation::Container, GpuSharing::HamiCore)
        );
        let bad = one_node("isolation = \"vm\"\n");
        assert!(bad.is_err());
    }

    #[test]
    fn mig_gpus_must_exist_and_support_mig() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.toml");
        let write = |model: &str, mig: &str| {
            let vram = lh_domain::catalog::vram_gb(model).unwrap_or(40);
            std::fs::write(
                &path,
                format!(
                    "[[node]]\nid = \"n\"\nzone = \"z\"\nhostname = \"h\"\ngpu_model = \"{model}\"\ngpu_count = 2\nvram_gb = {vram}\nmig_gpus = {mig}\n"
                ),
            )
            .unwrap();
        };
        write("A100-40GB", "[1]");
        let f = FleetFile::load(&path).unwrap();
        let inv = f.node("n", &path).unwrap().inventory();
        assert_eq!(
            inv.gpus.iter().map(|g| g.mig).collect::<Vec<_>>(),
            [false, true]
        );
        write("A100-40GB", "[2]");
        let err = FleetFile::load(&path).unwrap_err().to_string();
        assert!(err.contains("GPU 2"), "{err}");
        write("L4-24GB", "[0]");
        let err = FleetFile::load(&path).unwrap_err().to_string();
        assert!(err.contains("no MIG mode"), "{err}");
    }

    #[test]
    fn the_model_and_its_memory_come_from_the_catalogue() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.toml");
        let load = |model: &str, vram: u32| {
            std::fs::write(
                &path,
                format!(
                    "[[node]]\nid = \"n\"\nzone = \"z\"\nhostname = \"h\"\ngpu_model = \"{model}\"\ngpu_count = 1\nvram_gb = {vram}\n"
                ),
            )
            .unwrap();
            FleetFile::load(&path)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(load("H100-80GB", 80), Ok(()));
        let err = load("H100-80GB", 40).unwrap_err();
        assert!(err.contains("catalogue gives H100-80GB 80 GB"), "{err}");
        let err = load("V100-16GB", 16).unwrap_err();
        assert!(
            err.contains("not in the GPU catalogue") && err.contains("A100-40GB"),
            "{err}"
        );
    }
    #[test]
    fn a_node_may_name_a_fault_script_next_to_the_fleet_file() {
        let dir = tempfile::tempdir().unwrap();
        let fleet = dir.path().join("fleet.toml");
        std::fs::write(
            &fleet,
            "[[node]]\nid = \"n\"\nzone = \"z\"\nhostname = \"h\"\ngpu_model = \"A100-40GB\"\ngpu_count = 2\nvram_gb = 40\nfaults = \"faults.toml\"\n",
        )
        .unwrap();
        let script = |text: &str| std::fs::write(dir.path().join("faults.toml"), text).unwrap();
        script("[[fault]]\nafter_secs = 1\ngpu = 1\nkind = \"xid\"\ncode = 79\n");
        let f = FleetFile::load(&fleet).unwrap();
        let faults = f.node("n", &fleet).unwrap().fault_script(&fleet).unwrap();
        assert_eq!(faults.unwrap().faults.len(), 1);
        // A script that names a GPU the node lacks fails the load.
        script("[[fault]]\nafter_secs = 1\ngpu = 2\nkind = \"xid\"\ncode = 79\n");
        let err = FleetFile::load(&fleet).unwrap_err().to_string();
        assert!(err.contains("gpu 2 but the node has 2 GPUs"), "{err}");
        std::fs::remove_file(dir.path().join("faults.toml")).unwrap();
        let err = FleetFile::load(&fleet).unwrap_err().to_string();
        assert!(err.contains("cannot read fault script"), "{err}");
    }

    #[test]
    fn the_dev_fleet_file_still_loads_and_names_no_faults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dev/fleet.toml");
        let f = FleetFile::load(&path).unwrap();
        assert!(f.node.iter().all(|n| n.faults.is_none()));
    }
}
