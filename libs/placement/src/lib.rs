//! Leasehold's placement engine: a pure library (no I/O, no clock),
//! deterministic for a given seed.
//!
//! * [`model`]: what the engine is told (nodes, GPUs and their sharing mode,
//!   requests).
//! * [`Cluster`]: compact mutable state, feasibility checks, allocation and
//!   release, a generation counter per node for incremental caching.
//! * [`policy`]: the [`Policy`] trait and its implementations: FGD and
//!   Leasehold's default, which builds on it.
//! * [`Engine`]: filter, score, pick (ties drawn with the seed), and a
//!   [`Provenance`] for every decision or a [`Pending`] for every refusal.
//! * [`ShapeMix`]: the distribution of task shapes that fragmentation is
//!   measured against, and the measure itself.
//!
//! The openb trace replay, the published simulator's simpler baselines, the
//! ablation switches of the default policy and `lh-sim` live in
//! `lh-placement-lab`. The reasoning and the measurements
//! are in docs/placement.md.

pub mod cluster;
pub mod engine;
pub mod mig;
pub mod model;
pub mod packing;
pub mod policy;
pub mod rng;
pub mod shape_mix;

pub use cluster::{
    gpu_indices, AllocError, AllocId, Allocation, Cluster, Demand, GpuSet, Kind, MigHold, Reject,
};
pub use engine::{Decision, Engine, GangShortfall, Pending, Provenance, Ties};
pub use model::{GpuDemand, GpuSpec, NodeSpec, Preemptibility, Request, SharingMode};
pub use policy::{Policy, Scored};
pub use rng::Rng;
pub use shape_mix::{Shape, ShapeMix, ShapeMixConfig};
