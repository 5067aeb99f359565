//! What a lease is given of a GPU: whole devices, memory-sliced shares and
//! MIG instances, and the inventory a node declares.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One GPU of a node's inventory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub vram_gb: u32,
    /// MIG mode is on: the GPU takes MIG leases only, each in a GPU instance
    /// created for it (and destroyed when it ends).
    #[serde(default, skip_serializing_if = "is_false")]
    pub mig: bool,
    /// MIG instances on the GPU that no lease holds (made by an operator, or
    /// left by an agent whose log was lost): their slices are taken, and
    /// the scheduler places no instance over them. The agent never reuses
    /// nor destroys them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unowned_mig_instances: Vec<MigInstance>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A MIG GPU instance: its profile (e.g. `3g.20gb`) and NVML placement start
/// slice, which names it on its GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MigInstance {
    pub profile: String,
    pub start: u8,
}

/// A GPU handed to a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AssignedGpu {
    pub index: u32,
    pub uuid: String,
    /// For a fractional (memory-sliced vGPU) lease: the share of this GPU's
    /// compute it holds, in milli-GPU (1..=1000). Absent for a whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milli: Option<u32>,
    /// For a fractional lease: the VRAM in GB it holds on this GPU. Absent
    /// for a whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vram_gb: Option<u32>,
    /// For a MIG lease: the GPU instance it holds on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_instance: Option<MigInstance>,
}

/// A share of one GPU (memory-sliced vGPU): compute in milli-GPU
/// (1..=1000) and a hard VRAM amount in GB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GpuFraction {
    pub milli: u32,
    pub vram_gb: u32,
}
