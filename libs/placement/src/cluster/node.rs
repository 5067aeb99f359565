//! A node and its GPUs as the scoring loops read them.

use crate::mig::{self, MigLayout};
use crate::model::SharingMode;

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gpu {
    pub model: u16,
    pub mode: SharingMode,
    pub vram_total: u32,
    pub vram_free: u32,
    pub milli_free: u16,
    /// Live leases on this GPU (slices, or 1 for a whole-GPU lease).
    pub leases: u16,
    /// Takes shares of one size at a time (see
    /// [`crate::NodeSpec::one_share_size_per_gpu`]).
    pub one_share_size: bool,
    /// On such a GPU while it hosts shares: their `(milli, vram_gb)`, or
    /// [`MIXED_SHARES`] once it held shares of different sizes (recorded as
    /// they were placed before the rule), which it keeps until it is empty:
    /// its enforcement's limits only come back up then.
    pub share_size: (u16, u32),
}

/// [`Gpu::share_size`] of a GPU holding shares of different sizes: no share
/// size matches it.
pub const MIXED_SHARES: (u16, u32) = (u16::MAX, u32::MAX);

/// Placeholder for scratch arrays.
pub(crate) const EMPTY_GPU: Gpu = Gpu {
    model: 0,
    mode: SharingMode::Whole,
    vram_total: 0,
    vram_free: 0,
    milli_free: 0,
    leases: 0,
    one_share_size: false,
    share_size: (0, 0),
};

impl Gpu {
    #[inline]
    pub fn is_idle(&self) -> bool {
        self.leases == 0
    }

    #[inline]
    pub fn allowed(&self, models: u64) -> bool {
        models & (1u64 << self.model) != 0
    }

    /// Can take a whole-GPU lease now.
    #[inline]
    pub fn fits_whole(&self, models: u64) -> bool {
        self.leases == 0 && self.mode != SharingMode::Mig && self.allowed(models)
    }

    /// Can take a slice of `milli` and `vram_gb` now.
    #[inline]
    pub fn fits_frac(&self, milli: u16, vram_gb: u32, models: u64) -> bool {
        self.has_room_for(milli, vram_gb, models) && self.takes_share_size(milli, vram_gb)
    }

    /// Has the free milli and VRAM for a slice, whatever the sizes of the
    /// slices it holds.
    #[inline]
    pub fn has_room_for(&self, milli: u16, vram_gb: u32, models: u64) -> bool {
        self.mode == SharingMode::VGpu
            && self.milli_free >= milli
            && self.vram_free >= vram_gb
            && self.allowed(models)
    }

    /// A slice of this size may join the ones it holds: always, unless the
    /// GPU takes one share size at a time and holds shares of another.
    #[inline]
    pub fn takes_share_size(&self, milli: u16, vram_gb: u32) -> bool {
        !self.one_share_size || self.leases == 0 || self.share_size == (milli, vram_gb)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: String,
    pub zone: u16,
    pub cpu_total: u64,
    pub memory_total: u64,
    pub cpu_free: u64,
    pub memory_free: u64,
    pub gpus: Vec<Gpu>,
    /// NVLink/NUMA domains as GPU sets.
    pub domains: Vec<GpuSet>,
    /// Models present on the node.
    pub model_mask: u64,
    /// Bumped on every allocation and release on this node.
    pub generation: u64,
    /// Live leases per tag (see [`Demand::tag`]).
    pub tags: [u16; TAGS],
    /// Per GPU: its MIG instances when it is in MIG mode and its model has a
    /// geometry; `None` otherwise (such a GPU takes no MIG lease). Leases are
    /// named by their allocation slot.
    pub mig: Vec<Option<MigLayout<u32>>>,
    /// See [`crate::NodeSpec::isolates_workloads`].
    pub isolates_workloads: bool,
    /// Its fabric, or [`NO_FABRIC`] (see [`crate::NodeSpec::fabric`]).
    pub fabric: u16,
}

/// [`Node::fabric`] of a node that names no fabric.
pub const NO_FABRIC: u16 = u16::MAX;

impl Node {
    /// Free milli-GPU summed over the node's GPUs.
    pub fn gpu_milli_free(&self) -> u64 {
        self.gpus.iter().map(|g| u64::from(g.milli_free)).sum()
    }

    /// How GPU `j` would take an instance of profile `profile` (an index in
    /// [`mig::profile_names`]), if it can.
    pub fn mig_plan(&self, j: usize, profile: u16, models: u64) -> Option<mig::Plan> {
        let g = &self.gpus[j];
        if g.mode != SharingMode::Mig || !g.allowed(models) {
            return None;
        }
        let name = mig::profile_names().get(usize::from(profile))?;
        mig::plan(self.mig[j].as_ref()?, name)
    }

    /// The GPU of this node that an instance of `profile` fits most tightly:
    /// fewest compute slices left uncovered after it is placed (so live GPUs
    /// fill up and idle ones stay idle for large profiles and re-slicing),
    /// lowest index among equals. `(GPU, plan, slices left)`.
    pub fn pick_mig(&self, profile: u16, models: u64) -> Option<(u8, mig::Plan, u8)> {
        let mut best: Option<(u8, mig::Plan, u8)> = None;
        for j in 0..self.gpus.len() {
            let Some(plan) = self.mig_plan(j, profile, models) else {
                continue;
            };
            let layout = self.mig[j].as_ref().expect("a plan implies a layout");
            let covered = layout
                .instances()
                .iter()
                .filter(|i| !plan.destroy.contains(&i.start))
                .fold(0u16, |m, i| m | i.profile.compute_mask(i.start))
                | plan.profile.compute_mask(plan.start);
            let left = layout.geometry().compute_slices - covered.count_ones() as u8;
            if best.as_ref().is_none_or(|b| left < b.2) {
                best = Some((j as u8, plan, left));
            }
        }
        best
    }
}
