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
    /// Quantise the score like the published FGD (`int(100 sigmoid(dF/1000))`).
    pub quantise: bool,
    /// Weight shapes by their share of GPU demand, not of tasks.
    pub demand_weighted: bool,
    /// Measure: the one-step FGD fragmentation, or the fill-up stranding.
    pub fill: bool,
    /// Break ties by the change of the fill-up stranding (instead of packing).
    pub fill_tiebreak: bool,
    /// Measure is the sum of the one-step fragmentation and the fill-up
    /// stranding.
    pub sum: bool,
    /// Treat fragmentation deltas within this many milli as equal (0: exact).
    pub bucket: f64,
}

impl LeaseholdConfig {
    /// Applies one ablation switch by name; `None` for an unknown one.
    pub fn apply(&mut self, opt: &str) -> Option<()> {
        match opt {
            "nomem" => self.memory = false,
            "mem" => self.memory = true,
            "notie" => self.pack_tiebreak = false,
            "tie" => self.pack_tiebreak = true,
            "q" => self.quantise = true,
            "exact" => self.quantise = false,
            "notfill" => self.fill_tiebreak = false,
            "dw" => self.demand_weighted = true,
            "fill" => self.fill = true,
            "tfill" => self.fill_tiebreak = true,
            "sum" => self.sum = true,
            b if b.starts_with("b=") => self.bucket = b[2..].parse().ok()?,
            "step" => self.fill = false,
            "cw" => self.demand_weighted = false,
            _ => return None,
        }
        Some(())
    }
}

impl Default for LeaseholdConfig {
    fn default() -> Self {
        LeaseholdConfig {
            memory: true,
            pack_tiebreak: false,
            quantise: true,
            demand_weighted: false,
            fill: false,
            fill_tiebreak: true,
            sum: false,
            bucket: 0.0,
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
            self.compiled = Some(if self.cfg.demand_weighted {
                Compiled::new_demand_weighted(&self.workload, cluster)
            } else {
                Compiled::new(&self.workload, cluster)
            });
            self.cache.clear();
        }
        self.cache.begin(cluster, d);
    }

    fn score(&mut self, cluster: &Cluster, node: usize, d: &Demand, _rng: &mut Rng) -> Scored {
        let n = cluster.node(node);
        if let Some(s) = self.cache.get(node, n.generation) {
            return s;
        }
        let cfg = self.cfg;
        let mem = cfg.memory;
        // (primary measure, fill-up stranding) of a node state.
        let measure = move |w: &Compiled, l: &crate::workload::Load<'_>| -> (f64, f64) {
            if cfg.sum {
                let (a, b) = w.frag_both(l, mem);
                (a + b, b)
            } else if cfg.fill {
                let b = w.frag_fill(l, mem);
                (b, b)
            } else if cfg.fill_tiebreak {
                w.frag_both(l, mem)
            } else {
                (w.frag(l, mem), 0.0)
            }
        };
        let w = self.compiled.as_ref().expect("begin compiles the workload");
        let (f0, g0) = self
            .cache
            .node_pair(node, n.generation, || measure(w, &load(n)));
        let mut scratch = Scratch::of(n);
        let ((f1, g1), set) = match d.kind {
            Kind::Frac { milli, vram_gb } => {
                let mut best: Option<((f64, f64), u16, u32)> = None;
                for (j, g) in n.gpus.iter().enumerate() {
                    if !g.fits_frac(milli, vram_gb, d.models) {
                        continue;
                    }
                    let m = scratch.measure_after(w, d, 1 << j, n, measure);
                    let better = match best {
                        None => true,
                        Some((bm_, bmilli, _)) => {
                            m.0 < bm_.0 || (m.0 == bm_.0 && g.milli_free < bmilli)
                        }
                    };
                    if better {
                        best = Some((m, g.milli_free, 1 << j));
                    }
                }
                let (m, _, set) = best.unwrap_or(((f0, g0), 0, 0));
                (m, set)
            }
            _ => {
                let set = cluster.pick_default(node, d);
                (scratch.measure_after(w, d, set, n, measure), set)
            }
        };
        let score = if cfg.quantise {
            ((1.0 / (1.0 + (-(f0 - f1) / 1000.0).exp())) * 100.0) as i64 as f64
        } else if cfg.bucket > 0.0 {
            ((f0 - f1) / cfg.bucket).floor()
        } else {
            f0 - f1
        };
        let tiebreak = if cfg.fill_tiebreak {
            g0 - g1
        } else if cfg.pack_tiebreak {
            -((n.cpu_free - d.cpu_milli) as f64 / MAX_SPEC_CPU
                + (n.gpu_milli_free() - d.gpu_milli()) as f64 / MAX_SPEC_GPU)
        } else {
            0.0
        };
        let s = Scored {
            score,
            tiebreak,
            gpus: set,
        };
        self.cache.put(node, n.generation, s);
        s
    }
}
