//! Leasehold's default policy (version 4): FGD's quantised score,
//! memory-aware, with what FGD cannot see put around it.
//!
//! * A slice goes first where it costs least against the best packing of the
//!   mix's slices (the cutting-stock LP's shares, [`crate::packing`]): that
//!   sees which holes the mix has the slices to fill, and which it does not.
//! * Then, for every task, where it strands the least GPU milli behind the
//!   node's CPU and memory (see [`stranding_charge`]).
//! * Then FGD's score: `int(100 sigmoid((F - F') / 1000))`, where a node
//!   whose CPU or memory is too small for a shape counts as fragmented for it.
//! * A slice's ties are broken by how much of the chosen GPU's free milli is
//!   likely to stay idle for good (the recursive fragment table); those of
//!   anything else by the fill-up stranding (a node running out of CPU or
//!   memory before its GPUs).
//! * Ties left after that go to the engine's seeded node order, which is what
//!   consolidates.
//!
//! The ideas measured and left out, and the switches that reproduce them,
//! live in the `lh-placement-lab` crate; docs/placement.md has the figures.

use super::frag_cache::{load, sigmoid, MixMeasure};
use super::{Policy, Scored};
use crate::cluster::{
    Cluster, Demand, Gpu, GpuSet, Kind, Node, EMPTY_GPU, MAX_GPUS_PER_NODE, MILLI,
};
use crate::rng::Rng;
use crate::shape_mix::{apply, Compiled, Load, NodeSeen, ShapeMix};

/// FGD's scores lie in 0..=100; one milli of stranding charge must outrank
/// all of them, and one thousandth of a GPU of packing cost every charge a
/// node can make (all its GPUs' milli) above them.
const FGD_SCORE_MAX: i64 = 100;
const STRAND_MILLI_MAX: i64 = MAX_GPUS_PER_NODE as i64 * MILLI as i64;
const SCORE_PER_STRAND_MILLI: i64 = 1_000;
const SCORE_PER_COST_MILLI: i64 = 100_000_000;
const _: () = assert!(SCORE_PER_STRAND_MILLI > FGD_SCORE_MAX);
const _: () =
    assert!(SCORE_PER_COST_MILLI > STRAND_MILLI_MAX * SCORE_PER_STRAND_MILLI + FGD_SCORE_MAX);

/// How two candidates of one decision compare: field by field, higher wins.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
struct Key {
    /// Minus the slice's cost against the best packing, in thousandths of a
    /// GPU (0 for anything that is not a slice).
    neg_packing_cost_milli: i64,
    /// Minus the GPU milli the placement strands behind the node's CPU and
    /// memory ([`stranding_charge`]), 0..=[`STRAND_MILLI_MAX`].
    neg_strand_milli: i64,
    /// FGD's quantised score, 0..=100.
    fgd_score: i64,
    /// A slice: the drop of the chosen GPU's recursive fragment; anything
    /// else: the drop of the node's fill-up stranding.
    tiebreak: f64,
}

impl Key {
    /// The engine's (score, tiebreak) pair, ordered exactly like the key:
    /// the packing cost is scaled past FGD's whole range.
    fn scored(self, gpus: GpuSet) -> Scored {
        debug_assert!((0..=FGD_SCORE_MAX).contains(&self.fgd_score));
        debug_assert!((-STRAND_MILLI_MAX..=0).contains(&self.neg_strand_milli));
        Scored {
            score: (self.neg_packing_cost_milli * SCORE_PER_COST_MILLI
                + self.neg_strand_milli * SCORE_PER_STRAND_MILLI
                + self.fgd_score) as f64,
            tiebreak: self.tiebreak,
            gpus,
        }
    }
}

/// Shape views a [`Leasehold`] keeps in all, over every node: 12 bytes
/// each, 12 MiB. Where a fleet's nodes times the mix's shapes exceed it,
/// each node is seen afresh whenever it is scored.
pub const SEEN_CACHE_VIEWS_MAX: usize = 1 << 20;

/// Each node's view by the mix's shapes ([`NodeSeen`]), kept until the
/// node or the mix changes: it is the same whatever the demand, and a
/// placement changes one node.
#[derive(Debug, Clone, Default)]
struct SeenCache {
    /// Per node: the mix's epoch and the node's generation its view is of.
    stamps: Vec<(u64, u64)>,
    views: Vec<NodeSeen>,
    scratch: NodeSeen,
}

impl SeenCache {
    /// Node `node`'s view (`n`, of a cluster of `nodes`) under mix `w` of
    /// epoch `epoch`.
    fn of(&mut self, w: &Compiled, epoch: u64, node: usize, n: &Node, nodes: usize) -> &NodeSeen {
        if nodes.saturating_mul(w.shapes.len()) > SEEN_CACHE_VIEWS_MAX {
            w.node_seen(&load(n), &mut self.scratch);
            return &self.scratch;
        }
        if self.stamps.len() != nodes {
            self.stamps = vec![(u64::MAX, u64::MAX); nodes];
            self.views.resize_with(nodes, NodeSeen::default);
        }
        let view = &mut self.views[node];
        if self.stamps[node] != (epoch, n.generation) {
            w.node_seen(&load(n), view);
            self.stamps[node] = (epoch, n.generation);
        }
        view
    }
}

#[derive(Debug, Clone)]
pub struct Leasehold {
    measure: MixMeasure,
    /// Each node's shape view, as of its generation.
    seen: SeenCache,
    /// The epoch of the compiled mix, and the most CPU and the most memory
    /// a single-GPU shape of it asks for: a node left with both strands
    /// nothing.
    strand_bound: (u64, u64, u64),
}

impl Leasehold {
    pub fn new(mix: ShapeMix) -> Self {
        Leasehold {
            measure: MixMeasure::new(mix),
            seen: SeenCache::default(),
            strand_bound: (u64::MAX, 0, 0),
        }
    }

    /// Measures against another mix of shapes from now on.
    pub fn set_mix(&mut self, mix: ShapeMix) {
        self.measure.set_mix(mix);
    }
}

impl Policy for Leasehold {
    fn name(&self) -> &'static str {
        "leasehold"
    }
    fn version(&self) -> u32 {
        4
    }

    fn begin(&mut self, cluster: &Cluster, d: &Demand) {
        self.measure.begin(cluster, d);
        if self.strand_bound.0 != self.measure.epoch {
            let w = self
                .measure
                .compiled
                .as_ref()
                .expect("begin compiles the mix");
            // Only single-GPU shapes can reach a GPU's hole (see `stranded`).
            let single = || w.shapes.iter().filter(|s| !s.whole || s.count == 1);
            let cpu = single().map(|s| s.cpu).max().unwrap_or(0);
            let memory = single().map(|s| s.memory).max().unwrap_or(0);
            self.strand_bound = (self.measure.epoch, cpu, memory);
        }
    }

    fn scores_by_node(&self) -> Option<u64> {
        Some(self.measure.epoch)
    }

    fn score(&mut self, cluster: &Cluster, node: usize, d: &Demand, _rng: &mut Rng) -> Scored {
        let n = cluster.node(node);
        if let Some(s) = self.measure.cache.get(node, n.generation) {
            return s;
        }
        let w = self
            .measure
            .compiled
            .as_ref()
            .expect("begin compiles the mix");
        // (fragmentation F, fill-up stranding) of the node, memory-aware,
        // and of the node after each candidate placement: its view with
        // the GPUs the placement takes swapped.
        let seen = self.seen.of(w, self.measure.epoch, node, n, cluster.len());
        let (f0, fill0) = self.measure.cache.node_pair(node, n.generation, || {
            w.frag_both_swapped(&load(n), seen, &[], true)
        });
        let after_load = Load {
            cpu_free: n.cpu_free - d.cpu_milli,
            memory_free: n.memory_free - d.memory_mib,
            ..load(n)
        };
        let ((f1, fill1), set) = match d.kind {
            Kind::Frac { milli, vram_gb } => {
                // The GPU with the lowest F', the tightest among equals.
                // A GPU in the same state as one before it measures the
                // same and is not tighter: it cannot win, and is skipped.
                let mut best: Option<((f64, f64), u16, GpuSet)> = None;
                for (j, g) in n.gpus.iter().enumerate() {
                    if !g.fits_frac(milli, vram_gb, d.models) || n.gpus[..j].contains(g) {
                        continue;
                    }
                    let mut now = *g;
                    apply(std::slice::from_mut(&mut now), d.kind, 1);
                    let m = w.frag_both_swapped(&after_load, seen, &[(*g, now)], true);
                    let better = best.is_none_or(|(bm, bmilli, _)| {
                        m.0 < bm.0 || (m.0 == bm.0 && g.milli_free < bmilli)
                    });
                    if better {
                        best = Some((m, g.milli_free, 1 << j));
                    }
                }
                let (m, _, set) = best.unwrap_or(((f0, fill0), 0, 0));
                (m, set)
            }
            _ => {
                let set = cluster.pick_default(node, d);
                let mut swaps = [(EMPTY_GPU, EMPTY_GPU); MAX_GPUS_PER_NODE];
                let mut k = 0;
                for (j, g) in n.gpus.iter().enumerate() {
                    if set & (1 << j) != 0 {
                        let mut now = *g;
                        apply(std::slice::from_mut(&mut now), d.kind, 1);
                        swaps[k] = (*g, now);
                        k += 1;
                    }
                }
                (
                    w.frag_both_swapped(&after_load, seen, &swaps[..k], true),
                    set,
                )
            }
        };
        let fgd_score = (sigmoid((f0 - f1) / 1000.0) * 100.0) as i64;
        let (cpu_after, memory_after) = (n.cpu_free - d.cpu_milli, n.memory_free - d.memory_mib);
        let (_, cpu_max, memory_max) = self.strand_bound;
        let neg_strand_milli = if cpu_after >= cpu_max && memory_after >= memory_max {
            // Every single-GPU shape still fits the node's CPU and memory:
            // nothing is stranded after, so nothing more than before.
            0
        } else {
            -stranding_charge(w, n, d, set)
        };
        let key = match d.kind {
            Kind::Frac { milli, .. } => {
                let recursive = |g: &Gpu| -> f64 {
                    f64::from(w.recursive[usize::from(g.model)][usize::from(g.milli_free)])
                };
                let fragment_drop: f64 = n
                    .gpus
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| set & (1 << j) != 0)
                    .map(|(_, g)| {
                        let mut after = *g;
                        after.milli_free -= milli;
                        recursive(g) - recursive(&after)
                    })
                    .sum();
                let cost_milli = match set {
                    0 => 0,
                    _ => packing_cost_milli(w, &n.gpus[set.trailing_zeros() as usize], milli),
                };
                Key {
                    neg_packing_cost_milli: -cost_milli,
                    neg_strand_milli,
                    fgd_score,
                    tiebreak: fragment_drop,
                }
            }
            _ => Key {
                neg_packing_cost_milli: 0,
                neg_strand_milli,
                fgd_score,
                tiebreak: fill0 - fill1,
            },
        };
        let s = key.scored(set);
        self.measure.cache.put(node, n.generation, s);
        s
    }
}

/// The GPU milli that placing `d` on `set` of node `n` strands: free milli
/// on GPUs that some single-GPU shape of the mix fits, but none within the
/// node's free CPU and memory, after the placement less before it (0 when
/// it strands less).
///
/// FGD counts a node too short of CPU or memory for a shape as fragmented
/// for it, but weighs that by the shape's share of the mix and folds it into
/// a score quantised to 0..=100, beside losses that leave the GPUs usable:
/// taking a node's last CPU beside GPUs that still have room can score as
/// well as, or better than, a placement that keeps them reachable, and the
/// milli left behind are then lost to every later task. Charging that milli
/// outright, ahead of FGD's score, sends the task where the node's CPU and
/// memory still reach its free GPUs.
fn stranding_charge(w: &Compiled, n: &Node, d: &Demand, set: GpuSet) -> i64 {
    let after = n.gpus.iter().enumerate().map(|(j, g)| {
        let mut g = *g;
        if set & (1 << j) != 0 {
            apply(std::slice::from_mut(&mut g), d.kind, 1);
        }
        g
    });
    let now = stranded(
        w,
        n.cpu_free - d.cpu_milli,
        n.memory_free - d.memory_mib,
        after,
    );
    if now == 0 {
        return 0;
    }
    let before = stranded(w, n.cpu_free, n.memory_free, n.gpus.iter().copied());
    now.saturating_sub(before) as i64
}

/// Free milli on GPUs whose hole some single-GPU shape of the mix fits, but
/// none within `cpu_free` and `memory_free`.
pub fn stranded(
    w: &Compiled,
    cpu_free: u64,
    memory_free: u64,
    gpus: impl Iterator<Item = Gpu>,
) -> u64 {
    let mut out = 0;
    for g in gpus.filter(|g| g.milli_free > 0) {
        let mut hole = false;
        let mut reached = false;
        for s in &w.shapes {
            let fits = if s.whole {
                s.count == 1 && g.fits_whole(s.models)
            } else {
                g.fits_frac(s.milli, s.vram, s.models)
            };
            if fits {
                hole = true;
                if s.cpu <= cpu_free && s.memory <= memory_free {
                    reached = true;
                    break;
                }
            }
        }
        if hole && !reached {
            out += u64::from(g.milli_free);
        }
    }
    out
}

/// Cost of `milli` on `g` against the best packing, in thousandths of a GPU
/// (rounded, so that equal costs compare equal).
pub(crate) fn packing_cost_milli(w: &Compiled, g: &Gpu, milli: u16) -> i64 {
    (w.shares.cost(g.milli_free, milli) * 1e3).round() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine_order(a: Key, b: Key) -> Option<std::cmp::Ordering> {
        let (a, b) = (a.scored(0), b.scored(0));
        (a.score, a.tiebreak).partial_cmp(&(b.score, b.tiebreak))
    }

    #[test]
    fn the_engine_orders_candidates_exactly_like_the_key() {
        let mut keys = Vec::new();
        for neg_packing_cost_milli in [-1_500, -3, -1, 0, 2] {
            for neg_strand_milli in [-STRAND_MILLI_MAX, -8_000, -1, 0] {
                for fgd_score in [0, 1, 49, 50, FGD_SCORE_MAX] {
                    for tiebreak in [-2.5, -0.0, 0.0, 1e-9, 300.25] {
                        keys.push(Key {
                            neg_packing_cost_milli,
                            neg_strand_milli,
                            fgd_score,
                            tiebreak,
                        });
                    }
                }
            }
        }
        for &a in &keys {
            for &b in &keys {
                assert_eq!(engine_order(a, b), a.partial_cmp(&b), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn a_cheaper_slice_wins_whatever_fgd_says() {
        let cheap = Key {
            neg_packing_cost_milli: -1,
            neg_strand_milli: -STRAND_MILLI_MAX,
            fgd_score: 0,
            tiebreak: 0.0,
        };
        let dear = Key {
            neg_packing_cost_milli: -2,
            neg_strand_milli: 0,
            fgd_score: FGD_SCORE_MAX,
            tiebreak: 1e9,
        };
        assert!(cheap > dear);
        assert_eq!(engine_order(cheap, dear), Some(std::cmp::Ordering::Greater));
    }

    use crate::model::{GpuDemand, GpuSpec, NodeSpec, Request, SharingMode};
    use crate::policy::Fgd;
    use crate::shape_mix::Shape;
    use crate::Engine;

    fn slice_shape(cpu_milli: u64, weight: f64) -> Shape {
        Shape {
            cpu_milli,
            memory_mib: 0,
            gpu: GpuDemand::Fraction {
                milli: 500,
                vram_gb: 0,
            },
            models: Vec::new(),
            weight,
        }
    }

    /// Node `a`: one GPU with 500 milli free and 6,500 CPU; node `b`: four
    /// GPUs with 500 milli free each and 8,000 CPU. Slices of 500 milli ask
    /// for 4,000 or 1,000 CPU.
    fn engine_of(policy: Box<dyn Policy>, seed: u64) -> Engine {
        let gpu = GpuSpec {
            model: "T4".into(),
            vram_gb: 16,
            mode: SharingMode::VGpu,
        };
        let nodes = [
            NodeSpec::uniform("a", "z", 6_500, 1 << 20, 1, gpu.clone()),
            NodeSpec::uniform("b", "z", 8_000, 1 << 20, 4, gpu),
        ];
        let mut e = Engine::new(Cluster::new(&nodes), policy, seed);
        for (i, gpus) in [(0, 1), (1, 4)] {
            for j in 0..gpus {
                let d = e.cluster().demand(&Request::fraction(500, 0, 0, 0));
                e.cluster_mut().allocate(i, &d, 1 << j).unwrap();
            }
        }
        e
    }

    #[test]
    fn a_task_does_not_take_the_cpu_its_node_needs_to_reach_its_free_gpus() {
        let mix = ShapeMix {
            shapes: vec![
                slice_shape(4_000, 0.4),
                slice_shape(1_000, 0.4),
                Shape {
                    gpu: GpuDemand::None,
                    ..slice_shape(6_000, 0.2)
                },
            ],
        };
        let task = Request::cpu_only(6_000, 0);
        let chosen = |e: &mut Engine| {
            let (d, _) = e.schedule(&task).unwrap();
            e.cluster().node(d.node).id.clone()
        };
        for seed in 0..8 {
            // On `a` the task leaves 500 CPU: its 500 free milli fit a
            // slice of either shape, but neither slice's CPU, and stay idle.
            // On `b` it leaves 2,000: the 1,000-CPU slices still reach its
            // 2,000 free milli. FGD loses less of its measure on `a` (40
            // against 31) and sends the task there.
            let mut fgd = engine_of(Box::new(Fgd::new(mix.clone())), seed);
            assert_eq!(chosen(&mut fgd), "a", "FGD, seed {seed}");
            let mut leasehold = engine_of(Box::new(Leasehold::new(mix.clone())), seed);
            assert_eq!(chosen(&mut leasehold), "b", "seed {seed}");
        }
    }
}
