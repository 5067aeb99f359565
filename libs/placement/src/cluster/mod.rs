//! The cluster's mutable state, kept compact for the scoring loops: interned
//! models and zones, per-node free CPU and memory, per-GPU free milli and VRAM,
//! a generation counter per node (bumped on every change, so policies can
//! cache per-node work), the order in which nodes changed (so that a reader
//! keeping per-node work re-reads only those), and the live allocations.

use std::collections::HashMap;

use crate::mig;

/// Milli-GPU in one whole GPU.
pub const MILLI: u16 = 1000;
/// At most this many GPUs per node (GPU sets are bit masks).
pub const MAX_GPUS_PER_NODE: usize = 32;
/// At most this many distinct GPU models and zones (model and zone sets are
/// bit masks).
pub const MAX_MODELS: usize = 64;
pub const MAX_ZONES: usize = 64;
/// The log of changed nodes is dropped once it holds this many entries per
/// node (and at least [`MIN_CHANGES_KEPT`]): a reader that fell further
/// behind reads every node again, which costs what that many entries do.
pub const CHANGES_KEPT_PER_NODE: usize = 4;
pub const MIN_CHANGES_KEPT: usize = 4_096;

/// A set of GPU indices of one node, as a bit mask.
pub type GpuSet = u32;

/// Indices in a [`GpuSet`], ascending.
pub fn gpu_indices(set: GpuSet) -> impl Iterator<Item = u8> {
    (0..32u8).filter(move |i| set & (1 << i) != 0)
}

mod allocate;
mod demand;
mod fit;
mod fleet;
mod node;
mod reject;

pub use demand::{Demand, Kind, TAGS};
pub(crate) use node::EMPTY_GPU;
pub use node::{Gpu, Node, MIXED_SHARES, NO_FABRIC};
pub use reject::{AllocError, Reject};

/// Handle of a live allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocId(pub u32);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub node: u32,
    pub demand: Demand,
    pub gpus: GpuSet,
    /// The MIG instance a MIG allocation holds.
    pub mig: Option<MigHold>,
}

/// A MIG instance held by an allocation, and what it takes of its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigHold {
    pub profile: &'static mig::MigProfile,
    pub start: u8,
    pub milli: u16,
    pub vram_gb: u32,
}

/// The cluster: nodes, interned names, live allocations.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    models: Vec<String>,
    model_ix: HashMap<String, u16>,
    zones: Vec<String>,
    zone_ix: HashMap<String, u16>,
    /// Per zone: its region (what precedes the zone name's last dot).
    zone_region: Vec<u16>,
    regions: Vec<String>,
    region_ix: HashMap<String, u16>,
    fabrics: Vec<String>,
    fabric_ix: HashMap<String, u16>,
    pub(crate) nodes: Vec<Node>,
    allocs: Vec<Option<Allocation>>,
    free_slots: Vec<u32>,
    /// Live allocation slots per node.
    node_allocs: Vec<Vec<u32>>,
    gpu_milli_total: u64,
    gpu_milli_used: u64,
    /// Nodes in the order their generation moved, from change number
    /// `changes_from` on (see [`Cluster::changed_since`]).
    changes: Vec<u32>,
    changes_from: u64,
}

impl Cluster {
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn models(&self) -> &[String] {
        &self.models
    }

    pub fn model_id(&self, name: &str) -> Option<u16> {
        self.model_ix.get(name).copied()
    }

    pub fn zone_id(&self, name: &str) -> Option<u16> {
        self.zone_ix.get(name).copied()
    }

    pub fn zone_name(&self, zone: u16) -> &str {
        &self.zones[usize::from(zone)]
    }

    /// The region of `zone`: what precedes the zone name's last dot
    /// (`cn-north.1` is in `cn-north`), or the zone's whole name.
    pub fn region_of(&self, zone: u16) -> u16 {
        self.zone_region[usize::from(zone)]
    }

    pub fn region_name(&self, region: u16) -> &str {
        &self.regions[usize::from(region)]
    }

    /// The label of fabric `fabric` (see [`crate::NodeSpec::fabric`]).
    pub fn fabric_name(&self, fabric: u16) -> &str {
        &self.fabrics[usize::from(fabric)]
    }

    /// Milli-GPU of all GPUs (1000 each).
    pub fn gpu_milli_total(&self) -> u64 {
        self.gpu_milli_total
    }

    /// Milli-GPU held by live allocations.
    pub fn gpu_milli_used(&self) -> u64 {
        self.gpu_milli_used
    }

    /// The number of changes so far: a mark to ask [`Cluster::changed_since`]
    /// with later.
    pub fn change_mark(&self) -> u64 {
        self.changes_from + self.changes.len() as u64
    }

    /// The nodes whose generation moved since `mark` (a node once per
    /// change, in order), or `None` where the cluster no longer knows
    /// (the reader must look at every node).
    pub fn changed_since(&self, mark: u64) -> Option<&[u32]> {
        let from = mark.checked_sub(self.changes_from)?;
        self.changes.get(usize::try_from(from).ok()?..)
    }

    /// Node `i` changed: its generation moves, and the log says so.
    fn changed(&mut self, i: usize) {
        self.nodes[i].generation += 1;
        let kept = (self.nodes.len() * CHANGES_KEPT_PER_NODE).max(MIN_CHANGES_KEPT);
        if self.changes.len() >= kept {
            self.changes_from += self.changes.len() as u64;
            self.changes.clear();
        }
        self.changes.push(i as u32);
    }
}
