//! What the node registers: the backend the flags ask for and its GPUs,
//! named as the catalogue names them.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use lh_events::{GpuInfo, GpuSharing, Isolation, NodeRegistered};

use super::backend::nvml::NvmlBackend;
use super::backend::sim::fleet::FleetFile;
use super::backend::sim::SimBackend;
use super::backend::{BackendError, GpuBackend, GpuDevice};
use super::config::{BackendKind, GpuArgs};

/// The backend the arguments ask for, and the inventory to register.
pub fn open(
    args: &GpuArgs,
    fleet_file: &Path,
    node_id: &str,
) -> anyhow::Result<(Arc<dyn GpuBackend>, NodeRegistered)> {
    if args.gpu_backend == BackendKind::Nvml {
        match NvmlBackend::new() {
            Ok(nvml) => {
                let zone = args
                    .zone
                    .clone()
                    .context("--zone (LH_ZONE) is needed with --gpu-backend nvml")?;
                let hostname = args.hostname.clone().unwrap_or_else(os_hostname);
                let devices = nvml.inventory()?;
                let mut inventory = nvml_inventory(node_id, &zone, &hostname, &devices);
                inventory.fabric = args.fabric.clone();
                tracing::info!(gpus = devices.len(), "NVML backend");
                return Ok((Arc::new(nvml), inventory));
            }
            Err(e @ (BackendError::LibraryMissing { .. } | BackendError::DriverNotLoaded))
                if args.sim_fallback =>
            {
                tracing::warn!(error = %e, "falling back to the simulated backend (--sim-fallback)");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let fleet = FleetFile::load(fleet_file)?;
    let node = fleet.node(node_id, fleet_file)?;
    let backend = SimBackend::for_node(node, fleet_file)?;
    let mut inventory = node.inventory();
    if args.fabric.is_some() {
        inventory.fabric = args.fabric.clone();
    }
    Ok((Arc::new(backend), inventory))
}

fn os_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The node as NVML sees it, with the models named as the catalogue names
/// them (`A100-40GB`), so price books and requests match real hosts.
pub fn nvml_inventory(
    node_id: &str,
    zone: &str,
    hostname: &str,
    devices: &[GpuDevice],
) -> NodeRegistered {
    NodeRegistered {
        node_id: node_id.to_string(),
        zone: zone.to_string(),
        hostname: hostname.to_string(),
        gpus: devices
            .iter()
            .map(|d| {
                let model = catalogue_model(&d.model, d.vram_mib);
                // The catalogue's VRAM, which prices and requests use: the
                // driver reports a little less (an H200 reads 140.4 GiB).
                let vram_gb = lh_domain::catalog::vram_gb(&model)
                    .unwrap_or_else(|| (d.vram_mib as f64 / 1024.0).round() as u32);
                GpuInfo {
                    index: d.index,
                    uuid: d.uuid.clone(),
                    model,
                    vram_gb,
                    mig: d.mig_enabled,
                    unowned_mig_instances: Vec::new(),
                }
            })
            .collect(),
        // The runtime the agent runs declares these (`lh_node_agent::start`).
        isolation: Isolation::None,
        gpu_sharing: GpuSharing::None,
        fabric: None,
    }
}

/// `NVIDIA A100-SXM4-40GB` → `A100-40GB`; a GPU the catalogue lacks keeps
/// its name with spaces as dashes (it registers, but nothing prices it).
pub fn catalogue_model(name: &str, vram_mib: u64) -> String {
    let upper = name.to_ascii_uppercase();
    let gb = (vram_mib as f64 / 1024.0).round() as u64;
    let known = if upper.contains("H200") {
        Some("H200-141GB")
    } else if upper.contains("H100") && gb <= 85 {
        // An H100 NVL (94 GB) is another product: it keeps its own name.
        Some("H100-80GB")
    } else if upper.contains("A100") && gb > 60 {
        Some("A100-80GB")
    } else if upper.contains("A100") {
        Some("A100-40GB")
    } else if upper.contains("A10G") {
        Some("A10G-24GB")
    } else if upper.contains("A30") {
        Some("A30-24GB")
    } else if upper.contains("L40S") {
        Some("L40S-48GB")
    } else if upper.contains("L4") && !upper.contains("L40") {
        Some("L4-24GB")
    } else if upper.contains("4090") {
        Some("RTX4090-24GB")
    } else {
        None
    };
    match known {
        Some(m) => m.to_string(),
        None => name.trim().trim_start_matches("NVIDIA ").replace(' ', "-"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_names_map_to_the_catalogue() {
        assert_eq!(
            catalogue_model("NVIDIA A100-SXM4-40GB", 40_960),
            "A100-40GB"
        );
        assert_eq!(
            catalogue_model("NVIDIA A100 80GB PCIe", 81_920),
            "A100-80GB"
        );
        assert_eq!(
            catalogue_model("NVIDIA H100 80GB HBM3", 81_559),
            "H100-80GB"
        );
        assert_eq!(catalogue_model("NVIDIA H200", 143_771), "H200-141GB");
        assert_eq!(catalogue_model("NVIDIA A10G", 23_028), "A10G-24GB");
        assert_eq!(catalogue_model("NVIDIA L40S", 46_068), "L40S-48GB");
        assert_eq!(catalogue_model("NVIDIA H100 NVL", 95_830), "H100-NVL");
        assert_eq!(catalogue_model("NVIDIA B200", 183_359), "B200");
    }

    #[test]
    fn nvml_inventory_rounds_vram_and_keeps_mig_mode() {
        let d = GpuDevice {
            index: 3,
            uuid: "GPU-x".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            vram_mib: 81_559,
            mig_enabled: true,
            mig_devices: Vec::new(),
            nvlink_peers: Vec::new(),
            numa_node: None,
        };
        let h200 = GpuDevice {
            model: "NVIDIA H200".into(),
            vram_mib: 143_771,
            ..d.clone()
        };
        let inv = nvml_inventory("n", "z", "h", &[d, h200]);
        assert_eq!(inv.gpus[0].vram_gb, 80);
        assert_eq!(
            (inv.gpus[1].model.as_str(), inv.gpus[1].vram_gb),
            ("H200-141GB", 141)
        );
        assert!(inv.gpus[0].mig);
        assert_eq!(inv.gpus[0].model, "H100-80GB");
    }

    #[test]
    fn without_nvml_the_agent_refuses_unless_told_to_fall_back() {
        if NvmlBackend::new().is_ok() {
            eprintln!("NVML is here: nothing to fall back from");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let fleet = dir.path().join("fleet.toml");
        std::fs::write(
            &fleet,
            "[[node]]\nid = \"n\"\nzone = \"z\"\nhostname = \"h\"\ngpu_model = \"A100-40GB\"\ngpu_count = 2\nvram_gb = 40\n",
        )
        .unwrap();
        let mut args = GpuArgs::for_test();
        args.gpu_backend = BackendKind::Nvml;
        let err = open(&args, &fleet, "n")
            .err()
            .expect("no NVML, no fallback");
        let line = format!("{err:#}");
        assert!(
            line.contains("libnvidia-ml.so.1") && !line.contains('\n'),
            "{line}"
        );
        args.sim_fallback = true;
        let (backend, inventory) = open(&args, &fleet, "n").unwrap();
        assert_eq!(backend.name(), "sim");
        assert_eq!(inventory.gpus.len(), 2);
    }
}
