//! Leasehold's default policy: fragmentation gradient descent made exact.
//!
//! See docs/placement.md for the reasoning and the measurements.

use super::fgd::{load, NodeCache, Scratch};
use super::Policy;
use crate::cluster::{Cluster, Demand, Kind};
use crate::engine::Scored;
use crate::policy::baselines::{MAX_SPEC_CPU, MAX_SPEC_GPU};
use crate::rng::Rng;
use crate::workload::{Compiled, Workload};

/// Switches of the policy (the default is what docs/placement.md justifies;
/// the others exist to measure each idea on its own).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseholdConfig {
    /// Count a node whose memory is too small for a shape as fragmented for
    /// it (the published FGD looks at CPU only).
    pub memory: bool,
    /// Break exact ties by packing (fuller node first).
    pub pack_tiebreak: bool,
}

impl Default for LeaseholdConfig {
    fn default() -> Self {
        LeaseholdConfig {
            memory: true,
            pack_tiebreak: true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Leasehold {
    workload: Workload,
    cfg: LeaseholdConfig,
    compiled: Option<Compiled>,
    cache: NodeCache,
}

impl Leasehold {
    pub fn new(workload: Workload) -> Self {
        Self::with_config(workload, LeaseholdConfig::default())
    }

    pub fn with_config(workload: Workload, cfg: LeaseholdConfig) -> Self {
        Leasehold {
            workload,
            cfg,
            compiled: None,
            cache: NodeCache::default(),
        }
    }

    pub fn config(&self) -> LeaseholdConfig {
        self.cfg
    }

    pub fn set_workload(&mut self, workload: Workload) {
        self.workload = workload;
        self.compiled = None;
        self.cache.clear();
    }
}

impl Policy for Leasehold {
    fn name(&self) -> &'static str {
        "leasehold"
    }
    fn version(&self) -> u32 {
        1
    }

    fn begin(&mut self, cluster: &Cluster, d: &Demand) {
        if self
            .compiled
            .as_ref()
            .is_none_or(|c| c.models_seen != cluster.models().len())
        {
            self.compiled = Some(Compiled::new(&self.workload, cluster));
            self.cache.clear();
        }
        self.cache.begin(cluster, d);
    }

    fn score(&mut self, cluster: &Cluster, node: usize, d: &Demand, _rng: &mut Rng) -> Scored {
        let n = cluster.node(node);
        if let Some(s) = self.cache.get(node, n.generation) {
            return s;
        }
        let mem = self.cfg.memory;
        let w = self.compiled.as_ref().expect("begin compiles the workload");
        let f0 = self
            .cache
            .node_frag(node, n.generation, || w.frag(&load(n), mem));
        let mut scratch = Scratch::of(n);
        let (f1, set) = match d.kind {
            Kind::Frac { milli, vram_gb } => {
                let mut best: Option<(f64, u16, u32)> = None;
                for (j, g) in n.gpus.iter().enumerate() {
                    if !g.fits_frac(milli, vram_gb, d.models) {
                        continue;
                    }
                    let f1 = scratch.frag_after(w, d, 1 << j, mem, n);
                    let better = match best {
                        None => true,
                        Some((bf, bm, _)) => f1 < bf || (f1 == bf && g.milli_free < bm),
                    };
                    if better {
                        best = Some((f1, g.milli_free, 1 << j));
                    }
                }
                let (f1, _, set) = best.unwrap_or((f0, 0, 0));
                (f1, set)
            }
            _ => {
                let set = cluster.pick_default(node, d);
                (scratch.frag_after(w, d, set, mem, n), set)
            }
        };
        let tiebreak = if self.cfg.pack_tiebreak {
            -((n.cpu_free - d.cpu_milli) as f64 / MAX_SPEC_CPU
                + (n.gpu_milli_free() - d.gpu_milli()) as f64 / MAX_SPEC_GPU)
        } else {
            0.0
        };
        let s = Scored {
            score: f0 - f1,
            tiebreak,
            gpus: set,
        };
        self.cache.put(node, n.generation, s);
        s
    }
}
