//! What share of a GPU each slice size is worth in the best packing of the
//! mix's slices: the dual of the fractional bin-packing LP (Gilmore and
//! Gomory's cutting-stock LP), and the cost of a placement measured against
//! it.
//!
//! The LP packs the mix's slice sizes, in proportion to their weights,
//! into as few GPUs as possible, any number of slices per GPU as long as they
//! sum to at most 1000 milli. Its dual gives every size `s` a share `y_s` of
//! a GPU such that no set of slices that fits one GPU is worth more than 1,
//! maximising the mix's total. With `K(h)`, the most that slices fitting
//! `h` free milli are worth (an unbounded knapsack over the shares), putting a
//! slice `s` on a GPU with `h` free costs `K(h) - K(h - s) - y_s >= 0` GPUs:
//! how far the placement moves the GPU away from any packing the LP uses. A
//! placement that costs 0 is part of some optimal packing (complementary
//! slackness); one that costs more can only be made good by slices the
//! mix does not have enough of.
//!
//! Unlike a per-GPU expected-waste table, the shares see the competition
//! between holes: a hole that only rare slices fill is cheap to the table
//! (its fillers exist) but not to the LP (they are already spoken for).

use std::collections::HashSet;

use microlp::{ComparisonOp, OptimizationDirection, Problem};

/// Free milli of one GPU.
const CAPACITY: usize = 1000;

/// The LP takes the most common sizes only; the rest are priced as unseen
/// sizes. A live mix can have any milli from 1 to 1000, and the rare
/// sizes barely move the shares of the common ones, while each size adds a
/// variable to the LP and a term to every knapsack.
pub const LP_SIZES: usize = 32;

/// Cutting-plane rounds before the shares are taken as they are (scaled
/// back into the feasible set). Each round adds one pattern; a few dozen
/// suffice for the traces.
const MAX_ROUNDS: usize = 2_000;

/// The LP's shares and the knapsack table over them.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceShares {
    /// `share[s]`: what a slice of `s` milli is worth, in GPUs.
    share: Vec<f64>,
    /// `best[h]`: the most that the mix's slices fitting `h` free milli
    /// are worth.
    best: Vec<f64>,
}

impl Default for SliceShares {
    /// No slices: every share and every cost is 0.
    fn default() -> Self {
        SliceShares::solve(&[])
    }
}

impl SliceShares {
    /// Solves the LP for slices of these sizes (milli, 1..1000) and weights
    /// (any positive scale; equal sizes are summed). Sizes the mix does
    /// not have are worth what keeps a fresh GPU's cost at 0:
    /// `1 - K(1000 - s)`.
    pub fn solve(sizes: &[(u16, f64)]) -> Self {
        let mut weight = vec![0.0f64; CAPACITY + 1];
        for &(s, w) in sizes {
            let s = usize::from(s);
            if (1..=CAPACITY).contains(&s) && w > 0.0 {
                weight[s] += w;
            }
        }
        let mut present: Vec<usize> = (1..=CAPACITY).filter(|&s| weight[s] > 0.0).collect();
        if present.len() > LP_SIZES {
            // Heaviest first, ties to the larger size; the rest are unseen.
            present.sort_by(|&a, &b| weight[b].total_cmp(&weight[a]).then(b.cmp(&a)));
            for &s in &present[LP_SIZES..] {
                weight[s] = 0.0;
            }
            present.truncate(LP_SIZES);
            present.sort_unstable();
        }
        let mut share = vec![0.0f64; CAPACITY + 1];
        if !present.is_empty() {
            for (&s, v) in present.iter().zip(dual_shares(&present, &weight)) {
                share[s] = v;
            }
        }
        // The knapsack only counts the mix's sizes: the holes are
        // filled by what arrives.
        let values: Vec<f64> = present.iter().map(|&s| share[s]).collect();
        let (best, _) = knapsack(&present, &values);
        for s in 1..=CAPACITY {
            if weight[s] == 0.0 {
                share[s] = (1.0 - best[CAPACITY - s]).max(0.0);
            }
        }
        SliceShares { share, best }
    }

    /// What a slice of `milli` is worth, in GPUs.
    pub fn share(&self, milli: u16) -> f64 {
        self.share[usize::from(milli).min(CAPACITY)]
    }

    /// The most that slices fitting `free` milli are worth.
    pub fn best(&self, free: u16) -> f64 {
        self.best[usize::from(free).min(CAPACITY)]
    }

    /// Cost, in GPUs, of putting `milli` on a GPU with `free` milli free
    /// (`milli <= free`). Never negative.
    pub fn cost(&self, free: u16, milli: u16) -> f64 {
        let after = free.saturating_sub(milli);
        (self.best(free) - self.best(after) - self.share(milli)).max(0.0)
    }
}

/// The unbounded knapsack over `sizes` worth `value` each (by position):
/// `best[h]`, the most a multiset of them summing to at most `h` is worth,
/// and `last[h]`, the position of a size such a multiset holds (`None`:
/// the best for `h` is the best for `h - 1`).
fn knapsack(sizes: &[usize], value: &[f64]) -> (Vec<f64>, Vec<Option<usize>>) {
    let mut best = vec![0.0f64; CAPACITY + 1];
    let mut last: Vec<Option<usize>> = vec![None; CAPACITY + 1];
    for h in 1..=CAPACITY {
        best[h] = best[h - 1];
        for (i, &s) in sizes.iter().enumerate() {
            if s <= h && best[h - s] + value[i] > best[h] + 1e-12 {
                best[h] = best[h - s] + value[i];
                last[h] = Some(i);
            }
        }
    }
    (best, last)
}

/// The dual of the cutting-stock LP by cutting planes: maximise
/// `Σ w_s y_s` subject to `Σ_s a_s y_s <= 1` for every pattern `a` that fits
/// one GPU, adding the most violated pattern (from the knapsack) until none
/// is. Returns the shares in the order of `present`.
fn dual_shares(present: &[usize], weight: &[f64]) -> Vec<f64> {
    let mut lp = Problem::new(OptimizationDirection::Maximize);
    let vars: Vec<_> = present
        .iter()
        .map(|&s| lp.add_var(weight[s], (0.0, 1.0)))
        .collect();
    for (&s, &v) in present.iter().zip(&vars) {
        lp.add_constraint([(v, (CAPACITY / s) as f64)], ComparisonOp::Le, 1.0);
    }
    // The singleton LP is feasible (all zero) and bounded (all at most 1);
    // should the solver still fail, the LP's sizes are worth 0, which leaves
    // slices to the rest of the policy.
    let Some(mut sol) = lp.solve().ok().and_then(|o| o.into_solution().ok()) else {
        return vec![0.0; present.len()];
    };
    let mut added = HashSet::new();
    let mut y = vec![0.0; present.len()];
    let mut value = 1.0;
    for _ in 0..=MAX_ROUNDS {
        y = vars.iter().map(|&v| sol.var_value(v).max(0.0)).collect();
        let pattern = best_pattern(present, &y);
        value = pattern.iter().zip(&y).map(|(&a, &v)| a as f64 * v).sum();
        // The solver meets constraints to about 1e-7 (and a pattern of many
        // small slices adds that up), so a pattern already added can come
        // back: that is convergence, not a new cut.
        if value <= 1.0 + 1e-6 || !added.insert(pattern.clone()) {
            break;
        }
        let row: Vec<_> = vars
            .iter()
            .zip(&pattern)
            .filter(|(_, &a)| a > 0)
            .map(|(&v, &a)| (v, a as f64))
            .collect();
        match sol
            .add_constraint(row, ComparisonOp::Le, 1.0)
            .ok()
            .and_then(|o| o.into_solution().ok())
        {
            Some(s) => sol = s,
            // Only numerical trouble gets here (the all-zero shares stay
            // feasible).
            None => break,
        }
    }
    // Scaled back into the feasible set (`value` is the most any pattern is
    // worth at `y`), so that no cost is negative.
    let scale = value.max(1.0);
    y.iter().map(|v| v / scale).collect()
}

/// The pattern (count per size of `present`) that fits one GPU and is worth
/// the most at shares `y`.
fn best_pattern(present: &[usize], y: &[f64]) -> Vec<u32> {
    let (_, last) = knapsack(present, y);
    let mut pattern = vec![0u32; present.len()];
    let mut h = CAPACITY;
    while h > 0 {
        match last[h] {
            Some(i) => {
                pattern[i] += 1;
                h -= present[i];
            }
            None => h -= 1,
        }
    }
    pattern
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn halves_and_thirds_get_their_obvious_shares() {
        let t = SliceShares::solve(&[(500, 1.0), (330, 1.0)]);
        assert!(close(t.share(500), 0.5), "{}", t.share(500));
        assert!(close(t.share(330), 1.0 / 3.0), "{}", t.share(330));
        assert!(close(t.cost(1000, 500), 0.0));
        // A third beside a half leaves 170 nothing fills: it wastes 1/6.
        assert!(close(t.cost(500, 330), 0.5 - 1.0 / 3.0));
    }

    #[test]
    fn a_filler_spoken_for_is_worth_nothing_to_the_hole_it_fills() {
        // 800s are many and 200s few: each 800 needs a GPU of its own, so
        // a 200 is worth nothing. It costs nothing beside an 800 or where an
        // 800 can still join it, and a whole GPU where it keeps one out.
        let t = SliceShares::solve(&[(800, 10.0), (200, 1.0)]);
        assert!(close(t.share(800), 1.0));
        assert!(close(t.share(200), 0.0));
        assert!(close(t.cost(200, 200), 0.0));
        assert!(close(t.cost(1000, 200), 0.0));
        assert!(close(t.cost(900, 200), 1.0), "{}", t.cost(900, 200));
        // Never below zero, and the knapsack is monotone.
        for h in (0..=1000).step_by(10) {
            for s in (10..=h).step_by(10) {
                assert!(t.cost(h as u16, s as u16) >= 0.0);
            }
            if h >= 10 {
                assert!(t.best(h as u16) >= t.best(h as u16 - 10));
            }
        }
    }

    #[test]
    fn unseen_sizes_cost_nothing_on_a_fresh_gpu() {
        let t = SliceShares::solve(&[(470, 3.0), (320, 1.0), (650, 1.0)]);
        for s in [100u16, 250, 610, 990] {
            assert!(close(t.cost(1000, s), 0.0), "{s}: {}", t.cost(1000, s));
        }
        assert_eq!(SliceShares::solve(&[]).cost(1000, 300), 0.0);
    }

    proptest::proptest! {
        #[test]
        fn shares_are_an_optimal_dual(
            sizes in proptest::collection::vec((1u16..=1000, 1u32..50), 1..12)
        ) {
            let sizes: Vec<(u16, f64)> =
                sizes.into_iter().map(|(s, w)| (s, f64::from(w))).collect();
            let t = SliceShares::solve(&sizes);
            // Feasible: nothing that fits one GPU is worth more than one.
            proptest::prop_assert!(t.best(1000) <= 1.0 + 1e-6, "{}", t.best(1000));
            // Optimal: some GPU's worth of slices is worth exactly one (else
            // every share could grow).
            proptest::prop_assert!(t.best(1000) >= 1.0 - 1e-6, "{}", t.best(1000));
            for &(s, _) in &sizes {
                proptest::prop_assert!(t.cost(1000, s) < 1e-6);
                for h in (s..=1000).step_by(37) {
                    proptest::prop_assert!(t.cost(h, s) >= 0.0);
                }
            }
        }
    }

    #[test]
    fn the_default_traces_summary_gets_the_shares_docs_quote() {
        // The 11 slice sizes of the openb default trace's shape mix,
        // weighted by their task counts (docs/placement.md, change 5).
        let t = SliceShares::solve(&[
            (810, 1078.0),
            (650, 253.0),
            (590, 75.0),
            (550, 72.0),
            (470, 750.0),
            (460, 128.0),
            (370, 47.0),
            (320, 328.0),
            (230, 140.0),
            (220, 62.0),
            (160, 74.0),
        ]);
        let quoted = [
            (810, 1.0),
            (650, 2.0 / 3.0),
            (590, 2.0 / 3.0),
            (550, 2.0 / 3.0),
            (470, 0.5),
            (460, 0.5),
            (370, 1.0 / 3.0),
            (320, 1.0 / 3.0),
            (230, 0.25),
            (220, 1.0 / 12.0),
            (160, 0.0),
            // Outside the summary.
            (480, 0.5),
            (440, 1.0 / 3.0),
            (330, 1.0 / 3.0),
            (290, 0.25),
            (270, 0.25),
            (110, 0.0),
        ];
        for (s, y) in quoted {
            assert!(close(t.share(s), y), "{s}: {} not {y}", t.share(s));
        }
        // The worked example: a 320 beside a lone 470 costs a sixth of a GPU.
        assert!(close(t.cost(530, 320), 1.0 / 6.0), "{}", t.cost(530, 320));
        assert!(close(t.cost(1000, 320), 0.0));
    }

    #[test]
    fn any_number_of_sizes_gives_feasible_shares() {
        // A live mix: every size from 7 to 994, heavier when smaller.
        let sizes: Vec<(u16, f64)> = (7..995)
            .step_by(7)
            .map(|s| (s, 1000.0 / f64::from(s)))
            .collect();
        let t = SliceShares::solve(&sizes);
        assert!(t.best(1000) <= 1.0 + 1e-6, "{}", t.best(1000));
        assert!(t.best(1000) > 0.99, "{}", t.best(1000));
        for &(s, _) in &sizes {
            assert!(t.share(s) >= 0.0 && t.share(s) <= 1.0);
            assert!(t.cost(1000, s) < 1e-6, "{s}: {}", t.cost(1000, s));
        }
    }
}
