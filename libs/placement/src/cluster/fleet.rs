//! How nodes enter and leave the cluster's books: added from their spec,
//! compared with a spec that may have changed, and cleared back to empty.
//! Names are interned here, once per node, so that scoring compares numbers.

use std::collections::HashMap;

use super::{
    AllocError, AllocId, Cluster, Gpu, GpuSet, Node, MAX_GPUS_PER_NODE, MAX_MODELS, MAX_ZONES,
    MILLI, NO_FABRIC, TAGS,
};
use crate::mig::MigLayout;
use crate::model::{NodeSpec, SharingMode};

fn intern(names: &mut Vec<String>, ix: &mut HashMap<String, u16>, name: &str, max: usize) -> u16 {
    if let Some(&i) = ix.get(name) {
        return i;
    }
    assert!(names.len() < max, "more than {max} distinct names");
    let i = names.len() as u16;
    names.push(name.to_string());
    ix.insert(name.to_string(), i);
    i
}

impl Cluster {
    pub fn new(specs: &[NodeSpec]) -> Self {
        let mut c = Cluster::default();
        for s in specs {
            c.add_node(s);
        }
        c
    }

    /// Makes room for `nodes` more nodes at once.
    pub fn reserve(&mut self, nodes: usize) {
        self.nodes.reserve(nodes);
        self.node_allocs.reserve(nodes);
    }

    /// Adds a node (empty). Returns its index.
    pub fn add_node(&mut self, s: &NodeSpec) -> usize {
        assert!(
            s.gpus.len() <= MAX_GPUS_PER_NODE,
            "node {} has too many GPUs",
            s.id
        );
        let zones_before = self.zones.len();
        let zone = intern(&mut self.zones, &mut self.zone_ix, &s.zone, MAX_ZONES);
        if self.zones.len() > zones_before {
            let region = s.zone.rsplit_once('.').map_or(s.zone.as_str(), |(r, _)| r);
            let region = intern(&mut self.regions, &mut self.region_ix, region, MAX_ZONES);
            self.zone_region.push(region);
        }
        let fabric = match s.fabric.as_str() {
            "" => NO_FABRIC,
            label => intern(
                &mut self.fabrics,
                &mut self.fabric_ix,
                label,
                usize::from(NO_FABRIC),
            ),
        };
        let mut model_mask = 0u64;
        // A node's GPUs are mostly of one model: looked up once.
        let mut last: Option<(&str, u16)> = None;
        let gpus: Vec<Gpu> = s
            .gpus
            .iter()
            .map(|g| {
                let model = match last {
                    Some((name, id)) if name == g.model => id,
                    _ => intern(&mut self.models, &mut self.model_ix, &g.model, MAX_MODELS),
                };
                last = Some((&g.model, model));
                model_mask |= 1 << model;
                Gpu {
                    model,
                    mode: g.mode,
                    vram_total: g.vram_gb,
                    vram_free: g.vram_gb,
                    milli_free: MILLI,
                    leases: 0,
                    one_share_size: s.one_share_size_per_gpu && g.mode == SharingMode::VGpu,
                    share_size: (0, 0),
                }
            })
            .collect();
        let domains = s
            .domains
            .iter()
            .map(|d| {
                d.iter()
                    .filter(|&&i| usize::from(i) < gpus.len())
                    .fold(0u32, |m, &i| m | (1 << i))
            })
            .filter(|&m| m != 0)
            .collect();
        let mig = s
            .gpus
            .iter()
            .map(|g| match g.mode {
                SharingMode::Mig => MigLayout::new(&g.model),
                _ => None,
            })
            .collect();
        self.gpu_milli_total += gpus.len() as u64 * u64::from(MILLI);
        self.node_allocs.push(Vec::new());
        self.nodes.push(Node {
            id: s.id.clone(),
            zone,
            cpu_total: s.cpu_milli,
            memory_total: s.memory_mib,
            cpu_free: s.cpu_milli,
            memory_free: s.memory_mib,
            gpus,
            domains,
            model_mask,
            generation: 0,
            tags: [0; TAGS],
            mig,
            isolates_workloads: s.isolates_workloads,
            fabric,
        });
        self.nodes.len() - 1
    }

    /// Whether node `i` is as [`Cluster::add_node`] would make it from `s`,
    /// leases aside: same id, zone, resources, GPUs and their modes,
    /// domains and isolation.
    pub fn same_shape<'s>(&self, i: usize, s: &'s NodeSpec) -> bool {
        let n = &self.nodes[i];
        // A node's GPUs are mostly of one model: looked up once.
        let mut last: Option<(&str, Option<u16>)> = None;
        let mut model_id = |name: &'s str| match last {
            Some((seen, id)) if seen == name => id,
            _ => {
                let id = self.model_id(name);
                last = Some((name, id));
                id
            }
        };
        let gpus_alike = n.gpus.len() == s.gpus.len()
            && n.gpus.iter().zip(&s.gpus).all(|(g, spec)| {
                model_id(&spec.model) == Some(g.model)
                    && g.vram_total == spec.vram_gb
                    && g.mode == spec.mode
                    && g.one_share_size
                        == (s.one_share_size_per_gpu && spec.mode == SharingMode::VGpu)
            });
        let domains: Vec<GpuSet> = s
            .domains
            .iter()
            .map(|d| {
                d.iter()
                    .filter(|&&i| usize::from(i) < s.gpus.len())
                    .fold(0u32, |m, &i| m | (1 << i))
            })
            .filter(|&m| m != 0)
            .collect();
        n.id == s.id
            && self.zone_id(&s.zone) == Some(n.zone)
            && n.cpu_total == s.cpu_milli
            && n.memory_total == s.memory_mib
            && gpus_alike
            && n.domains == domains
            && n.isolates_workloads == s.isolates_workloads
            && match s.fabric.as_str() {
                "" => n.fabric == NO_FABRIC,
                label => self.fabric_ix.get(label) == Some(&n.fabric),
            }
    }

    /// Gives back everything held on node `i`, by allocations and by MIG
    /// instances no lease holds: the node is as it was added, at a later
    /// generation.
    pub fn clear_node(&mut self, i: usize) -> Result<(), AllocError> {
        if i >= self.nodes.len() {
            return Err(AllocError::NoSuchNode);
        }
        for id in std::mem::take(&mut self.node_allocs[i]) {
            self.release(AllocId(id))?;
        }
        let models = &self.models;
        let n = &mut self.nodes[i];
        n.cpu_free = n.cpu_total;
        n.memory_free = n.memory_total;
        n.tags = [0; TAGS];
        for (g, layout) in n.gpus.iter_mut().zip(n.mig.iter_mut()) {
            g.milli_free = MILLI;
            g.vram_free = g.vram_total;
            g.leases = 0;
            g.share_size = (0, 0);
            if g.mode == SharingMode::Mig {
                *layout = MigLayout::new(&models[usize::from(g.model)]);
            }
        }
        self.changed(i);
        Ok(())
    }
}
