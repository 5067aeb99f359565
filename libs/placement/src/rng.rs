//! A small deterministic generator (SplitMix64), so that a decision is the
//! same for the same seed on every machine and every version of every
//! dependency. Not for cryptography.

/// SplitMix64's increment of the state per draw.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A draw `x` scaled into `0..n` (what [`Rng::below`] returns for it).
fn scale(x: u64, n: u64) -> u64 {
    ((u128::from(x) * u128::from(n)) >> 64) as u64
}

#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// A generator for the `seq`-th use of `seed`: independent streams for
    /// every decision of an engine without keeping a generator in the state.
    pub fn stream(seed: u64, seq: u64) -> Self {
        let mut r = Rng::new(seed ^ seq.wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// The largest `k` in `1..=last` whose `k`-th next draw, scaled into
    /// `0..k + 1`, is 0 (what reservoir sampling over `last + 1` items keeps,
    /// item 0 needing no draw), found without drawing: the state moves by
    /// one constant a draw, so the draws are read from the last back.
    pub(crate) fn last_kept(&self, last: u64) -> Option<u64> {
        let mut state = self.state.wrapping_add(GAMMA.wrapping_mul(last));
        let mut k = last;
        while k > 0 {
            if scale(mix(state), k + 1) == 0 {
                return Some(k);
            }
            state = state.wrapping_sub(GAMMA);
            k -= 1;
        }
        None
    }

    /// Draws `k` times, throwing the draws away.
    pub(crate) fn skip(&mut self, k: u64) {
        self.state = self.state.wrapping_add(GAMMA.wrapping_mul(k));
    }

    /// Uniform in `0..n` (`n > 0`), by the multiply-shift method.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        scale(self.next_u64(), n)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(Rng::stream(42, 1).next_u64(), Rng::stream(42, 2).next_u64());
    }

    #[test]
    fn peek_and_skip_see_the_draws_ahead() {
        let r = Rng::stream(42, 7);
        let mut drawn = r.clone();
        let ahead: Vec<u64> = (0..5).map(|_| drawn.next_u64()).collect();
        let mut skipped = r.clone();
        skipped.skip(3);
        assert_eq!(skipped.next_u64(), ahead[3]);
        // Reservoir sampling drawing forward keeps what reading back finds.
        for last in 1..200u64 {
            let mut forward = r.clone();
            let kept = (1..=last).filter(|&k| forward.below(k + 1) == 0).last();
            assert_eq!(r.last_kept(last), kept);
        }
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut r = Rng::new(7);
        let mut counts = [0u32; 5];
        for _ in 0..50_000 {
            counts[r.below(5) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }
}
