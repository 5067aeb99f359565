//! Placement policies behind one trait: the production policy
//! ([`Leasehold`]) and FGD, whose fragmentation measure it builds on.
//!
//! The research baselines and the policies by name live in
//! `lh-placement-lab`: the scheduler builds its one policy directly.

use crate::cluster::{Cluster, Demand, GpuSet};
use crate::rng::Rng;

mod fgd;
pub mod frag_cache;
mod leasehold;

pub use fgd::Fgd;
pub use leasehold::{stranded, Leasehold};

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
    /// Whether leases of whole GPUs wait for room now (a policy may keep
    /// GPUs whole for them). Nothing waits unless told.
    fn set_whole_waiting(&mut self, _waiting: bool) {}
}
