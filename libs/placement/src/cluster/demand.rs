//! A request compiled against a cluster (its shape key) and what one lease
//! tag counts.

use super::*;

/// A request compiled against a cluster: interned models and zones as masks,
/// the GPU part as a small copyable value. It is also the "shape" key policies
/// cache their per-node work under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Demand {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub kind: Kind,
    /// Allowed models; `u64::MAX` for any.
    pub models: u64,
    /// Allowed zones; `u64::MAX` for any.
    pub zones: u64,
    /// Only nodes that isolate workloads.
    pub needs_isolation: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    None,
    Whole(u8),
    Frac {
        milli: u16,
        vram_gb: u32,
    },
    /// A MIG profile, by index in [`mig::profile_names`] (`u16::MAX`: a
    /// name no model has, which nothing fits).
    Mig(u16),
}

impl Demand {
    /// Milli-GPU the demand takes per GPU, and how many GPUs.
    pub fn per_gpu(&self) -> (u16, u8) {
        match self.kind {
            Kind::None | Kind::Mig(_) => (0, 0),
            Kind::Whole(n) => (MILLI, n),
            Kind::Frac { milli, .. } => (milli, 1),
        }
    }

    /// Total milli-GPU.
    pub fn gpu_milli(&self) -> u64 {
        let (m, n) = self.per_gpu();
        u64::from(m) * u64::from(n)
    }

    /// The tag GPU clustering groups leases by (share, 1-GPU, 2-GPU, ...).
    pub fn tag(&self) -> Option<usize> {
        match self.kind {
            Kind::None => None,
            Kind::Frac { .. } => Some(0),
            Kind::Whole(n) => Some(usize::from(n).clamp(1, TAGS - 2)),
            Kind::Mig(_) => Some(TAGS - 1),
        }
    }
}

/// Number of lease tags counted per node (see [`Demand::tag`]).
pub const TAGS: usize = 18;
