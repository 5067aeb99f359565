//! What the fragmentation-aware policies share: a per-node cache of scores
//! and fragmentation keyed by the node's generation (a placement changes one
//! node, so everything else stays valid), and a scratch copy of a node to
//! measure "what if this demand went here".

use std::collections::HashMap;

use super::Scored;
use crate::cluster::{Cluster, Demand, Gpu, Node, EMPTY_GPU, MAX_GPUS_PER_NODE};
use crate::shape_mix::{apply, Compiled, Load, ShapeMix};

/// Scores the cache keeps in all, over every node and demand: 512 Ki
/// entries of 32 bytes, 16 MiB. A cluster of 1,213 nodes keeps the scores
/// of its 432 most recent demands, one of 10,000 nodes those of its 52.
pub const SCORE_CACHE_ENTRIES_MAX: usize = 1 << 19;

#[derive(Debug, Clone, Copy)]
struct Entry {
    generation: u64,
    gpus: u32,
    score: f64,
    tiebreak: f64,
}

const EMPTY_ENTRY: Entry = Entry {
    generation: u64::MAX,
    gpus: 0,
    score: 0.0,
    tiebreak: 0.0,
};

/// One demand's scores, a slot per node.
#[derive(Debug, Clone)]
struct Table {
    demand: Demand,
    /// The decision that last read it, for reusing the least recent.
    used: u64,
    entries: Vec<Entry>,
}

/// What a fragmentation-aware policy measures with: its mix of shapes,
/// compiled against the cluster's models, and the per-node cache of what
/// it measured. Both start over when the mix changes or the cluster has
/// learnt a model since.
#[derive(Debug, Clone)]
pub struct MixMeasure {
    mix: ShapeMix,
    pub(crate) compiled: Option<Compiled>,
    pub(crate) cache: NodeCache,
    /// Bumped whenever what a score is measured against changes (the mix,
    /// or its compilation against the cluster's models).
    pub(crate) epoch: u64,
}

impl MixMeasure {
    pub fn new(mix: ShapeMix) -> Self {
        Self {
            mix,
            compiled: None,
            cache: NodeCache::default(),
            epoch: 0,
        }
    }

    pub fn set_mix(&mut self, mix: ShapeMix) {
        self.mix = mix;
        self.compiled = None;
        self.cache.clear();
        self.epoch += 1;
    }

    /// Readies a placement decision for `d`.
    pub fn begin(&mut self, cluster: &Cluster, d: &Demand) {
        if self
            .compiled
            .as_ref()
            .is_none_or(|c| c.models_seen != cluster.models().len())
        {
            self.compiled = Some(Compiled::new(&self.mix, cluster));
            self.cache.clear();
            self.epoch += 1;
        }
        self.cache.begin(cluster, d);
    }
}

/// Per-node caches keyed by the node's generation: the node's own
/// fragmentation, and the scores of the demands decided most recently, a
/// table per demand over every node. A decision reads its demand's table
/// in node order, so it walks memory in order; the number of tables is
/// bounded by [`SCORE_CACHE_ENTRIES_MAX`], and a new demand takes the least
/// recently used table over.
#[derive(Debug, Clone, Default)]
pub struct NodeCache {
    tables: Vec<Table>,
    by_demand: HashMap<Demand, usize>,
    frag: Vec<(u64, f64)>,
    second: Vec<(u64, f64)>,
    current: usize,
    decisions: u64,
}

impl NodeCache {
    pub fn begin(&mut self, cluster: &Cluster, d: &Demand) {
        let nodes = cluster.len();
        if self.frag.len() != nodes {
            self.clear();
            self.frag = vec![(u64::MAX, 0.0); nodes];
            self.second = vec![(u64::MAX, 0.0); nodes];
        }
        self.decisions += 1;
        let tables_max = (SCORE_CACHE_ENTRIES_MAX / nodes.max(1)).max(1);
        self.current = match self.by_demand.get(d) {
            Some(&t) => t,
            None if self.tables.len() < tables_max => {
                self.tables.push(Table {
                    demand: *d,
                    used: 0,
                    entries: vec![EMPTY_ENTRY; nodes],
                });
                self.by_demand.insert(*d, self.tables.len() - 1);
                self.tables.len() - 1
            }
            None => {
                let t = (0..self.tables.len())
                    .min_by_key(|&t| self.tables[t].used)
                    .expect("at least one table");
                let table = &mut self.tables[t];
                self.by_demand.remove(&table.demand);
                table.demand = *d;
                table.entries.fill(EMPTY_ENTRY);
                self.by_demand.insert(*d, t);
                t
            }
        };
        self.tables[self.current].used = self.decisions;
    }

    pub fn clear(&mut self) {
        self.tables.clear();
        self.by_demand.clear();
        self.frag.clear();
        self.second.clear();
    }

    #[inline]
    pub fn get(&self, node: usize, generation: u64) -> Option<Scored> {
        let e = &self.tables[self.current].entries[node];
        (e.generation == generation).then_some(Scored {
            score: e.score,
            tiebreak: e.tiebreak,
            gpus: e.gpus,
        })
    }

    #[inline]
    pub fn put(&mut self, node: usize, generation: u64, s: Scored) {
        self.tables[self.current].entries[node] = Entry {
            generation,
            gpus: s.gpus,
            score: s.score,
            tiebreak: s.tiebreak,
        };
    }

    /// Two per-node measures computed together, cached like
    /// [`NodeCache::node_frag`].
    #[inline]
    pub fn node_pair(
        &mut self,
        node: usize,
        generation: u64,
        f: impl FnOnce() -> (f64, f64),
    ) -> (f64, f64) {
        if self.frag[node].0 != generation || self.second[node].0 != generation {
            let (a, b) = f();
            self.frag[node] = (generation, a);
            self.second[node] = (generation, b);
        }
        (self.frag[node].1, self.second[node].1)
    }

    #[inline]
    pub fn node_frag(&mut self, node: usize, generation: u64, f: impl FnOnce() -> f64) -> f64 {
        let e = &mut self.frag[node];
        if e.0 != generation {
            *e = (generation, f());
        }
        e.1
    }
}

/// Scratch copy of one node's free resources, to evaluate "what if".
pub struct Scratch {
    pub cpu_free: u64,
    pub memory_free: u64,
    pub model_mask: u64,
    pub gpus: [Gpu; MAX_GPUS_PER_NODE],
    pub len: usize,
}

impl Scratch {
    pub fn of(n: &Node) -> Self {
        let mut gpus = [EMPTY_GPU; MAX_GPUS_PER_NODE];
        gpus[..n.gpus.len()].copy_from_slice(&n.gpus);
        Scratch {
            cpu_free: n.cpu_free,
            memory_free: n.memory_free,
            model_mask: n.model_mask,
            gpus,
            len: n.gpus.len(),
        }
    }

    /// Fragmentation after placing `d` on `set` (then undone).
    pub fn frag_after(
        &mut self,
        w: &Compiled,
        d: &Demand,
        set: u32,
        memory: bool,
        node: &Node,
    ) -> f64 {
        self.measure_after(w, d, set, node, |w, l| w.frag(l, memory))
    }

    /// Any measure of the node after placing `d` on `set` (then undone).
    pub fn measure_after<T>(
        &mut self,
        w: &Compiled,
        d: &Demand,
        set: u32,
        node: &Node,
        measure: impl Fn(&Compiled, &Load<'_>) -> T,
    ) -> T {
        apply(&mut self.gpus[..self.len], d.kind, set);
        let f = measure(
            w,
            &Load {
                cpu_free: self.cpu_free - d.cpu_milli,
                memory_free: self.memory_free - d.memory_mib,
                model_mask: self.model_mask,
                gpus: &self.gpus[..self.len],
            },
        );
        for j in 0..self.len {
            if set & (1 << j) != 0 {
                self.gpus[j] = node.gpus[j];
            }
        }
        f
    }
}

pub fn load(n: &Node) -> Load<'_> {
    Load {
        cpu_free: n.cpu_free,
        memory_free: n.memory_free,
        model_mask: n.model_mask,
        gpus: &n.gpus,
    }
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuSpec, NodeSpec, Request, SharingMode};

    fn cluster(nodes: usize) -> Cluster {
        let gpu = GpuSpec {
            model: "T4".into(),
            vram_gb: 16,
            mode: SharingMode::VGpu,
        };
        let specs: Vec<NodeSpec> = (0..nodes)
            .map(|i| NodeSpec::uniform(format!("n{i}"), "z", 64_000, 1 << 20, 2, gpu.clone()))
            .collect();
        Cluster::new(&specs)
    }

    fn scored(score: f64) -> Scored {
        Scored {
            score,
            tiebreak: 0.0,
            gpus: 1,
        }
    }

    #[test]
    fn a_demand_keeps_its_scores_while_fewer_demands_than_the_bound_come_between() {
        // A bound of 8 tables at 65,536 nodes: a direct-mapped table keyed
        // by a demand's number would lose demand 0's scores to demand 8.
        let nodes = SCORE_CACHE_ENTRIES_MAX / 8;
        let c = cluster(nodes);
        let demands: Vec<Demand> = (1..=9)
            .map(|cpu| c.demand(&Request::fraction(100, 1, cpu, 0)))
            .collect();
        let mut cache = NodeCache::default();
        for (i, d) in demands[..8].iter().enumerate() {
            cache.begin(&c, d);
            cache.put(7, 3, scored(i as f64));
        }
        assert_eq!(cache.tables.len(), 8);
        for (i, d) in demands[..8].iter().enumerate() {
            cache.begin(&c, d);
            assert_eq!(cache.get(7, 3), Some(scored(i as f64)), "demand {i}");
            assert_eq!(cache.get(7, 4), None, "another generation of the node");
            assert_eq!(cache.get(6, 3), None, "another node");
        }
        // A ninth demand takes over the least recently used table (demand
        // 0's), and no more memory.
        cache.begin(&c, &demands[8]);
        assert_eq!(cache.get(7, 3), None);
        cache.put(7, 3, scored(8.0));
        assert_eq!(cache.tables.len(), 8);
        cache.begin(&c, &demands[0]);
        assert_eq!(cache.get(7, 3), None, "demand 0 was the least recent");
        // Demand 0 came back in demand 1's table; demand 2 still holds.
        cache.begin(&c, &demands[2]);
        assert_eq!(cache.get(7, 3), Some(scored(2.0)));
        cache.begin(&c, &demands[1]);
        assert_eq!(cache.get(7, 3), None);
    }

    #[test]
    fn a_replays_hundreds_of_demands_keep_their_scores_on_a_fleet_the_size_of_the_trace() {
        // A replay of the openb trace (1,213 nodes) meets a few hundred
        // demands: a cache that kept a few a node recomputed most scores.
        let c = cluster(1_213);
        let demands: Vec<Demand> = (1..=400)
            .map(|cpu| c.demand(&Request::fraction(100, 1, cpu, 0)))
            .collect();
        let mut cache = NodeCache::default();
        for (i, d) in demands.iter().enumerate() {
            cache.begin(&c, d);
            cache.put(i % 1_213, 1, scored(i as f64));
        }
        for (i, d) in demands.iter().enumerate() {
            cache.begin(&c, d);
            assert_eq!(
                cache.get(i % 1_213, 1),
                Some(scored(i as f64)),
                "demand {i}"
            );
        }
    }
}
