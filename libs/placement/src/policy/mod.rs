//! Placement policies behind one trait.
//!
//! The baselines reproduce the score plugins of the published simulator
//! (hkust-adsl/kubernetes-scheduler-simulator, the FGD paper's artifact):
//! integer scores 0..=100 as the Kubernetes framework sees them, ties drawn
//! at random by the engine, and the same choice of GPU inside the node. Their
//! semantics are pinned by the unit tests of each module.

use crate::cluster::{Cluster, Demand, GpuSet};
use crate::rng::Rng;
use crate::shape_mix::ShapeMix;

mod baselines;
mod fgd;
pub mod frag_cache;
mod leasehold;

pub use baselines::{BestFit, DotProduct, GpuClustering, GpuPacking, RandomPolicy};
pub use baselines::{MAX_SPEC_CPU, MAX_SPEC_GPU};
pub use fgd::Fgd;
pub use leasehold::Leasehold;

/// Score of one candidate: compared as (`score`, `tiebreak`), higher wins.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    pub score: f64,
    pub tiebreak: f64,
    pub gpus: GpuSet,
}

impl Scored {
    pub fn new(score: f64, gpus: GpuSet) -> Self {
        Scored {
            score,
            tiebreak: 0.0,
            gpus,
        }
    }

    #[inline]
    pub(crate) fn key(&self) -> (f64, f64) {
        (self.score, self.tiebreak)
    }
}

/// A placement policy. The engine calls [`Policy::begin`] once per decision,
/// then [`Policy::score`] for every node that can take the demand; the
/// highest score wins.
pub trait Policy: Send {
    fn name(&self) -> &'static str;
    fn version(&self) -> u32;
    /// Prepares for one decision (e.g. looks the demand's shape up once).
    fn begin(&mut self, _cluster: &Cluster, _demand: &Demand) {}
    /// Scores feasible node `node` and chooses its GPUs.
    fn score(&mut self, cluster: &Cluster, node: usize, demand: &Demand, rng: &mut Rng) -> Scored;
    /// `Some(epoch)` when, after [`Policy::begin`], a node's score is a
    /// function of the node's state (its generation), the demand and this
    /// epoch alone, and draws nothing from the generator: the engine may
    /// then keep scores between decisions until the epoch changes. `None`
    /// (the default): every decision scores every node anew.
    fn scores_by_node(&self) -> Option<u64> {
        None
    }
}

/// Policy names, as `lh-sim --policy` takes them.
pub const POLICY_NAMES: &[&str] = &[
    "random",
    "dotprod",
    "gpuclustering",
    "gpupacking",
    "bestfit",
    "fgd",
    "leasehold",
];

/// The default policy.
pub const DEFAULT_POLICY: &str = "leasehold";

/// Builds a policy by name. Fragmentation-aware policies measure against
/// `mix` (the distribution of task shapes). The ablations of the default
/// (`leasehold+<switch>`) are built by `lh-placement-lab`.
pub fn by_name(name: &str, mix: &ShapeMix) -> Option<Box<dyn Policy>> {
    Some(match name {
        "random" => Box::new(RandomPolicy),
        "dotprod" => Box::new(DotProduct),
        "gpuclustering" => Box::new(GpuClustering),
        "gpupacking" => Box::new(GpuPacking),
        "bestfit" => Box::new(BestFit),
        "fgd" => Box::new(Fgd::new(mix.clone())),
        "leasehold" => Box::new(Leasehold::new(mix.clone())),
        _ => return None,
    })
}
