//! MIG (Multi-Instance GPU): per-model geometries as data, NVIDIA's slot
//! placement rules, and a deterministic placer for one GPU.
//!
//! Pure: no I/O, no clock, no randomness. See `docs/mig.md` for the tables,
//! the sources they come from and the rules in prose.
//!
//! # Model
//!
//! A MIG-capable GPU has `compute_slices` compute slices (7 on A100, H100 and
//! H200; 4 on A30) and `memory_slices` memory slices (8, or 4 on A30). A GPU
//! instance (GI) of a profile starts at one of the profile's allowed
//! `starts` (NVML's `GpuInstancePlacement.start`, what `nvidia-smi mig -lgipp`
//! prints) and occupies
//!
//! * memory slices `start .. start + memory_slices` (NVML's `size`), and
//! * compute slices `start .. start + compute_slices`.
//!
//! Two instances may coexist when neither their memory slices nor their
//! compute slices overlap, and at most one instance on a GPU may be a
//! media-extension (`+me`) profile: each of those takes the GPU's only OFA
//! (and its only JPEG engine on A100/A30), so NVIDIA lists one instance of
//! each and a single one per GPU.
//!
//! A [`MigLayout`] is the set of GPU instances that exist on one GPU, each free
//! or held by a lease. Placement follows the dynamic-MIG rule:
//!
//! * a GPU with at least one held instance (a lease's, or one that belongs to
//!   no lease: [`MigLayout::add_unowned`]) is *live*: its existing instances
//!   stay as they are. A request may take a free existing instance of its
//!   profile, or a new instance may be created in slices no existing instance
//!   covers (NVIDIA allows creating a GI next to running ones as long as the
//!   placement is valid);
//! * a GPU with no held instance is *idle* and may be re-sliced: free
//!   instances that are in the way are destroyed (as few as possible).
//!
//! Instances created by [`place`] are destroyed again by [`release`];
//! instances provisioned ahead of time ([`MigLayout::provision`], or free
//! instances given to [`MigLayout::from_instances`]) are *persistent* and only
//! become free on release.

mod geometry;
mod layout;
mod plan;
#[cfg(test)]
mod tests;

pub use geometry::*;
pub use layout::*;
pub use plan::*;
