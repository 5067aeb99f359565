//! What the engine knows of every node for one demand, kept between its
//! decisions. A placement changes one node, so the next decision for the
//! same demand checks and scores that node again instead of every node: at
//! ten thousand nodes a scan is what a decision costs, and a queue of a
//! thousand leases of a few shapes is a thousand scans.
//!
//! It decides exactly as the scan does ([`super::Engine::decide_demand`]
//! without it): candidates ordered by key (score, then tiebreak), the first
//! best in node order, and every later candidate tying the best so far
//! drawing from the decision's generator. Only where the scan would draw
//! does it walk the nodes, and only those before the first best one, to
//! count the draws the scan makes there.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::cluster::{Demand, Reject};
use crate::policy::Scored;
use crate::rng::Rng;

/// Demands whose index an engine keeps (the most recently used): each costs
/// about 40 bytes a node.
pub const MAX_INDEXED_DEMANDS: usize = 4;

/// A node's generation before it was looked at (a node starts at 0 and
/// counts up).
const UNSEEN: u64 = u64::MAX;

/// A candidate's place in the engine's order: score, then tiebreak. The
/// scan compares them as floats, where -0.0 equals 0.0: they are one key.
#[derive(Debug, Clone, Copy)]
struct Key(f64, f64);

impl Key {
    fn of(s: &Scored) -> Key {
        // Adding 0.0 turns -0.0 into 0.0 and leaves everything else as it is.
        Key(s.score + 0.0, s.tiebreak + 0.0)
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0).then(self.1.total_cmp(&other.1))
    }
}

/// A score the index cannot order as the scan does: a NaN (the scan's
/// order then depends on where it falls) or a -0.0 score (the scan reports
/// whichever zero it met, which the index does not keep).
fn unordered(s: &Scored) -> bool {
    s.score.is_nan() || s.tiebreak.is_nan() || (s.score == 0.0 && s.score.is_sign_negative())
}

/// Every node's verdict on one demand, as of its generation.
#[derive(Debug, Clone)]
pub struct Index {
    pub demand: Demand,
    /// The policy's epoch the scores belong to.
    epoch: u64,
    /// The cluster's change mark when the index last looked: only the nodes
    /// changed since need looking at again.
    mark: u64,
    generations: Vec<u64>,
    entries: Vec<Result<Scored, Reject>>,
    /// Candidates by key, each key's nodes in node order (a sorted vector:
    /// a tie is read whole at every decision, and changes one node).
    by_key: BTreeMap<Key, Vec<u32>>,
    rejects: [u32; Reject::ALL.len()],
    candidates: u32,
    /// Candidates whose score the index cannot order ([`unordered`]).
    unordered: u32,
}

/// What the index decided, before the engine words it.
pub struct Chosen {
    pub node: usize,
    pub scored: Scored,
    pub candidates: u32,
    pub tied: u32,
    pub runner_up: Option<f64>,
}

impl Index {
    pub fn new(demand: Demand) -> Self {
        Index {
            demand,
            epoch: 0,
            mark: 0,
            generations: Vec::new(),
            entries: Vec::new(),
            by_key: BTreeMap::new(),
            rejects: [0; Reject::ALL.len()],
            candidates: 0,
            unordered: 0,
        }
    }

    /// Makes sure every node's verdict is of its generation `generation(i)`
    /// and of `epoch`, asking `verdict` for those that are not. `changed`
    /// is the cluster's log: the nodes whose generation moved since a mark
    /// (`None` where it no longer knows), and `mark` where it is now; only
    /// those nodes are looked at, or every node when the log cannot say.
    pub fn refresh<'c>(
        &mut self,
        nodes: usize,
        epoch: u64,
        (mark, changed): (u64, impl FnOnce(u64) -> Option<&'c [u32]>),
        generation: impl Fn(usize) -> u64,
        mut verdict: impl FnMut(usize) -> Result<Scored, Reject>,
    ) {
        let fresh = self.epoch != epoch || self.generations.len() != nodes;
        if fresh {
            *self = Index::new(self.demand);
            self.epoch = epoch;
            self.generations = vec![UNSEEN; nodes];
            self.entries = vec![Err(Reject::Zone); nodes];
        }
        let mut look = |index: &mut Index, i: usize| {
            let g = generation(i);
            if index.generations[i] == g {
                return;
            }
            if index.generations[i] != UNSEEN {
                index.forget(i);
            }
            let v = verdict(i);
            index.remember(i, v);
            index.generations[i] = g;
        };
        match (fresh, changed(self.mark)) {
            (false, Some(nodes)) => nodes.iter().for_each(|&i| look(self, i as usize)),
            _ => (0..nodes).for_each(|i| look(self, i)),
        }
        self.mark = mark;
    }

    fn forget(&mut self, i: usize) {
        match &self.entries[i] {
            Err(r) => self.rejects[*r as usize] -= 1,
            Ok(s) => {
                self.candidates -= 1;
                if unordered(s) {
                    self.unordered -= 1;
                    return;
                }
                let key = Key::of(s);
                if let Some(set) = self.by_key.get_mut(&key) {
                    if let Ok(at) = set.binary_search(&(i as u32)) {
                        set.remove(at);
                    }
                    if set.is_empty() {
                        self.by_key.remove(&key);
                    }
                }
            }
        }
    }

    fn remember(&mut self, i: usize, v: Result<Scored, Reject>) {
        match &v {
            Err(r) => self.rejects[*r as usize] += 1,
            Ok(s) => {
                self.candidates += 1;
                if unordered(s) {
                    self.unordered += 1;
                } else {
                    let set = self.by_key.entry(Key::of(s)).or_default();
                    if let Err(at) = set.binary_search(&(i as u32)) {
                        set.insert(at, i as u32);
                    }
                }
            }
        }
        self.entries[i] = v;
    }

    /// Nodes refused, per [`Reject`] (indexed as `Reject::ALL`).
    pub fn rejects(&self) -> &[u32; Reject::ALL.len()] {
        &self.rejects
    }

    /// Whether the index can decide as the scan does now.
    pub fn ordered(&self) -> bool {
        self.unordered == 0
    }

    /// The scan's choice, with `rng` the decision's own generator; `None`
    /// when no node is a candidate.
    pub fn choose(&self, mut rng: Rng) -> Option<Chosen> {
        let (top, set) = self.by_key.last_key_value()?;
        let tied = set.len() as u32;
        let first = *set.first()? as usize;
        let node = if tied == 1 {
            first
        } else {
            // The scan draws once for every candidate that ties the best it
            // has met so far, the nodes before `first` included.
            let mut best: Option<Key> = None;
            let mut draws = 0u64;
            for entry in &self.entries[..first] {
                let Ok(s) = entry else { continue };
                let k = Key::of(s);
                match best {
                    Some(b) if k == b => draws += 1,
                    Some(b) if k < b => {}
                    _ => best = Some(k),
                }
            }
            rng.skip(draws);
            // The scan keeps the last tied node whose draw came up 0 (the
            // `seen`-th draw from here, out of `seen + 1`): looking from
            // the last tied node back, the first such is it.
            rng.last_kept(set.len() as u64 - 1)
                .map_or(first, |k| set[k as usize] as usize)
        };
        let runner_up = if tied > 1 {
            Some(top.0)
        } else {
            self.by_key.keys().rev().nth(1).map(|k| k.0)
        };
        let scored = self.entries[node].expect("a node of the index's candidates");
        Some(Chosen {
            node,
            scored,
            candidates: self.candidates,
            tied,
            runner_up,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_and_positive_zero_are_one_key() {
        let a = Key::of(&Scored {
            score: 5.0,
            tiebreak: -0.0,
            gpus: 0,
        });
        let b = Key::of(&Scored {
            score: 5.0,
            tiebreak: 0.0,
            gpus: 0,
        });
        assert_eq!(a, b);
        assert!(Key(5.0, 1.0) > a);
        assert!(Key(6.0, -1.0) > Key(5.0, 1.0));
    }
}
