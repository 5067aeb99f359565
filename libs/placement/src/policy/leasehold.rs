//! Leasehold's default policy (version 3): FGD's quantised score,
//! memory-aware, with what FGD cannot see put around it.
//!
//! * A slice goes first where it costs least against the best packing of the
//!   mix's slices (the cutting-stock LP's shares, [`crate::packing`]): that
//!   sees which holes the mix has the slices to fill, and which it does not.
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

use super::frag_cache::{load, sigmoid, MixMeasure, Scratch};
use super::{Policy, Scored};
use crate::cluster::{Cluster, Demand, Gpu, GpuSet, Kind};
use crate::rng::Rng;
use crate::shape_mix::{Compiled, Load, ShapeMix};

/// FGD's scores lie in 0..=100; one thousandth of a GPU of packing cost
/// must outrank all of them.
const FGD_SCORE_MAX: i64 = 100;
const SCORE_PER_COST_MILLI: i64 = 1_000;
const _: () = assert!(SCORE_PER_COST_MILLI > FGD_SCORE_MAX);

/// How two candidates of one decision compare: field by field, higher wins.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
struct Key {
    /// Minus the slice's cost against the best packing, in thousandths of a
    /// GPU (0 for anything that is not a slice).
    neg_packing_cost_milli: i64,
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
        Scored {
            score: (self.neg_packing_cost_milli * SCORE_PER_COST_MILLI + self.fgd_score) as f64,
            tiebreak: self.tiebreak,
            gpus,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Leasehold {
    measure: MixMeasure,
}

impl Leasehold {
    pub fn new(mix: ShapeMix) -> Self {
        Leasehold {
            measure: MixMeasure::new(mix),
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
        3
    }

    fn begin(&mut self, cluster: &Cluster, d: &Demand) {
        self.measure.begin(cluster, d);
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
        // (fragmentation F, fill-up stranding) of a node state, memory-aware.
        let measure = |w: &Compiled, l: &Load<'_>| w.frag_both(l, true);
        let (f0, fill0) = self
            .measure
            .cache
            .node_pair(node, n.generation, || measure(w, &load(n)));
        let mut scratch = Scratch::of(n);
        let ((f1, fill1), set) = match d.kind {
            Kind::Frac { milli, vram_gb } => {
                // The GPU with the lowest F', the tightest among equals.
                let mut best: Option<((f64, f64), u16, GpuSet)> = None;
                for (j, g) in n.gpus.iter().enumerate() {
                    if !g.fits_frac(milli, vram_gb, d.models) {
                        continue;
                    }
                    let m = scratch.measure_after(w, d, 1 << j, n, measure);
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
                (scratch.measure_after(w, d, set, n, measure), set)
            }
        };
        let fgd_score = (sigmoid((f0 - f1) / 1000.0) * 100.0) as i64;
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
                    fgd_score,
                    tiebreak: fragment_drop,
                }
            }
            _ => Key {
                neg_packing_cost_milli: 0,
                fgd_score,
                tiebreak: fill0 - fill1,
            },
        };
        let s = key.scored(set);
        self.measure.cache.put(node, n.generation, s);
        s
    }
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
            for fgd_score in [0, 1, 49, 50, FGD_SCORE_MAX] {
                for tiebreak in [-2.5, -0.0, 0.0, 1e-9, 300.25] {
                    keys.push(Key {
                        neg_packing_cost_milli,
                        fgd_score,
                        tiebreak,
                    });
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
            fgd_score: 0,
            tiebreak: 0.0,
        };
        let dear = Key {
            neg_packing_cost_milli: -2,
            fgd_score: FGD_SCORE_MAX,
            tiebreak: 1e9,
        };
        assert!(cheap > dear);
        assert_eq!(engine_order(cheap, dear), Some(std::cmp::Ordering::Greater));
    }
}
