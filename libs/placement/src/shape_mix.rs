//! The shape mix: the distribution of task shapes that fragmentation
//! is measured against, and the fragmentation measure itself.
//!
//! A node's fragmentation for one shape (FGD, Weng et al., ATC'23) is the
//! free GPU milli the shape cannot use there: all of it when the node cannot
//! host the shape at all (too little CPU, too few GPUs that fit, no GPU of an
//! allowed model, or a CPU-only shape, which uses no GPU), otherwise the free
//! milli of the GPUs too small for one unit of it. The node's expected
//! fragmentation is the sum over shapes weighted by their frequency.

use std::collections::HashMap;

use crate::cluster::{Cluster, Gpu, Kind, MILLI};
use crate::model::{GpuDemand, Request};
use crate::packing::SliceShares;

/// One task shape and its share of the mix.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub cpu_milli: u64,
    /// 0 when the measure ignores memory (as the published FGD does).
    pub memory_mib: u64,
    pub gpu: GpuDemand,
    /// Any-of model list, as requested (empty for any).
    pub models: Vec<String>,
    /// Frequency, summing to 1 over the mix.
    pub weight: f64,
}

/// How a shape mix is summarised from a task list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShapeMixConfig {
    /// Keep the most frequent shapes until they cover this share of tasks
    /// (the simulator's "pod popularity threshold", 95%).
    pub popularity: f64,
    /// Count CPU-only tasks as shapes (the simulator does).
    pub include_cpu_only: bool,
    /// Give each shape the mean memory of its tasks (the simulator does not:
    /// its node model has no memory). Shapes are still told apart by CPU and
    /// GPU only, so the number of shapes stays the same.
    pub with_memory: bool,
}

impl ShapeMixConfig {
    /// The configuration of the published experiments.
    pub const PUBLISHED: ShapeMixConfig = ShapeMixConfig {
        popularity: 0.95,
        include_cpu_only: true,
        with_memory: false,
    };
}

/// The distribution of task shapes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ShapeMix {
    pub shapes: Vec<Shape>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ShapeKey {
    cpu: u64,
    milli: u16,
    count: u8,
    spec: String,
    memory: u64,
    vram: u32,
}

impl ShapeMix {
    /// Summarises requests the way the simulator picks its "typical pods":
    /// count identical shapes, sort by count (then by CPU, GPU milli, GPU
    /// count and model list, all descending), keep the shortest prefix that
    /// covers `popularity` of the tasks, renormalise.
    pub fn from_requests<'a>(
        requests: impl IntoIterator<Item = &'a Request>,
        cfg: ShapeMixConfig,
    ) -> Self {
        Self::from_counted_requests(requests.into_iter().map(|r| (r, 1)), cfg)
    }

    /// As [`ShapeMix::from_requests`] over each request repeated its count
    /// of times: many tasks of few shapes are summarised without a request
    /// for each.
    pub fn from_counted_requests<'a>(
        requests: impl IntoIterator<Item = (&'a Request, u64)>,
        cfg: ShapeMixConfig,
    ) -> Self {
        let mut counts: HashMap<ShapeKey, u64> = HashMap::new();
        let mut memory: HashMap<ShapeKey, u64> = HashMap::new();
        let mut total = 0u64;
        for (r, times) in requests {
            let (milli, count, vram) = match &r.gpu {
                GpuDemand::None => (0, 0, 0),
                GpuDemand::Whole { count } => (MILLI, *count, 0),
                GpuDemand::Fraction { milli, vram_gb } => (*milli, 1, *vram_gb),
                GpuDemand::Mig { .. } => continue,
            };
            if count == 0 && !cfg.include_cpu_only {
                continue;
            }
            let key = ShapeKey {
                // Kubernetes counts a request of 0 CPU as 100 milli.
                cpu: if r.cpu_milli == 0 { 100 } else { r.cpu_milli },
                milli,
                count,
                spec: if count == 0 {
                    String::new()
                } else {
                    r.models.join("|")
                },
                memory: 0,
                vram,
            };
            if cfg.with_memory {
                *memory.entry(key.clone()).or_default() += r.memory_mib * times;
            }
            *counts.entry(key).or_default() += times;
            total += times;
        }
        let mut list: Vec<(ShapeKey, u64)> = counts.into_iter().collect();
        list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
        let want = cfg.popularity * total as f64;
        let mut covered = 0u64;
        let mut keep = 0;
        while (covered as f64) < want && keep < list.len() {
            covered += list[keep].1;
            keep += 1;
        }
        list.truncate(keep);
        let shapes = list
            .into_iter()
            .map(|(k, c)| Shape {
                cpu_milli: k.cpu,
                memory_mib: memory.get(&k).map_or(0, |m| m / c.max(1)),
                gpu: match (k.count, k.milli) {
                    (0, _) => GpuDemand::None,
                    (1, m) if m < MILLI => GpuDemand::Fraction {
                        milli: m,
                        vram_gb: k.vram,
                    },
                    (n, _) => GpuDemand::Whole { count: n },
                },
                models: if k.spec.is_empty() {
                    Vec::new()
                } else {
                    k.spec.split('|').map(str::to_string).collect()
                },
                weight: c as f64 / covered.max(1) as f64,
            })
            .collect();
        ShapeMix { shapes }
    }

    pub fn is_empty(&self) -> bool {
        self.shapes.is_empty()
    }

    /// The single-GPU slices (milli under 1000) and their weights: what the
    /// cutting-stock LP of [`crate::packing`] packs.
    pub fn slice_sizes(&self) -> Vec<(u16, f64)> {
        self.shapes
            .iter()
            .filter_map(|s| match s.gpu {
                GpuDemand::Fraction { milli, .. } if milli < MILLI => Some((milli, s.weight)),
                _ => None,
            })
            .collect()
    }
}

/// A shape compiled against a cluster's model names.
#[derive(Debug, Clone, Copy)]
pub struct CShape {
    pub cpu: u64,
    pub memory: u64,
    /// Per-GPU milli (1000 for whole GPUs, 0 for CPU-only).
    pub milli: u16,
    pub count: u8,
    pub vram: u32,
    pub whole: bool,
    pub models: u64,
    pub weight: f64,
}

/// A shape mix compiled against a cluster.
#[derive(Debug, Clone, Default)]
pub struct Compiled {
    pub shapes: Vec<CShape>,
    /// Weight of CPU-only shapes (all free GPU milli is fragment for them).
    pub cpu_only_weight: f64,
    /// Number of model names the cluster had when compiled.
    pub models_seen: usize,
    /// Per GPU model: the expected milli a GPU with `f` free milli keeps idle
    /// for good if every task that fits it came in the mix's proportions
    /// (see [`Compiled::eventual`]), indexed by `f`.
    pub eventual: Vec<Vec<f32>>,
    /// Per GPU model: FGD's fragment of one GPU applied recursively (see
    /// [`Compiled::recursive_table`]), indexed by free milli.
    pub recursive: Vec<Vec<f32>>,
    /// The single-GPU slices' shares in the best packing of the mix
    /// (see [`crate::packing`]).
    pub shares: SliceShares,
}

impl Compiled {
    /// Compiles with each shape weighted by its share of requested GPU milli
    /// (count x milli x GPUs) instead of its share of tasks; CPU-only shapes
    /// then weigh nothing.
    pub fn new_demand_weighted(w: &ShapeMix, cluster: &Cluster) -> Self {
        let mut w = w.clone();
        for s in &mut w.shapes {
            let per = match &s.gpu {
                GpuDemand::None | GpuDemand::Mig { .. } => 0.0,
                GpuDemand::Whole { count } => f64::from(MILLI) * f64::from(*count),
                GpuDemand::Fraction { milli, .. } => f64::from(*milli),
            };
            s.weight *= per;
        }
        let total: f64 = w.shapes.iter().map(|s| s.weight).sum();
        if total > 0.0 {
            for s in &mut w.shapes {
                s.weight /= total;
            }
        }
        w.shapes.retain(|s| s.weight > 0.0);
        Self::new(&w, cluster)
    }

    pub fn new(w: &ShapeMix, cluster: &Cluster) -> Self {
        let mut c = Compiled {
            models_seen: cluster.models().len(),
            ..Compiled::default()
        };
        for s in &w.shapes {
            let (milli, count, vram, whole) = match &s.gpu {
                GpuDemand::None => {
                    c.cpu_only_weight += s.weight;
                    continue;
                }
                GpuDemand::Whole { count } => (MILLI, *count, 0, true),
                GpuDemand::Fraction { milli, vram_gb } => (*milli, 1, *vram_gb, false),
                GpuDemand::Mig { .. } => continue,
            };
            c.shapes.push(CShape {
                cpu: s.cpu_milli,
                memory: s.memory_mib,
                milli,
                count,
                vram,
                whole,
                models: cluster.model_mask(&s.models),
                weight: s.weight,
            });
        }
        c.eventual = (0..c.models_seen)
            .map(|m| c.eventual_table(1u64 << m))
            .collect();
        c.recursive = (0..c.models_seen)
            .map(|m| c.recursive_table(1u64 << m))
            .collect();
        c.shares = SliceShares::solve(&w.slice_sizes());
        c
    }

    /// FGD counts a GPU's free milli `f` as fragment for the share of the
    /// mix that cannot use it, `f x W(no fit)`. Applied to what each
    /// fitting shape would leave, `R(f) = f x W(no fit) + sum over fitting s
    /// of w_s R(f - s)`: the fragment the GPU is expected to end with if its
    /// hole is filled shape by shape. CPU-only shapes never fit.
    pub fn recursive_table(&self, model: u64) -> Vec<f32> {
        self.recursive_masked(model, u64::MAX)
    }

    /// The shapes (bit `i` for shape `i`; shapes past the 64th always set)
    /// whose CPU, and with `memory` memory, a node with these free resources
    /// still has.
    pub fn fit_mask(&self, cpu_free: u64, memory_free: u64, memory: bool) -> u64 {
        let mut m = u64::MAX;
        for (i, s) in self.shapes.iter().enumerate().take(64) {
            if cpu_free < s.cpu || (memory && memory_free < s.memory) {
                m &= !(1u64 << i);
            }
        }
        m
    }

    /// [`Compiled::recursive_table`] cut after `depth` placements: `D_0(f) =
    /// f x W(no fit)` is FGD's own fragment of one GPU, `D_k(f) = f x W(no
    /// fit) + sum over fitting s of w_s D_(k-1)(f - s)` looks `k` fitting
    /// tasks ahead (`D_inf` is the recursive table).
    pub fn recursive_depth(&self, model: u64, depth: u32) -> Vec<f32> {
        let n = usize::from(MILLI);
        let sizes: Vec<(usize, f64)> = self
            .shapes
            .iter()
            .filter(|s| s.models & model != 0 && s.milli > 0)
            .map(|s| (usize::from(s.milli), s.weight))
            .collect();
        let total = self.cpu_only_weight + self.shapes.iter().map(|s| s.weight).sum::<f64>();
        let mut prev = vec![0f32; n + 1];
        for k in 0..=depth {
            let mut e = vec![0f32; n + 1];
            for f in 1..=n {
                let (mut acc, mut fit) = (0.0, 0.0);
                for &(m, w) in &sizes {
                    if m <= f {
                        if k > 0 {
                            acc += w * f64::from(prev[f - m]);
                        }
                        fit += w;
                    }
                }
                e[f] = (acc + (total - fit) * f as f64) as f32;
            }
            prev = e;
        }
        prev
    }

    /// [`Compiled::recursive_table`] with only the shapes in `mask` fitting.
    pub fn recursive_masked(&self, model: u64, mask: u64) -> Vec<f32> {
        let n = usize::from(MILLI);
        let sizes: Vec<(usize, f64)> = self
            .shapes
            .iter()
            .enumerate()
            .filter(|(i, s)| s.models & model != 0 && (*i >= 64 || mask & (1u64 << i) != 0))
            .map(|(_, s)| s)
            .map(|s| (usize::from(s.milli), s.weight))
            .collect();
        let total = self.cpu_only_weight + self.shapes.iter().map(|s| s.weight).sum::<f64>();
        let mut e = vec![0f32; n + 1];
        for f in 1..=n {
            let (mut acc, mut fit) = (0.0, 0.0);
            for &(m, w) in &sizes {
                if m <= f && m > 0 {
                    acc += w * f64::from(e[f - m]);
                    fit += w;
                }
            }
            e[f] = (acc + (total - fit) * f as f64) as f32;
        }
        e
    }

    /// The eventual idle milli of one GPU of a model in `model`, by free
    /// milli: a GPU that no shape fits keeps all its free milli; otherwise
    /// the next task that fits it is drawn from the shapes that fit, by
    /// weight, and the GPU goes on with what that task leaves. Whole-GPU
    /// shapes fit only an untouched GPU (`f` = 1000).
    fn eventual_table(&self, model: u64) -> Vec<f32> {
        let n = usize::from(MILLI);
        let sizes: Vec<(usize, f64)> = self
            .shapes
            .iter()
            .filter(|s| s.models & model != 0)
            .map(|s| (usize::from(s.milli), s.weight))
            .collect();
        let mut e = vec![0f32; n + 1];
        for f in 1..=n {
            let (mut num, mut den) = (0.0, 0.0);
            for &(m, w) in &sizes {
                if m <= f && m > 0 {
                    num += w * f64::from(e[f - m]);
                    den += w;
                }
            }
            e[f] = if den > 0.0 {
                (num / den) as f32
            } else {
                f as f32
            };
        }
        e
    }
}

/// The free resources of one node, possibly after a hypothetical placement.
pub struct Load<'a> {
    pub cpu_free: u64,
    pub memory_free: u64,
    pub model_mask: u64,
    pub gpus: &'a [Gpu],
}

impl Compiled {
    /// Expected fragmentation of a node, in milli-GPU. With `memory` the fit
    /// also needs the shape's memory (stranding by memory counts as
    /// fragmentation).
    pub fn frag(&self, l: &Load<'_>, memory: bool) -> f64 {
        let total: u64 = l.gpus.iter().map(|g| u64::from(g.milli_free)).sum();
        if total == 0 {
            return 0.0;
        }
        let t = total as f64;
        let mut f = self.cpu_only_weight * t;
        for s in &self.shapes {
            if s.models & l.model_mask == 0
                || l.cpu_free < s.cpu
                || (memory && l.memory_free < s.memory)
            {
                f += s.weight * t;
                continue;
            }
            let mut fit = 0u8;
            let mut unusable = 0u64;
            for g in l.gpus {
                let ok = if s.whole {
                    g.fits_whole(s.models)
                } else {
                    g.fits_frac(s.milli, s.vram, s.models)
                };
                if ok {
                    fit = fit.saturating_add(1);
                } else {
                    unusable += u64::from(g.milli_free);
                }
            }
            if fit >= s.count {
                f += s.weight * unusable as f64;
            } else {
                f += s.weight * t;
            }
        }
        f
    }
}

impl Compiled {
    /// Expected GPU milli left stranded if the node were filled with copies
    /// of the next task's shape: for each shape, the node can still host
    /// `u = min(GPU units, CPU / cpu, memory / memory)` copies, and
    /// `free - u x milli x gpus` stays idle. Unlike the one-step measure it
    /// sees a node running out of CPU or memory before its GPUs do.
    pub fn frag_fill(&self, l: &Load<'_>, memory: bool) -> f64 {
        let total: u64 = l.gpus.iter().map(|g| u64::from(g.milli_free)).sum();
        if total == 0 {
            return 0.0;
        }
        let t = total as f64;
        let mut f = self.cpu_only_weight * t;
        for s in &self.shapes {
            if s.models & l.model_mask == 0 {
                f += s.weight * t;
                continue;
            }
            let mut units: u64 = 0;
            if s.whole {
                let free = l.gpus.iter().filter(|g| g.fits_whole(s.models)).count() as u64;
                units = free / u64::from(s.count.max(1));
            } else {
                for g in l.gpus {
                    if g.fits_frac(s.milli, s.vram, s.models) {
                        let mut u = u64::from(g.milli_free / s.milli.max(1));
                        if let Some(v) = g.vram_free.checked_div(s.vram) {
                            u = u.min(u64::from(v));
                        }
                        units += u;
                    }
                }
            }
            if let Some(c) = l.cpu_free.checked_div(s.cpu) {
                units = units.min(c);
            }
            if memory && s.memory > 0 {
                units = units.min(l.memory_free / s.memory);
            }
            let used = units * u64::from(s.milli) * u64::from(s.count);
            f += s.weight * total.saturating_sub(used) as f64;
        }
        f
    }
}

/// What one shape sees of some GPUs: how many fit it, the free milli of
/// those that do not, and how many copies of it those that fit could host.
/// Integers, so that the view of a node with some GPUs changed is the view
/// before, less those GPUs' part, plus their part after, exactly. A node
/// has at most 32 GPUs of at most 1,000 milli each: `u32` holds any sum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShapeSeen {
    fit: u32,
    unusable: u32,
    units: u32,
}

impl ShapeSeen {
    /// What shape `s` sees of GPU `g`.
    fn of(s: &CShape, g: &Gpu) -> Self {
        let unusable = ShapeSeen {
            unusable: u32::from(g.milli_free),
            ..Self::default()
        };
        if s.whole {
            return if g.fits_whole(s.models) {
                ShapeSeen {
                    fit: 1,
                    ..Self::default()
                }
            } else {
                unusable
            };
        }
        if !g.fits_frac(s.milli, s.vram, s.models) {
            return unusable;
        }
        let mut units = u32::from(g.milli_free / s.milli.max(1));
        if let Some(v) = g.vram_free.checked_div(s.vram) {
            units = units.min(v);
        }
        ShapeSeen {
            fit: 1,
            unusable: 0,
            units,
        }
    }

    fn add(self, o: Self) -> Self {
        ShapeSeen {
            fit: self.fit + o.fit,
            unusable: self.unusable + o.unusable,
            units: self.units + o.units,
        }
    }

    fn less(self, o: Self) -> Self {
        ShapeSeen {
            fit: self.fit - o.fit,
            unusable: self.unusable - o.unusable,
            units: self.units - o.units,
        }
    }
}

/// Every shape's view of a node's GPUs (see [`Compiled::node_seen`]), and
/// their free milli. It does not change with the demand being placed: a
/// policy keeps it per node until the node changes, and measures each
/// candidate placement as this view with the GPUs it takes swapped, one
/// pass over the shapes instead of one over the shapes and every GPU.
#[derive(Debug, Clone, Default)]
pub struct NodeSeen {
    total: u64,
    shapes: Vec<ShapeSeen>,
}

impl Compiled {
    /// [`Compiled::frag`] and [`Compiled::frag_fill`] in one pass.
    pub fn frag_both(&self, l: &Load<'_>, memory: bool) -> (f64, f64) {
        let total: u64 = l.gpus.iter().map(|g| u64::from(g.milli_free)).sum();
        if total == 0 {
            return (0.0, 0.0);
        }
        let seen = self.shapes.iter().map(|s| self.shape_seen(s, l));
        self.frag_both_of(l, total, seen, memory)
    }

    /// What shape `s` sees of `l`'s GPUs (nothing for a shape of other
    /// models: the node's GPUs are all fragment for it).
    fn shape_seen(&self, s: &CShape, l: &Load<'_>) -> ShapeSeen {
        if s.models & l.model_mask == 0 {
            return ShapeSeen::default();
        }
        l.gpus
            .iter()
            .fold(ShapeSeen::default(), |a, g| a.add(ShapeSeen::of(s, g)))
    }

    /// Every shape's view of `l`'s GPUs, into `out`.
    pub fn node_seen(&self, l: &Load<'_>, out: &mut NodeSeen) {
        out.total = l.gpus.iter().map(|g| u64::from(g.milli_free)).sum();
        out.shapes.clear();
        out.shapes
            .extend(self.shapes.iter().map(|s| self.shape_seen(s, l)));
    }

    /// [`Compiled::frag_both`] of a node seen as `seen`, with the CPU,
    /// memory and models of `l` (`l.gpus` is not read), after each GPU
    /// `was` of `swaps` became its `now`: the same figures to the last bit
    /// as measuring the node so changed afresh.
    pub fn frag_both_swapped(
        &self,
        l: &Load<'_>,
        seen: &NodeSeen,
        swaps: &[(Gpu, Gpu)],
        memory: bool,
    ) -> (f64, f64) {
        let total = swaps.iter().fold(seen.total, |t, (was, now)| {
            t - u64::from(was.milli_free) + u64::from(now.milli_free)
        });
        if total == 0 {
            return (0.0, 0.0);
        }
        let shapes = self.shapes.iter().zip(&seen.shapes).map(|(s, a)| {
            if s.models & l.model_mask == 0 {
                return *a;
            }
            swaps.iter().fold(*a, |a, (was, now)| {
                a.less(ShapeSeen::of(s, was)).add(ShapeSeen::of(s, now))
            })
        });
        self.frag_both_of(l, total, shapes, memory)
    }

    /// FGD's fragment and the fill-up stranding of a node with `total`
    /// free GPU milli, each shape seeing its GPUs as `seen` says (in the
    /// order of the shapes), its CPU, memory and models as `l` says.
    fn frag_both_of(
        &self,
        l: &Load<'_>,
        total: u64,
        seen: impl Iterator<Item = ShapeSeen>,
        memory: bool,
    ) -> (f64, f64) {
        let t = total as f64;
        let mut f = self.cpu_only_weight * t;
        let mut fill = self.cpu_only_weight * t;
        for (s, a) in self.shapes.iter().zip(seen) {
            if s.models & l.model_mask == 0 {
                f += s.weight * t;
                fill += s.weight * t;
                continue;
            }
            let (fit, unusable) = (u64::from(a.fit), u64::from(a.unusable));
            let units = if s.whole {
                fit / u64::from(s.count.max(1))
            } else {
                u64::from(a.units)
            };
            let cpu_units = l.cpu_free.checked_div(s.cpu).unwrap_or(u64::MAX);
            let mem_units = if memory && s.memory > 0 {
                l.memory_free / s.memory
            } else {
                u64::MAX
            };
            if cpu_units == 0 || mem_units == 0 || fit < u64::from(s.count) {
                f += s.weight * t;
            } else {
                f += s.weight * unusable as f64;
            }
            let u = units.min(cpu_units).min(mem_units);
            let used = u * u64::from(s.milli) * u64::from(s.count);
            fill += s.weight * total.saturating_sub(used) as f64;
        }
        (f, fill)
    }
}

impl Compiled {
    /// Reweights the GPU shapes: `base[i]` over the copies of shape `i` the
    /// cluster can still host (as in [`Compiled::frag_fill`], summed over
    /// nodes), renormalised to the GPU shapes' share of the mix; a shape
    /// that fits nowhere weighs nothing.
    pub fn rescale_by_scarcity(&mut self, base: &[f64], cluster: &Cluster, memory: bool) {
        let share: f64 = base.iter().sum();
        let mut raw = vec![0.0; self.shapes.len()];
        for (i, s) in self.shapes.iter().enumerate() {
            let mut copies = 0u64;
            for n in cluster.nodes() {
                if s.models & n.model_mask == 0 {
                    continue;
                }
                let mut units: u64 = 0;
                if s.whole {
                    let free = n.gpus.iter().filter(|g| g.fits_whole(s.models)).count() as u64;
                    units = free / u64::from(s.count.max(1));
                } else {
                    for g in &n.gpus {
                        if g.fits_frac(s.milli, s.vram, s.models) {
                            units += u64::from(g.milli_free / s.milli.max(1));
                        }
                    }
                }
                if let Some(c) = n.cpu_free.checked_div(s.cpu) {
                    units = units.min(c);
                }
                if memory && s.memory > 0 {
                    units = units.min(n.memory_free / s.memory);
                }
                copies += units;
            }
            if copies > 0 {
                raw[i] = base[i] / copies as f64;
            }
        }
        let total: f64 = raw.iter().sum();
        for (s, r) in self.shapes.iter_mut().zip(raw) {
            s.weight = if total > 0.0 { r / total * share } else { 0.0 };
        }
    }
}

/// Applies a demand to a copy of a node's GPUs (for "what if" scoring).
pub fn apply(gpus: &mut [Gpu], kind: Kind, set: u32) {
    for (j, g) in gpus.iter_mut().enumerate() {
        if set & (1 << j) == 0 {
            continue;
        }
        match kind {
            Kind::Whole(_) => {
                g.milli_free = 0;
                g.vram_free = 0;
            }
            Kind::Frac { milli, vram_gb } => {
                g.milli_free -= milli;
                g.vram_free -= vram_gb;
            }
            Kind::None | Kind::Mig(_) => {}
        }
        g.leases += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuSpec, NodeSpec, SharingMode};

    #[test]
    fn depth_limited_table_runs_from_one_step_to_the_recursive_table() {
        let gpu = GpuSpec {
            model: "T4".into(),
            vram_gb: 16,
            mode: SharingMode::VGpu,
        };
        let cluster = Cluster::new(&[NodeSpec::uniform("n", "z", 64000, 1 << 20, 2, gpu)]);
        let reqs = [
            Request::fraction(470, 0, 1000, 0),
            Request::fraction(470, 0, 1000, 0),
            Request::fraction(320, 0, 1000, 0),
            Request::whole(1, 1000, 0),
            Request::cpu_only(1000, 0),
        ];
        let w = ShapeMix::from_requests(&reqs, ShapeMixConfig::PUBLISHED);
        let c = Compiled::new(&w, &cluster);
        let d0 = c.recursive_depth(1, 0);
        // One step: all of f is fragment for the shapes that do not fit it.
        assert!((d0[400] - 400.0 * 0.8).abs() < 1e-3);
        assert!((d0[500] - 500.0 * 0.4).abs() < 1e-3);
        assert!((d0[1000] - 1000.0 * 0.2).abs() < 1e-3);
        let deep = c.recursive_depth(1, 1000);
        for (a, b) in deep.iter().zip(&c.recursive[0]) {
            assert!((a - b).abs() < 1e-3);
        }
    }

    proptest::proptest! {
        /// A node seen once, some of its GPUs swapped, measures as the node
        /// measured afresh after the change: the same bits, not merely close.
        #[test]
        fn a_swapped_view_measures_as_the_node_measured_afresh(
            used in proptest::collection::vec((0u16..=1000, 0u32..=16), 1..=8),
            cpu_free in 0u64..=64_000,
            memory_free in 0u64..=(256 << 10),
            picks in proptest::collection::vec(0usize..8, 0..=3),
            milli in 1u16..=1000,
            vram in 0u32..=16,
            memory in proptest::bool::ANY,
        ) {
            let spec = GpuSpec { model: "T4".into(), vram_gb: 16, mode: SharingMode::VGpu };
            let cluster = Cluster::new(&[NodeSpec::uniform("n", "z", 64_000, 256 << 10, 8, spec)]);
            let reqs = [
                Request::fraction(470, 4, 8_000, 16 << 10),
                Request::fraction(320, 2, 4_000, 8 << 10),
                Request::fraction(810, 12, 12_000, 32 << 10),
                Request::whole(1, 12_000, 64 << 10),
                Request::whole(2, 24_000, 96 << 10),
                Request::cpu_only(8_000, 0),
            ];
            let mix = ShapeMix::from_requests(&reqs, ShapeMixConfig::PUBLISHED);
            let c = Compiled::new(&mix, &cluster);
            let mut gpus: Vec<Gpu> = cluster.node(0).gpus[..used.len()].to_vec();
            for (g, (milli_used, vram_used)) in gpus.iter_mut().zip(&used) {
                g.milli_free -= milli_used;
                g.vram_free = g.vram_free.saturating_sub(*vram_used);
                g.leases = u16::from(*milli_used > 0);
            }
            let model_mask = cluster.node(0).model_mask;
            let load = Load { cpu_free, memory_free, model_mask, gpus: &gpus };
            let mut seen = NodeSeen::default();
            c.node_seen(&load, &mut seen);
            let mut picked: Vec<usize> = picks.iter().map(|j| j % gpus.len()).collect();
            picked.sort_unstable();
            picked.dedup();
            let mut changed = gpus.clone();
            let swaps: Vec<(Gpu, Gpu)> = picked
                .iter()
                .map(|&j| {
                    let was = gpus[j];
                    changed[j].milli_free = was.milli_free.saturating_sub(milli);
                    changed[j].vram_free = was.vram_free.saturating_sub(vram);
                    (was, changed[j])
                })
                .collect();
            let swapped = c.frag_both_swapped(&load, &seen, &swaps, memory);
            let afresh = c.frag_both(&Load { cpu_free, memory_free, model_mask, gpus: &changed }, memory);
            proptest::prop_assert_eq!(swapped.0.to_bits(), afresh.0.to_bits());
            proptest::prop_assert_eq!(swapped.1.to_bits(), afresh.1.to_bits());
        }
    }
}
