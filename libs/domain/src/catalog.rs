//! GPU models a tenant may ask for, with their VRAM.

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

/// Most GPUs one lease may hold (all on one node).
pub const MAX_GPUS_PER_LEASE: u32 = 8;

pub fn vram_gb(model: &str) -> Option<u32> {
    GPU_MODELS
        .iter()
        .find(|(name, _)| *name == model)
        .map(|(_, vram)| *vram)
}

pub fn model_names() -> impl Iterator<Item = &'static str> {
    GPU_MODELS.iter().map(|(name, _)| *name)
}
