//! The one GPU catalogue: the models a tenant may ask for, their VRAM and
//! their MIG geometry. The gateway, the node-agent's fleet file and the
//! scheduler all check an ask against it, so a model or a profile is known
//! or unknown in the same way everywhere.

use lh_events::GpuAsk;

/// The MIG geometry (profiles, slices, placement rules) lives with the
/// placement engine, which needs it to place instances; it is re-exported
/// here so that validation reads one catalogue.
pub use lh_placement::mig::{geometries, geometry, profiles, Geometry, MigProfile};

/// `(model name, VRAM in GB)`. Names are what `node.registered` reports and
/// what tenants put in `gpu_model`.
pub const GPU_MODELS: &[(&str, u32)] = &[
    ("A100-40GB", 40),
    ("A100-80GB", 80),
    ("H100-80GB", 80),
    ("H200-141GB", 141),
    ("A10G-24GB", 24),
    ("A30-24GB", 24),
    ("L4-24GB", 24),
    ("L40S-48GB", 48),
    ("RTX4090-24GB", 24),
];

/// What a lease gets of its node's host with each whole GPU of a model:
/// `(model, vCPUs, RAM in GiB)`, as the usual cloud instances of that GPU
/// give (A100: 96 vCPUs and 1,152 GiB for 8; H100: 192 and 2,048 for 8;
/// A10G: 48 and 192 for 4; L4 and L40S: their single-GPU sizes). A share or
/// a MIG instance gets its part of one GPU's. A node whose host has less
/// for its GPUs gives each lease its part of what it has instead
/// ([`host_share_per_gpu`]).
pub const HOST_PER_GPU: &[(&str, u32, u32)] = &[
    ("A100-40GB", 12, 144),
    ("A100-80GB", 12, 144),
    ("H100-80GB", 24, 256),
    ("H200-141GB", 24, 256),
    ("A10G-24GB", 12, 48),
    ("A30-24GB", 8, 64),
    ("L4-24GB", 4, 16),
    ("L40S-48GB", 8, 64),
    ("RTX4090-24GB", 8, 32),
];

/// A whole GPU's part of its host: CPU in thousandths of a core, RAM in
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostShare {
    pub cpu_milli: u64,
    pub memory_bytes: u64,
}

/// What one whole GPU of `model` brings of its host, per the catalogue;
/// `None` for a model it does not know.
pub fn host_share_per_gpu(model: &str) -> Option<HostShare> {
    HOST_PER_GPU
        .iter()
        .find(|(name, _, _)| *name == model)
        .map(|(_, vcpus, gib)| HostShare {
            cpu_milli: u64::from(*vcpus) * 1000,
            memory_bytes: u64::from(*gib) << 30,
        })
}

/// Any count of GPUs up to this one a lease may hold; more than a node
/// holds are placed across nodes, as a gang.
pub const MAX_GPUS_ANY_COUNT: u32 = 16;
/// Beyond [`MAX_GPUS_ANY_COUNT`], a lease holds whole nodes of this many
/// GPUs: a multiple of it.
pub const GPUS_PER_WHOLE_NODE: u32 = 8;
/// Most GPUs one lease may hold (16 nodes of 8); the tenant's quota bounds
/// it too.
pub const MAX_GPUS_PER_LEASE: u32 = 128;
/// A whole GPU in milli-GPU: the most a fractional share may take.
pub const MILLI_PER_GPU: u32 = 1000;

pub fn vram_gb(model: &str) -> Option<u32> {
    GPU_MODELS
        .iter()
        .find(|(name, _)| *name == model)
        .map(|(_, vram)| *vram)
}

pub fn model_names() -> impl Iterator<Item = &'static str> {
    GPU_MODELS.iter().map(|(name, _)| *name)
}

/// Why an ask does not fit the catalogue: the request field at fault and a
/// sentence for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct CatalogError {
    pub field: &'static str,
    pub detail: String,
}

impl CatalogError {
    fn new(field: &'static str, detail: impl Into<String>) -> Self {
        Self {
            field,
            detail: detail.into(),
        }
    }
}

/// Checks that `model` is in the catalogue and can serve `ask`: a GPU count
/// within one node's lease limit, a share within one GPU of the model, or a
/// MIG profile of the model.
pub fn check(model: &str, ask: &GpuAsk) -> Result<(), CatalogError> {
    if let GpuAsk::Whole(n) = ask {
        let whole_nodes = *n % GPUS_PER_WHOLE_NODE == 0;
        if *n == 0 || *n > MAX_GPUS_PER_LEASE || (*n > MAX_GPUS_ANY_COUNT && !whole_nodes) {
            return Err(CatalogError::new(
                "gpus",
                format!(
                    "gpus must be 1 to {MAX_GPUS_ANY_COUNT}, or a multiple of \
                     {GPUS_PER_WHOLE_NODE} up to {MAX_GPUS_PER_LEASE}"
                ),
            ));
        }
    }
    let Some(model_vram) = vram_gb(model) else {
        return Err(CatalogError::new(
            "gpu_model",
            format!(
                "unknown GPU model {model:?}; known: {}",
                model_names().collect::<Vec<_>>().join(", ")
            ),
        ));
    };
    match ask {
        GpuAsk::Whole(_) => Ok(()),
        GpuAsk::Fraction(f) => {
            if f.milli == 0 || f.milli > MILLI_PER_GPU {
                return Err(CatalogError::new(
                    "gpu_fraction.milli",
                    format!("gpu_fraction.milli must be 1 to {MILLI_PER_GPU}"),
                ));
            }
            if f.vram_gb == 0 || f.vram_gb > model_vram {
                return Err(CatalogError::new(
                    "gpu_fraction.vram_gb",
                    format!(
                        "gpu_fraction.vram_gb must be 1 to {model_vram} (the VRAM of one {model})"
                    ),
                ));
            }
            Ok(())
        }
        GpuAsk::Mig(profile) => {
            let geometry =
                mig_geometry(model).map_err(|detail| CatalogError::new("mig_profile", detail))?;
            if geometry.profile(profile).is_none() {
                return Err(CatalogError::new(
                    "mig_profile",
                    format!(
                        "{model} has no MIG profile {profile:?}; its profiles: {}",
                        geometry
                            .profiles
                            .iter()
                            .map(|p| p.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            Ok(())
        }
    }
}

/// The MIG geometry of `model`, or why it has none (naming the models that
/// do).
pub fn mig_geometry(model: &str) -> Result<&'static Geometry, String> {
    geometry(model).ok_or_else(|| {
        format!(
            "{model} has no MIG mode; MIG models: {}",
            geometries()
                .iter()
                .map(|g| g.model)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// What an ask holds of one node: compute in milli-GPU and VRAM in GB. An
/// ask the catalogue does not know (an unknown model or profile) holds
/// nothing; the gateway never lets one through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    pub milli: u64,
    pub vram_gb: u32,
}

pub fn footprint(model: &str, ask: &GpuAsk) -> Footprint {
    match ask {
        GpuAsk::Whole(n) => Footprint {
            milli: u64::from(*n) * u64::from(MILLI_PER_GPU),
            vram_gb: n * vram_gb(model).unwrap_or(0),
        },
        GpuAsk::Fraction(f) => Footprint {
            milli: u64::from(f.milli),
            vram_gb: f.vram_gb,
        },
        GpuAsk::Mig(profile) => geometry(model)
            .and_then(|g| g.profile(profile).map(|p| lh_placement::mig::size(p, g)))
            .map_or(
                Footprint {
                    milli: 0,
                    vram_gb: 0,
                },
                |(milli, vram_gb)| Footprint {
                    milli: u64::from(milli),
                    vram_gb,
                },
            ),
    }
}

#[cfg(test)]
mod tests {
    use lh_events::GpuFraction;

    use super::*;

    fn field(model: &str, ask: GpuAsk) -> &'static str {
        check(model, &ask).unwrap_err().field
    }

    #[test]
    fn every_model_brings_cpu_and_ram_of_its_host() {
        for model in model_names() {
            let share = host_share_per_gpu(model).unwrap_or_else(|| panic!("{model}"));
            assert!(
                share.cpu_milli >= 1000 && share.memory_bytes >= 1 << 30,
                "{model}"
            );
        }
        assert_eq!(host_share_per_gpu("nope"), None);
        assert_eq!(
            host_share_per_gpu("A100-40GB").unwrap().memory_bytes,
            144 << 30
        );
    }

    #[test]
    fn every_mig_model_is_in_the_catalogue_with_its_memory() {
        for g in geometries() {
            assert_eq!(vram_gb(g.model), Some(g.memory_gb), "{}", g.model);
        }
    }

    #[test]
    fn known_asks_pass() {
        check("A100-40GB", &GpuAsk::Whole(8)).unwrap();
        check(
            "A100-40GB",
            &GpuAsk::Fraction(GpuFraction {
                milli: 1000,
                vram_gb: 40,
            }),
        )
        .unwrap();
        check("A100-40GB", &GpuAsk::Mig("3g.20gb".into())).unwrap();
    }

    #[test]
    fn each_fault_names_its_field() {
        assert_eq!(field("A100-40GB", GpuAsk::Whole(0)), "gpus");
        assert_eq!(field("A100-40GB", GpuAsk::Whole(17)), "gpus");
        assert_eq!(field("Z80", GpuAsk::Whole(1)), "gpu_model");
        let share = |milli, vram_gb| GpuAsk::Fraction(GpuFraction { milli, vram_gb });
        assert_eq!(field("A100-40GB", share(0, 1)), "gpu_fraction.milli");
        assert_eq!(field("A100-40GB", share(1001, 1)), "gpu_fraction.milli");
        assert_eq!(field("A100-40GB", share(500, 0)), "gpu_fraction.vram_gb");
        assert_eq!(field("A100-40GB", share(500, 41)), "gpu_fraction.vram_gb");
        assert_eq!(
            field("L4-24GB", GpuAsk::Mig("1g.5gb".into())),
            "mig_profile"
        );
        assert_eq!(
            field("A100-40GB", GpuAsk::Mig("9g.99gb".into())),
            "mig_profile"
        );
    }

    #[test]
    fn the_gpu_count_is_checked_before_the_model() {
        assert_eq!(field("Z80", GpuAsk::Whole(0)), "gpus");
    }

    #[test]
    fn a_footprint_is_what_one_node_gives_up() {
        assert_eq!(
            footprint("A100-40GB", &GpuAsk::Whole(2)),
            Footprint {
                milli: 2000,
                vram_gb: 80
            }
        );
        assert_eq!(
            footprint("A100-40GB", &GpuAsk::Mig("3g.20gb".into())),
            Footprint {
                milli: 428,
                vram_gb: 20
            }
        );
    }
}
