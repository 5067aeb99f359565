//! The default policy with every idea measured around it behind a switch
//! ([`LeaseholdConfig`]), so that each one can be measured on its own:
//! `leasehold+<switch>` in `lh-sim`. With no switch it decides exactly like
//! the production `lh_placement::policy::Leasehold` (a test replays a trace
//! through both); docs/placement.md ("What we tried") has the figures.
//!
//! Sort keys are packed into the engine's (score, tiebreak) pair by hand
//! here, which is fine for an experiment and why production has its own.

use std::collections::HashMap;

use lh_placement::cluster::{Gpu, Node};
use lh_placement::policy::frag_cache::{load, NodeCache, Scratch};
use lh_placement::policy::{stranded, Policy, Scored};
use lh_placement::shape_mix::{apply, CShape, Compiled, Load, ShapeMix};
use lh_placement::{Cluster, Demand, Kind, Rng};

use crate::policy::{MAX_SPEC_CPU, MAX_SPEC_GPU};

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
    /// Inside the node, choose a slice's GPU by the eventual idle milli
    /// (`Compiled::eventual`) instead of F'.
    pub gpu_eventual: bool,
    /// Inside the node, choose the tightest GPU.
    pub gpu_tight: bool,
    /// Break ties by the change of the eventual idle milli of the node.
    pub tie_eventual: bool,
    /// Break ties by fill-up stranding plus eventual idle milli.
    pub tie_fill_eventual: bool,
    /// Add the node's eventual idle milli to the primary measure.
    pub sum_eventual: bool,
    /// Use the recursive FGD fragment table wherever the eventual idle milli
    /// is used.
    pub recursive: bool,
    /// With `tie_eventual_frac`, break ties left by the table by the
    /// fill-up stranding.
    pub tie_then_fill: bool,
    /// Break ties of slices by the node's recursive fragment with only the
    /// shapes its CPU and memory still fit.
    pub node_recursive: bool,
    /// Score every demand by the change of the node's recursive fragment
    /// (with the shapes its CPU and memory fit) instead of F.
    pub primary_node_recursive: bool,
    /// Weight each shape by its share of the workload over the number of
    /// copies the cluster can still host (renormalised), rescaled at every
    /// 1% of capacity allocated.
    pub scarcity: bool,
    /// Leave ties of slices to the node order.
    pub frac_order_only: bool,
    /// Score slices by the change of the eventual table instead of F.
    pub primary_recursive: bool,
    /// Break ties left by the fill-up stranding by the eventual idle milli.
    pub tie_then_eventual: bool,
    /// Break ties of slices by the change of the chosen GPU's table value
    /// (`recursive` or eventual), of others by the fill-up stranding. A
    /// slice's remaining ties go to the node order.
    pub tie_eventual_frac: bool,
    /// Among candidates equal on (score, tie-break), prefer a node that
    /// already holds a lease over an untouched one (then the node order),
    /// for slices (`used_frac`) and for other tasks (`used_other`).
    pub used_frac: bool,
    pub used_other: bool,
    /// Cut the recursive table after this many fitting placements (the
    /// lookahead of `Compiled::recursive_depth`); `None`: unbounded.
    pub depth: Option<u32>,
    /// Score slices (`hybrid_frac`) / every task (`hybrid_all`) by the change
    /// of F with each touched GPU's one-step fragment `D_0(f)` replaced by its
    /// recursive fragment `R(f)` (node-level CPU/memory terms kept).
    pub hybrid_frac: bool,
    pub hybrid_all: bool,
    /// Inside the node, choose a slice's GPU by the hybrid F' too.
    pub hybrid_gpu: bool,
    /// A slice that opens an untouched GPU breaks the ties left by the table
    /// by the fill-up stranding (every untouched GPU of a model has the same
    /// table value, so those ties would go to the node order).
    pub fresh_fill: bool,
    /// Divide the slices' integer score by this (coarser ties, more room for
    /// the table); 0 or 1: as FGD.
    pub slice_score_divisor: u32,
    /// Score slices by `floor((F - F') / slice_bin)` instead of FGD's
    /// sigmoid (0: off).
    pub slice_bin: f64,
    /// While at most this many nodes with 8 or more GPUs are untouched, a
    /// task that is not a multi-GPU gang goes to one of them only when no
    /// other node can take it (0: off).
    pub gang_reserve: u32,
    /// The sum-of-squares rule of online bin packing (Csirik, Johnson,
    /// Kenyon, Orlin, Shor and Weber, 2006) for slices: the placement that
    /// least increases `Σ_h N(h)²`, where `N(h)` counts the GPUs in use with
    /// `h` free milli. 1: instead of the table as the tie-break, 2: after
    /// the table, 3: before the table. 0: off.
    pub sum_squares: u8,
    /// Slices by their cost against the best packing of the workload's
    /// slices (the cutting-stock LP's shares, [`lh_placement::packing`]):
    /// 1: instead of the table as the tie-break, 2: before the table,
    /// 3: before FGD's score, 4: after the table, 5: a join it prices at 0
    /// before anything else, the rest by FGD's score, 6: as 3 with an
    /// untouched GPU a thousandth dearer than a free join. 0: off.
    pub packing_cost: u8,
    /// Inside the node, choose a slice's GPU by the packing cost first.
    pub packing_gpu: bool,
    /// The slices' packing cost only while no lease of whole GPUs waits.
    pub packing_unless_waiting: bool,
    /// Charge a placement for the GPU milli it strands: free milli of the
    /// node's GPUs that some shape of the mix fits before the placement but
    /// that no shape fits the node's CPU and memory after it. A key before
    /// FGD's score (after a slice's packing cost): 1 every task, 2 every
    /// task but slices, 3 slices only; 4 slices, before the packing cost;
    /// 5 slices, after FGD's score. 0: off (version 3 and before). The
    /// default is 1 (version 4).
    pub strand: u8,
    /// Whole-GPU and CPU-only tasks: a node that already holds a lease
    /// before an untouched one, ahead of the fill-up stranding (`usedw`
    /// puts it after).
    pub used_first: bool,
    /// Count the task list's multi-GPU whole-GPU shapes that the 95% cut
    /// leaves out in the fill-up stranding (not in F, the tables or the LP).
    /// The mix given must then be the uncut one
    /// ([`crate::trace::mix_for`] gives it for this switch).
    pub fill_multi: bool,
    /// With `fill_multi`: those shapes weighted by their GPUs (a task of 8
    /// counts 8 times), as their share of GPU demand is.
    pub fill_multi_by_gpus: bool,
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
            "gev" => self.gpu_eventual = true,
            "gtight" => self.gpu_tight = true,
            "tev" => self.tie_eventual = true,
            "tfev" => self.tie_fill_eventual = true,
            "sumev" => self.sum_eventual = true,
            "rec" => self.recursive = true,
            "draw" => self.recursive = false,
            "notevf" => self.tie_eventual_frac = false,
            // The defaults of versions 1, 2 and 3 (docs/placement.md, "What
            // we tried").
            "v1" => {
                self.recursive = false;
                self.tie_eventual_frac = false;
                self.packing_cost = 0;
                self.strand = 0;
            }
            "v2" => {
                self.packing_cost = 0;
                self.strand = 0;
            }
            "v3" => self.strand = 0,
            "pfr" => self.primary_recursive = true,
            "cpurec" => self.node_recursive = true,
            "prn" => self.primary_node_recursive = true,
            "tforder" => self.frac_order_only = true,
            "scarce" => self.scarcity = true,
            "thenfill" => self.tie_then_fill = true,
            "tfthen" => self.tie_then_eventual = true,
            "tevf" => self.tie_eventual_frac = true,
            "used" => {
                self.used_frac = true;
                self.used_other = true;
            }
            "usedf" => self.used_frac = true,
            "usedw" => self.used_other = true,
            "usedfirst" => self.used_first = true,
            "fillmg" => self.fill_multi = true,
            "fillmgd" => {
                self.fill_multi = true;
                self.fill_multi_by_gpus = true;
            }
            "hyb" => self.hybrid_frac = true,
            "ff" => self.fresh_fill = true,
            o if o.starts_with("gr=") => self.gang_reserve = o[3..].parse().ok()?,
            o if o.starts_with("ss=") => {
                self.sum_squares = o[3..].parse().ok().filter(|k| *k <= 3)?
            }
            o if o.starts_with("sb=") => {
                self.slice_bin = o[3..].parse().ok().filter(|b: &f64| *b >= 0.0)?
            }
            o if o.starts_with("lp=") => {
                self.packing_cost = o[3..].parse().ok().filter(|k| *k <= 6)?
            }
            "lpg" => self.packing_gpu = true,
            "lpwait" => self.packing_unless_waiting = true,
            o if o.starts_with("st=") => self.strand = o[3..].parse().ok().filter(|k| *k <= 5)?,
            o if o.starts_with("sdiv=") => self.slice_score_divisor = o[5..].parse().ok()?,
            "hyba" => self.hybrid_all = true,
            "hybg" => {
                self.hybrid_frac = true;
                self.hybrid_gpu = true;
            }
            d if d.starts_with("depth=") => self.depth = Some(d[6..].parse().ok()?),
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
            gpu_eventual: false,
            gpu_tight: false,
            tie_eventual: false,
            tie_fill_eventual: false,
            sum_eventual: false,
            tie_then_eventual: false,
            recursive: true,
            primary_recursive: false,
            node_recursive: false,
            primary_node_recursive: false,
            frac_order_only: false,
            scarcity: false,
            tie_then_fill: false,
            tie_eventual_frac: true,
            used_frac: false,
            used_other: false,
            depth: None,
            hybrid_frac: false,
            hybrid_all: false,
            hybrid_gpu: false,
            fresh_fill: false,
            slice_score_divisor: 0,
            slice_bin: 0.0,
            gang_reserve: 0,
            sum_squares: 0,
            packing_cost: 3,
            packing_gpu: false,
            packing_unless_waiting: false,
            strand: 1,
            used_first: false,
            fill_multi: false,
            fill_multi_by_gpus: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Ablation {
    mix: ShapeMix,
    cfg: LeaseholdConfig,
    compiled: Option<Compiled>,
    cache: NodeCache,
    /// Recursive tables by (GPU model, shapes the node's CPU/memory fit).
    masked: HashMap<(u16, u64), Vec<f32>>,
    /// With `scarcity`: the shapes' weights as given, and the allocated
    /// milli when the weights were last rescaled.
    base: Vec<f64>,
    rescaled_at: Option<u64>,
    /// Per GPU model: `R(f) - D_0(f)` (see `hybrid_frac`).
    excess: Vec<Vec<f32>>,
    /// Untouched nodes with 8 or more GPUs (with `gang_reserve`).
    untouched_big: u32,
    /// GPUs in use by free milli, `N(h)` for 0 < h < 1000 (with
    /// `sum_squares`).
    gaps: Vec<i64>,
    /// With `fill_multi`: the multi-GPU shapes beyond the cut, weighted
    /// against the cut mix, and compiled against the cluster.
    gang_mix: ShapeMix,
    gang_shapes: Vec<CShape>,
    /// Leases of whole GPUs wait for room now.
    whole_waiting: bool,
}

impl Ablation {
    pub fn new(mix: ShapeMix) -> Self {
        Self::with_config(mix, LeaseholdConfig::default())
    }

    pub fn with_config(mix: ShapeMix, cfg: LeaseholdConfig) -> Self {
        let (mix, gang_mix) = if cfg.fill_multi {
            let (cut, mut gangs) = split_multi(mix);
            if cfg.fill_multi_by_gpus {
                for s in &mut gangs.shapes {
                    if let lh_placement::GpuDemand::Whole { count } = s.gpu {
                        s.weight *= f64::from(count);
                    }
                }
            }
            (cut, gangs)
        } else {
            (mix, ShapeMix::default())
        };

        Ablation {
            gang_mix,
            gang_shapes: Vec::new(),
            whole_waiting: false,
            mix,
            cfg,
            compiled: None,
            cache: NodeCache::default(),
            masked: HashMap::new(),
            base: Vec::new(),
            rescaled_at: None,
            excess: Vec::new(),
            untouched_big: 0,
            gaps: vec![0; 1001],
        }
    }

    pub fn config(&self) -> LeaseholdConfig {
        self.cfg
    }

    pub fn set_mix(&mut self, mix: ShapeMix) {
        self.mix = mix;
        self.compiled = None;
        self.cache.clear();
        self.masked.clear();
    }
}

impl Policy for Ablation {
    fn name(&self) -> &'static str {
        "leasehold"
    }
    fn version(&self) -> u32 {
        4
    }

    fn begin(&mut self, cluster: &Cluster, d: &Demand) {
        if self
            .compiled
            .as_ref()
            .is_none_or(|c| c.models_seen != cluster.models().len())
        {
            self.compiled = Some(if self.cfg.demand_weighted {
                Compiled::new_demand_weighted(&self.mix, cluster)
            } else {
                Compiled::new(&self.mix, cluster)
            });
            if let (Some(k), Some(c)) = (self.cfg.depth, self.compiled.as_mut()) {
                c.recursive = (0..c.models_seen)
                    .map(|m| c.recursive_depth(1u64 << m, k))
                    .collect();
            }
            if let Some(c) = self.compiled.as_ref() {
                self.excess = (0..c.models_seen)
                    .map(|m| {
                        let d0 = c.recursive_depth(1u64 << m, 0);
                        c.recursive[m].iter().zip(d0).map(|(r, d)| r - d).collect()
                    })
                    .collect();
            }
            self.gang_shapes = Compiled::new(&self.gang_mix, cluster).shapes;
            self.cache.clear();
            self.masked.clear();
            self.base = self
                .compiled
                .as_ref()
                .map(|c| c.shapes.iter().map(|s| s.weight).collect())
                .unwrap_or_default();
            self.rescaled_at = None;
        }
        if self.cfg.scarcity {
            let used = cluster.gpu_milli_used();
            let step = cluster.gpu_milli_total() / 100;
            if self
                .rescaled_at
                .is_none_or(|u| used.abs_diff(u) >= step.max(1))
            {
                self.rescaled_at = Some(used);
                let c = self.compiled.as_mut().expect("compiled above");
                c.rescale_by_scarcity(&self.base, cluster, self.cfg.memory);
                self.cache.clear();
            }
        }
        self.cache.begin(cluster, d);
        // Both counts are global, so they stay out of the per-node cache:
        // recounted here, applied in `score` on top of the cached value.
        if self.cfg.sum_squares > 0 {
            self.gaps.iter_mut().for_each(|x| *x = 0);
            for g in cluster.nodes().iter().flat_map(|n| &n.gpus) {
                if g.leases > 0 && g.milli_free > 0 {
                    self.gaps[usize::from(g.milli_free)] += 1;
                }
            }
        }
        if self.cfg.gang_reserve > 0 {
            self.untouched_big = cluster.nodes().iter().filter(|n| untouched_big(n)).count() as u32;
        }
    }

    fn set_whole_waiting(&mut self, waiting: bool) {
        if self.cfg.packing_unless_waiting && waiting != self.whole_waiting {
            self.cache.clear();
        }
        self.whole_waiting = waiting;
    }

    fn score(&mut self, cluster: &Cluster, node: usize, d: &Demand, _rng: &mut Rng) -> Scored {
        let mut s = self.score_cached(cluster, node, d);
        if let (k @ 1..=3, Kind::Frac { milli, .. }) = (self.cfg.sum_squares, d.kind) {
            if s.gpus != 0 {
                let g = &cluster.node(node).gpus[s.gpus.trailing_zeros() as usize];
                let v = -(sum_squares_delta(&self.gaps, g, milli) as f64);
                s.tiebreak = match k {
                    1 => v,
                    // Table deltas rounded to a thousandth of a milli, so
                    // that equal states compare equal.
                    2 => (s.tiebreak * 1e3).round() * 1e7 + v,
                    _ => v * 1e7 + s.tiebreak,
                };
            }
        }
        if self.cfg.gang_reserve > 0
            && self.untouched_big <= self.cfg.gang_reserve
            && !matches!(d.kind, Kind::Whole(k) if k >= 2)
            && untouched_big(cluster.node(node))
        {
            // Below every score a policy gives: FGD's are 0..=100, and the
            // slices' packing cost takes up to 1e6 off them.
            s.score -= 1e9;
        }
        s
    }
}

/// Cost of `milli` on `g` against the best packing, rounded to a
/// thousandth of a GPU so that equal costs compare equal.
fn packing_cost(w: &Compiled, g: &Gpu, milli: u16) -> f64 {
    (w.shares.cost(g.milli_free, milli) * 1e3).round() / 1e3
}

/// The mix as the 95% cut keeps it, and the multi-GPU whole-GPU shapes
/// it leaves out, weighted against the cut (`mix` is the uncut one, most
/// popular first, as [`ShapeMix::from_requests`] sorts it).
fn split_multi(mix: ShapeMix) -> (ShapeMix, ShapeMix) {
    let popularity = lh_placement::shape_mix::ShapeMixConfig::PUBLISHED.popularity;
    let mut covered = 0.0;
    let mut keep = 0;
    while covered < popularity - 1e-12 && keep < mix.shapes.len() {
        covered += mix.shapes[keep].weight;
        keep += 1;
    }
    let mut cut = mix.clone();
    cut.shapes.truncate(keep);
    for s in &mut cut.shapes {
        s.weight /= covered;
    }
    let gangs = mix.shapes[keep..]
        .iter()
        .filter(|s| matches!(s.gpu, lh_placement::GpuDemand::Whole { count } if count >= 2))
        .map(|s| lh_placement::shape_mix::Shape {
            weight: s.weight / covered,
            ..s.clone()
        })
        .collect();
    (cut, ShapeMix { shapes: gangs })
}

/// The fill-up stranding of multi-GPU whole-GPU shapes on a node state, as
/// [`Compiled::frag_fill`] counts it.
fn gang_fill(gangs: &[CShape], l: &Load<'_>, memory: bool) -> f64 {
    let total: u64 = l.gpus.iter().map(|g| u64::from(g.milli_free)).sum();
    let mut fill = 0.0;
    for s in gangs {
        let free = l.gpus.iter().filter(|g| g.fits_whole(s.models)).count() as u64;
        let mut units = free / u64::from(s.count.max(1));
        if let Some(c) = l.cpu_free.checked_div(s.cpu) {
            units = units.min(c);
        }
        if memory && s.memory > 0 {
            units = units.min(l.memory_free / s.memory);
        }
        let used = units * 1000 * u64::from(s.count);
        fill += s.weight * total.saturating_sub(used) as f64;
    }
    fill
}

fn untouched_big(n: &Node) -> bool {
    n.gpus.len() >= 8
        && n.cpu_free == n.cpu_total
        && n.memory_free == n.memory_total
        && n.gpus.iter().all(|g| g.leases == 0)
}

/// Change of `Σ_h N(h)²` when a slice of `milli` goes on `g` (`gaps[h]` =
/// `N(h)`; an untouched GPU and a full one are not counted).
fn sum_squares_delta(gaps: &[i64], g: &Gpu, milli: u16) -> i64 {
    let before = if g.leases == 0 {
        None
    } else {
        Some(usize::from(g.milli_free))
    };
    let after = usize::from(g.milli_free - milli);
    let mut delta = 0;
    if let Some(h) = before.filter(|&h| h > 0 && h < gaps.len()) {
        delta += 1 - 2 * gaps[h];
    }
    if after > 0 && after < 1000 {
        delta += 1 + 2 * gaps[after];
    }
    delta
}

impl Ablation {
    /// The score without the global terms, cached per node generation.
    fn score_cached(&mut self, cluster: &Cluster, node: usize, d: &Demand) -> Scored {
        let n = cluster.node(node);
        if let Some(s) = self.cache.get(node, n.generation) {
            return s;
        }
        let mut cfg = self.cfg;
        if cfg.packing_unless_waiting && self.whole_waiting {
            cfg.packing_cost = 0;
        }
        let mem = cfg.memory;
        let gang_shapes = self.gang_shapes.clone();
        let gangs = &gang_shapes;
        // (primary measure, fill-up stranding) of a node state.
        let measure = move |w: &Compiled, l: &Load<'_>| -> (f64, f64) {
            if cfg.fill_multi {
                let (a, b) = w.frag_both(l, mem);
                (a, b + gang_fill(gangs, l, mem))
            } else if cfg.sum_eventual {
                let (a, b) = w.frag_both(l, mem);
                let e: f64 = l
                    .gpus
                    .iter()
                    .map(|g| f64::from(w.eventual[usize::from(g.model)][usize::from(g.milli_free)]))
                    .sum();
                (a + e, b)
            } else if cfg.sum {
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
        let w = self.compiled.as_ref().expect("begin compiles the mix");
        let (f0, g0) = self
            .cache
            .node_pair(node, n.generation, || measure(w, &load(n)));
        let table = if cfg.recursive {
            &w.recursive
        } else {
            &w.eventual
        };
        let ev =
            |g: &Gpu| -> f64 { f64::from(table[usize::from(g.model)][usize::from(g.milli_free)]) };
        let mut scratch = Scratch::of(n);
        let ((f1, g1), set) = match d.kind {
            Kind::Frac { milli, vram_gb } => {
                let mut best: Option<((f64, f64), u16, u32, f64)> = None;
                let mut best_cost = f64::INFINITY;
                for (j, g) in n.gpus.iter().enumerate() {
                    if !g.fits_frac(milli, vram_gb, d.models) {
                        continue;
                    }
                    let cost = if cfg.packing_gpu {
                        packing_cost(w, g, milli)
                    } else {
                        0.0
                    };
                    let m = scratch.measure_after(w, d, 1 << j, n, measure);
                    let mut after = *g;
                    after.milli_free -= milli;
                    let e = ev(&after) - ev(g);
                    let m = if cfg.hybrid_gpu && !self.excess.is_empty() {
                        let t = &self.excess[usize::from(g.model)];
                        let x = f64::from(t[usize::from(after.milli_free)])
                            - f64::from(t[usize::from(g.milli_free)]);
                        (m.0 + x, m.1)
                    } else {
                        m
                    };
                    let better = match best {
                        None => true,
                        Some(_) if cfg.packing_gpu && cost != best_cost => cost < best_cost,
                        Some((bm_, bmilli, _, be)) => {
                            if cfg.gpu_tight {
                                g.milli_free < bmilli
                            } else if cfg.gpu_eventual {
                                e < be || (e == be && g.milli_free < bmilli)
                            } else {
                                m.0 < bm_.0 || (m.0 == bm_.0 && g.milli_free < bmilli)
                            }
                        }
                    };
                    if better {
                        best = Some((m, g.milli_free, 1 << j, e));
                        best_cost = cost;
                    }
                }
                let (m, _, set, _) = best.unwrap_or(((f0, g0), 0, 0, 0.0));
                let m = if cfg.hybrid_gpu {
                    // Back to F' (the hybrid term is added to the delta below).
                    let j = set.trailing_zeros() as usize;
                    scratch.measure_after(w, d, 1 << j, n, measure)
                } else {
                    m
                };
                (m, set)
            }
            _ => {
                let set = cluster.pick_default(node, d);
                (scratch.measure_after(w, d, set, n, measure), set)
            }
        };
        let eventual_delta = || -> f64 {
            match d.kind {
                Kind::Frac { milli, .. } => n
                    .gpus
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| set & (1 << j) != 0)
                    .map(|(_, g)| {
                        let mut a = *g;
                        a.milli_free -= milli;
                        ev(g) - ev(&a)
                    })
                    .sum(),
                Kind::Whole(_) => n
                    .gpus
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| set & (1 << j) != 0)
                    .map(|(_, g)| ev(g))
                    .sum(),
                _ => 0.0,
            }
        };
        let node_delta = |masked: &mut HashMap<(u16, u64), Vec<f32>>| -> f64 {
            let m0 = w.fit_mask(n.cpu_free, n.memory_free, mem);
            let m1 = w.fit_mask(n.cpu_free - d.cpu_milli, n.memory_free - d.memory_mib, mem);
            let mut acc = 0.0;
            for (j, g) in n.gpus.iter().enumerate() {
                let mut a = *g;
                if set & (1 << j) != 0 {
                    match d.kind {
                        Kind::Frac { milli, .. } => a.milli_free -= milli,
                        Kind::Whole(_) => a.milli_free = 0,
                        _ => {}
                    }
                }
                let before = masked
                    .entry((g.model, m0))
                    .or_insert_with(|| w.recursive_masked(1u64 << g.model, m0))
                    [usize::from(g.milli_free)];
                let after = masked
                    .entry((g.model, m1))
                    .or_insert_with(|| w.recursive_masked(1u64 << g.model, m1))
                    [usize::from(a.milli_free)];
                acc += f64::from(before) - f64::from(after);
            }
            acc
        };
        let delta = if cfg.primary_node_recursive {
            node_delta(&mut self.masked)
        } else if cfg.primary_recursive && matches!(d.kind, Kind::Frac { .. }) {
            eventual_delta()
        } else if cfg.hybrid_all || (cfg.hybrid_frac && matches!(d.kind, Kind::Frac { .. })) {
            let x = |g: &Gpu| -> f64 {
                f64::from(self.excess[usize::from(g.model)][usize::from(g.milli_free)])
            };
            let mut acc = f0 - f1;
            for (j, g) in n.gpus.iter().enumerate() {
                if set & (1 << j) != 0 {
                    let mut a = *g;
                    match d.kind {
                        Kind::Frac { milli, .. } => a.milli_free -= milli,
                        Kind::Whole(_) => a.milli_free = 0,
                        _ => {}
                    }
                    acc += x(g) - x(&a);
                }
            }
            acc
        } else {
            f0 - f1
        };
        let score = if cfg.slice_bin > 0.0 && matches!(d.kind, Kind::Frac { .. }) {
            (delta / cfg.slice_bin).floor()
        } else if cfg.quantise && cfg.slice_score_divisor > 1 && matches!(d.kind, Kind::Frac { .. })
        {
            let s = ((1.0 / (1.0 + (-delta / 1000.0).exp())) * 100.0) as i64;
            (s / i64::from(cfg.slice_score_divisor)) as f64
        } else if cfg.quantise {
            ((1.0 / (1.0 + (-delta / 1000.0).exp())) * 100.0) as i64 as f64
        } else if cfg.bucket > 0.0 {
            ((f0 - f1) / cfg.bucket).floor()
        } else {
            f0 - f1
        };
        let tiebreak = if cfg.frac_order_only && matches!(d.kind, Kind::Frac { .. }) {
            0.0
        } else if cfg.node_recursive && matches!(d.kind, Kind::Frac { .. }) {
            node_delta(&mut self.masked)
        } else if cfg.tie_then_eventual {
            // Fill-up deltas are sums of weighted milli; round them to a
            // thousandth of a milli so equal states compare equal.
            ((g0 - g1) * 1e3).round() * 1e4 + eventual_delta().clamp(-4999.0, 4999.0)
        } else if cfg.tie_eventual_frac && matches!(d.kind, Kind::Frac { .. }) {
            let fresh = set != 0 && n.gpus[set.trailing_zeros() as usize].leases == 0;
            if cfg.fresh_fill && fresh {
                (eventual_delta() * 1e3).round() * 1e4 + (g0 - g1).clamp(-4999.0, 4999.0)
            } else if cfg.tie_then_fill {
                // Table deltas are sums of weighted milli; round them to a
                // thousandth of a milli so equal states compare equal.
                (eventual_delta() * 1e3).round() * 1e4 + (g0 - g1).clamp(-4999.0, 4999.0)
            } else {
                eventual_delta()
            }
        } else if cfg.tie_eventual {
            eventual_delta()
        } else if cfg.tie_fill_eventual {
            g0 - g1 + eventual_delta()
        } else if cfg.fill_tiebreak {
            g0 - g1
        } else if cfg.pack_tiebreak {
            -((n.cpu_free - d.cpu_milli) as f64 / MAX_SPEC_CPU
                + (n.gpu_milli_free() - d.gpu_milli()) as f64 / MAX_SPEC_GPU)
        } else {
            0.0
        };
        let is_frac = matches!(d.kind, Kind::Frac { .. });
        let (score, tiebreak) = match (cfg.packing_cost, d.kind) {
            (k @ 1..=6, Kind::Frac { milli, .. }) if set != 0 => {
                let c = packing_cost(w, &n.gpus[set.trailing_zeros() as usize], milli);
                match k {
                    1 => (score, -c),
                    2 => (score, -c * 1e7 + tiebreak.clamp(-4999.0, 4999.0)),
                    // The cost is a multiple of 1/1000: times 1e6, its
                    // smallest step outranks FGD's whole range (0..=100).
                    3 => (score - c * 1e6, tiebreak),
                    // A join the packing prices at 0 before anything else;
                    // the rest (dearer joins, and untouched GPUs) by FGD.
                    5 => {
                        let g = &n.gpus[set.trailing_zeros() as usize];
                        let free_join = g.leases > 0 && c == 0.0;
                        (score - if free_join { 0.0 } else { 1e6 }, tiebreak)
                    }
                    // The cost first, an untouched GPU at least a
                    // thousandth of a GPU dearer than a free join.
                    6 => {
                        let g = &n.gpus[set.trailing_zeros() as usize];
                        let c = if g.leases == 0 { c.max(1e-3) } else { c };
                        (score - c * 1e6, tiebreak)
                    }
                    _ => (score, (tiebreak * 1e3).round() * 1e4 - c * 1e3),
                }
            }
            _ => (score, tiebreak),
        };
        let strands = match cfg.strand {
            1 => true,
            2 => !is_frac,
            3..=5 => is_frac,
            _ => false,
        };
        let score = if strands {
            let mut after = Scratch::of(n);
            apply(&mut after.gpus[..after.len], d.kind, set);
            let before = stranded(w, n.cpu_free, n.memory_free, n.gpus.iter().copied());
            let now = stranded(
                w,
                n.cpu_free - d.cpu_milli,
                n.memory_free - d.memory_mib,
                after.gpus[..after.len].iter().copied(),
            );
            // `score` is FGD's 0..=100 less 1,000 per thousandth of packing
            // cost: split it, and put the charge (whole milli, at most 8,000
            // a node) between the two, each step past the range below it.
            let charge = now.saturating_sub(before) as f64;
            let k = (-score / 1e3).ceil().max(0.0);
            match cfg.strand {
                4 => -charge * 1e10 - k * 1e3 + (score + k * 1e3),
                5 => -k * 1e10 + (score + k * 1e3) * 1e5 - charge,
                _ => -k * 1e10 - charge * 1e3 + (score + k * 1e3),
            }
        } else {
            score
        };
        let tiebreak = if cfg.used_first && !is_frac {
            let used = n.cpu_free < n.cpu_total
                || n.memory_free < n.memory_total
                || n.gpus.iter().any(|g| g.leases > 0);
            // Fill-up deltas are at most a node's free milli.
            f64::from(u8::from(used)) * 1e9 + tiebreak
        } else if (is_frac && cfg.used_frac) || (!is_frac && cfg.used_other) {
            // Tie-break values are sums of weighted milli: round them to a
            // thousandth of a milli so equal states compare equal, and append
            // one bit for "the node already holds a lease".
            let used = n.cpu_free < n.cpu_total
                || n.memory_free < n.memory_total
                || n.gpus.iter().any(|g| g.leases > 0);
            (tiebreak * 1e3).round() * 2.0 + f64::from(u8::from(used))
        } else {
            tiebreak
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

#[cfg(test)]
mod tests {
    use super::*;
    use lh_placement::SharingMode;

    fn gpu(milli_free: u16, leases: u16) -> Gpu {
        Gpu {
            model: 0,
            mode: SharingMode::VGpu,
            vram_total: 16,
            vram_free: 16,
            milli_free,
            leases,
            one_share_size: false,
            share_size: (0, 0),
        }
    }

    #[test]
    fn sum_squares_prefers_closing_common_gaps_and_opening_rare_ones() {
        let mut gaps = vec![0i64; 1001];
        gaps[300] = 5;
        gaps[200] = 1;
        // 300 -> 200: N(300) 5 -> 4, N(200) 1 -> 2: 16 - 25 + 4 - 1.
        assert_eq!(sum_squares_delta(&gaps, &gpu(300, 1), 100), -6);
        // A full GPU is not counted: only N(300) goes down.
        assert_eq!(sum_squares_delta(&gaps, &gpu(300, 1), 300), -9);
        // An untouched GPU is not counted: only N(900) goes up.
        assert_eq!(sum_squares_delta(&gaps, &gpu(1000, 0), 100), 1);
        // Opening a gap that is already common costs more.
        assert_eq!(sum_squares_delta(&gaps, &gpu(1000, 0), 700), 11);
    }

    #[test]
    fn stranded_milli_are_holes_a_shape_fits_but_not_the_nodes_cpu_or_memory() {
        use lh_placement::model::{GpuSpec, NodeSpec, Request};
        use lh_placement::shape_mix::ShapeMixConfig;
        let spec = GpuSpec {
            model: "T4".into(),
            vram_gb: 16,
            mode: SharingMode::VGpu,
        };
        let cluster = Cluster::new(&[NodeSpec::uniform("n", "z", 64_000, 1 << 20, 2, spec)]);
        let reqs = [
            Request::fraction(470, 0, 8_000, 4_096),
            Request::fraction(160, 0, 4_000, 1_024),
            Request::whole(1, 12_000, 8_192),
        ];
        let mix = ShapeMix::from_requests(
            &reqs,
            ShapeMixConfig {
                with_memory: true,
                ..ShapeMixConfig::PUBLISHED
            },
        );
        let w = Compiled::new(&mix, &cluster);
        let gpus = [gpu(530, 1), gpu(1000, 0), gpu(30, 2)];
        // Enough for everything: nothing stranded.
        assert_eq!(stranded(&w, 64_000, 1 << 20, gpus.iter().copied()), 0);
        // 4 cores: the 160 still fits both holes.
        assert_eq!(stranded(&w, 4_000, 1 << 20, gpus.iter().copied()), 0);
        // 3 cores: no shape fits the node, so both holes a shape fits are
        // stranded; the 30-milli hole fits no shape and is not counted.
        assert_eq!(stranded(&w, 3_000, 1 << 20, gpus.iter().copied()), 1_530);
        // Memory strands as CPU does.
        assert_eq!(stranded(&w, 64_000, 512, gpus.iter().copied()), 1_530);
        // 8 cores and 2 GiB: the 160 fits, the 470 (4 GiB) and the whole
        // GPU (12 cores) do not; the hole is still usable.
        assert_eq!(stranded(&w, 8_000, 2_048, gpus.iter().copied()), 0);
    }

    #[test]
    fn the_uncut_mix_splits_into_the_cut_one_and_the_gangs_it_leaves_out() {
        use lh_placement::model::Request;
        use lh_placement::shape_mix::ShapeMixConfig;
        let mut reqs = vec![Request::whole(1, 12_000, 8_192); 60];
        reqs.extend(vec![Request::fraction(470, 0, 8_000, 4_096); 37]);
        reqs.extend(vec![Request::whole(8, 88_000, 1 << 18); 2]);
        reqs.push(Request::fraction(50, 0, 4_000, 1_024));
        let cfg = ShapeMixConfig {
            with_memory: true,
            ..ShapeMixConfig::PUBLISHED
        };
        let uncut = ShapeMix::from_requests(
            &reqs,
            ShapeMixConfig {
                popularity: 1.0,
                ..cfg
            },
        );
        let (cut, gangs) = split_multi(uncut);
        // The same shapes, at the same weights up to rounding.
        let want = ShapeMix::from_requests(&reqs, cfg);
        assert_eq!(cut.shapes.len(), want.shapes.len());
        for (a, b) in cut.shapes.iter().zip(&want.shapes) {
            assert_eq!(
                (a.cpu_milli, a.memory_mib, &a.gpu),
                (b.cpu_milli, b.memory_mib, &b.gpu)
            );
            assert!((a.weight - b.weight).abs() < 1e-12, "{a:?} vs {b:?}");
        }
        // Only the 8-GPU shape of those beyond the cut (not the 50), at its
        // share of the tasks the cut covers (2 of 97).
        assert_eq!(gangs.shapes.len(), 1);
        assert_eq!(
            gangs.shapes[0].gpu,
            lh_placement::GpuDemand::Whole { count: 8 }
        );
        assert!((gangs.shapes[0].weight - 2.0 / 97.0).abs() < 1e-12);
    }

    #[test]
    fn switches_parse_and_bad_values_are_refused() {
        let mut c = LeaseholdConfig::default();
        assert_eq!(c.packing_cost, 3, "version 3 costs slices against the LP");
        assert_eq!(c.strand, 1, "version 4 charges stranded milli");
        for opt in [
            "ff",
            "gr=12",
            "ss=2",
            "sb=300",
            "sdiv=3",
            "lpg",
            "st=1",
            "usedfirst",
            "lpwait",
            "lp=5",
        ] {
            assert_eq!(c.apply(opt), Some(()), "{opt}");
        }
        assert!(c.fresh_fill && c.packing_gpu && c.used_first && c.packing_unless_waiting);
        assert_eq!(c.packing_cost, 5);
        assert_eq!(c.strand, 1);
        assert_eq!(
            (
                c.gang_reserve,
                c.sum_squares,
                c.slice_bin,
                c.slice_score_divisor
            ),
            (12, 2, 300.0, 3)
        );
        for bad in ["ss=4", "sb=-1", "gr=x", "sdiv=", "lp=7", "st=6", "nonsense"] {
            assert_eq!(c.apply(bad), None, "{bad}");
        }
        assert_eq!(c.apply("v2"), Some(()));
        assert_eq!((c.packing_cost, c.strand), (0, 0));
        // Each older version's switch turns off what came after it.
        for (v, packing_cost) in [("v1", 0), ("v2", 0), ("v3", 3)] {
            let mut c = LeaseholdConfig::default();
            assert_eq!(c.apply(v), Some(()), "{v}");
            assert_eq!((c.packing_cost, c.strand), (packing_cost, 0), "{v}");
        }
    }
}
