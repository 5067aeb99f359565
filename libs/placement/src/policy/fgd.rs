//! FGD, fragmentation gradient descent (Weng et al., "Beware of
//! Fragmentation", USENIX ATC'23), as the published simulator scores it.
//!
//! For a candidate node the score is `int(100 * sigmoid((F - F') / 1000))`,
//! where F is the node's expected fragmentation against the shape mix
//! now and F' after the placement. A slice is tried on every GPU that fits
//! and the node keeps its best GPU (the first among equal integer scores);
//! whole GPUs are the first free ones. The integer score makes many nodes
//! tie; the engine draws among them with the seed, as the Kubernetes
//! framework does.
//!
//! Per-node work is cached: a placement changes one node, so the node's
//! fragmentation and the score of each demand shape on it stay valid until
//! that node's generation moves.

use super::frag_cache::{load, sigmoid, MixMeasure, Scratch};
use super::{Policy, Scored};
use crate::cluster::{Cluster, Demand, Kind};
use crate::rng::Rng;
use crate::shape_mix::ShapeMix;

/// FGD as published.
#[derive(Debug, Clone)]
pub struct Fgd {
    measure: MixMeasure,
}

impl Fgd {
    pub fn new(mix: ShapeMix) -> Self {
        Fgd {
            measure: MixMeasure::new(mix),
        }
    }

    /// Measures against another mix of shapes from now on.
    pub fn set_mix(&mut self, mix: ShapeMix) {
        self.measure.set_mix(mix);
    }

    fn quantised(f0: f64, f1: f64) -> i64 {
        (sigmoid((f0 - f1) / 1000.0) * 100.0) as i64
    }
}

impl Policy for Fgd {
    fn name(&self) -> &'static str {
        "fgd"
    }
    fn version(&self) -> u32 {
        1
    }

    fn begin(&mut self, cluster: &Cluster, d: &Demand) {
        self.measure.begin(cluster, d);
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
        let f0 = self
            .measure
            .cache
            .node_frag(node, n.generation, || w.frag(&load(n), false));
        let mut scratch = Scratch::of(n);
        let s = match d.kind {
            Kind::Frac { milli, vram_gb } => {
                let mut best: Option<(i64, u32)> = None;
                for (j, g) in n.gpus.iter().enumerate() {
                    if !g.fits_frac(milli, vram_gb, d.models) {
                        continue;
                    }
                    let f1 = scratch.frag_after(w, d, 1 << j, false, n);
                    let s = Self::quantised(f0, f1);
                    if best.is_none_or(|(b, _)| s > b) {
                        best = Some((s, 1 << j));
                    }
                }
                let (s, set) = best.unwrap_or((0, 0));
                Scored::new(s as f64, set)
            }
            _ => {
                let set = cluster.pick_default(node, d);
                let f1 = scratch.frag_after(w, d, set, false, n);
                Scored::new(Self::quantised(f0, f1) as f64, set)
            }
        };
        self.measure.cache.put(node, n.generation, s);
        s
    }
}
