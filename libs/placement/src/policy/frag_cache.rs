//! What the fragmentation-aware policies share: a per-node cache of scores
//! and fragmentation keyed by the node's generation (a placement changes one
//! node, so everything else stays valid), and a scratch copy of a node to
//! measure "what if this demand went here".

use std::collections::HashMap;

use super::Scored;
use crate::cluster::{Cluster, Demand, Gpu, Node, EMPTY_GPU, MAX_GPUS_PER_NODE};
use crate::shape_mix::{apply, Compiled, Load, ShapeMix};

const SLOTS: usize = 8;

#[derive(Debug, Clone, Copy)]
struct Entry {
    generation: u64,
    shape: u32,
    gpus: u32,
    score: f64,
    tiebreak: f64,
}

const EMPTY_ENTRY: Entry = Entry {
    generation: u64::MAX,
    shape: u32::MAX,
    gpus: 0,
    score: 0.0,
    tiebreak: 0.0,
};

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
/// fragmentation, and a direct-mapped table of scores per demand shape.
#[derive(Debug, Clone, Default)]
pub struct NodeCache {
    entries: Vec<Entry>,
    frag: Vec<(u64, f64)>,
    second: Vec<(u64, f64)>,
    ids: HashMap<Demand, u32>,
    current: u32,
}

impl NodeCache {
    pub fn begin(&mut self, cluster: &Cluster, d: &Demand) {
        if self.frag.len() != cluster.len() {
            self.entries = vec![EMPTY_ENTRY; cluster.len() * SLOTS];
            self.frag = vec![(u64::MAX, 0.0); cluster.len()];
            self.second = vec![(u64::MAX, 0.0); cluster.len()];
        }
        let next = self.ids.len() as u32;
        self.current = *self.ids.entry(*d).or_insert(next);
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.frag.clear();
        self.second.clear();
        self.ids.clear();
    }

    #[inline]
    fn slot(&self, node: usize) -> usize {
        node * SLOTS + (self.current as usize % SLOTS)
    }

    #[inline]
    pub fn get(&self, node: usize, generation: u64) -> Option<Scored> {
        let e = &self.entries[self.slot(node)];
        (e.generation == generation && e.shape == self.current).then_some(Scored {
            score: e.score,
            tiebreak: e.tiebreak,
            gpus: e.gpus,
        })
    }

    #[inline]
    pub fn put(&mut self, node: usize, generation: u64, s: Scored) {
        let i = self.slot(node);
        self.entries[i] = Entry {
            generation,
            shape: self.current,
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
