//! The cluster's mutable state, kept compact for the scoring loops: interned
//! models and zones, per-node free CPU and memory, per-GPU free milli and VRAM,
//! a generation counter per node (bumped on every change, so policies can
//! cache per-node work), the order in which nodes changed (so that a reader
//! keeping per-node work re-reads only those), and the live allocations.

use std::collections::HashMap;

use crate::mig::{self, MigLayout};
use crate::model::{GpuDemand, NodeSpec, Request, SharingMode};

/// Milli-GPU in one whole GPU.
pub const MILLI: u16 = 1000;
/// At most this many GPUs per node (GPU sets are bit masks).
pub const MAX_GPUS_PER_NODE: usize = 32;
/// At most this many distinct GPU models and zones (model and zone sets are
/// bit masks).
pub const MAX_MODELS: usize = 64;
pub const MAX_ZONES: usize = 64;
/// The log of changed nodes is dropped once it holds this many entries per
/// node (and at least [`MIN_CHANGES_KEPT`]): a reader that fell further
/// behind reads every node again, which costs what that many entries do.
pub const CHANGES_KEPT_PER_NODE: usize = 4;
pub const MIN_CHANGES_KEPT: usize = 4_096;

/// A set of GPU indices of one node, as a bit mask.
pub type GpuSet = u32;

/// Indices in a [`GpuSet`], ascending.
pub fn gpu_indices(set: GpuSet) -> impl Iterator<Item = u8> {
    (0..32u8).filter(move |i| set & (1 << i) != 0)
}

mod demand;
mod node;
mod reject;

pub use demand::{Demand, Kind, TAGS};
pub(crate) use node::EMPTY_GPU;
pub use node::{Gpu, Node, MIXED_SHARES};
pub use reject::{AllocError, Reject};

/// Handle of a live allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocId(pub u32);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub node: u32,
    pub demand: Demand,
    pub gpus: GpuSet,
    /// The MIG instance a MIG allocation holds.
    pub mig: Option<MigHold>,
}

/// A MIG instance held by an allocation, and what it takes of its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigHold {
    pub profile: &'static mig::MigProfile,
    pub start: u8,
    pub milli: u16,
    pub vram_gb: u32,
}

/// The cluster: nodes, interned names, live allocations.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    models: Vec<String>,
    model_ix: HashMap<String, u16>,
    zones: Vec<String>,
    zone_ix: HashMap<String, u16>,
    pub(crate) nodes: Vec<Node>,
    allocs: Vec<Option<Allocation>>,
    free_slots: Vec<u32>,
    /// Live allocation slots per node.
    node_allocs: Vec<Vec<u32>>,
    gpu_milli_total: u64,
    gpu_milli_used: u64,
    /// Nodes in the order their generation moved, from change number
    /// `changes_from` on (see [`Cluster::changed_since`]).
    changes: Vec<u32>,
    changes_from: u64,
}

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
        let zone = intern(&mut self.zones, &mut self.zone_ix, &s.zone, MAX_ZONES);
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
        });
        self.nodes.len() - 1
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn models(&self) -> &[String] {
        &self.models
    }

    pub fn model_id(&self, name: &str) -> Option<u16> {
        self.model_ix.get(name).copied()
    }

    pub fn zone_id(&self, name: &str) -> Option<u16> {
        self.zone_ix.get(name).copied()
    }

    pub fn zone_name(&self, zone: u16) -> &str {
        &self.zones[usize::from(zone)]
    }

    /// Milli-GPU of all GPUs (1000 each).
    pub fn gpu_milli_total(&self) -> u64 {
        self.gpu_milli_total
    }

    /// Milli-GPU held by live allocations.
    pub fn gpu_milli_used(&self) -> u64 {
        self.gpu_milli_used
    }

    /// The number of changes so far: a mark to ask [`Cluster::changed_since`]
    /// with later.
    pub fn change_mark(&self) -> u64 {
        self.changes_from + self.changes.len() as u64
    }

    /// The nodes whose generation moved since `mark` (a node once per
    /// change, in order), or `None` where the cluster no longer knows
    /// (the reader must look at every node).
    pub fn changed_since(&self, mark: u64) -> Option<&[u32]> {
        let from = mark.checked_sub(self.changes_from)?;
        self.changes.get(usize::try_from(from).ok()?..)
    }

    /// Node `i` changed: its generation moves, and the log says so.
    fn changed(&mut self, i: usize) {
        self.nodes[i].generation += 1;
        let kept = (self.nodes.len() * CHANGES_KEPT_PER_NODE).max(MIN_CHANGES_KEPT);
        if self.changes.len() >= kept {
            self.changes_from += self.changes.len() as u64;
            self.changes.clear();
        }
        self.changes.push(i as u32);
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

    /// Mask of the named models; names the cluster has never seen match
    /// nothing. Empty means any.
    pub fn model_mask<S: AsRef<str>>(&self, names: &[S]) -> u64 {
        if names.is_empty() {
            return u64::MAX;
        }
        names
            .iter()
            .filter_map(|n| self.model_id(n.as_ref()))
            .fold(0, |m, i| m | (1 << i))
    }

    fn zone_mask<S: AsRef<str>>(&self, names: &[S]) -> u64 {
        if names.is_empty() {
            return u64::MAX;
        }
        names
            .iter()
            .filter_map(|n| self.zone_id(n.as_ref()))
            .fold(0, |m, i| m | (1 << i))
    }

    /// Compiles a request against this cluster's names.
    pub fn demand(&self, r: &Request) -> Demand {
        let kind = match &r.gpu {
            GpuDemand::None => Kind::None,
            GpuDemand::Whole { count } => Kind::Whole(*count),
            GpuDemand::Fraction { milli, vram_gb } => Kind::Frac {
                milli: *milli,
                vram_gb: *vram_gb,
            },
            GpuDemand::Mig { profile } => Kind::Mig(
                mig::profile_names()
                    .iter()
                    .position(|n| n == profile)
                    .map_or(u16::MAX, |i| i as u16),
            ),
        };
        Demand {
            cpu_milli: r.cpu_milli,
            memory_mib: r.memory_mib,
            kind,
            models: self.model_mask(&r.models),
            zones: self.zone_mask(&r.zones),
            needs_isolation: r.needs_isolation,
        }
    }

    /// Can node `i` take `d` now? The first failing check.
    #[inline]
    pub fn check(&self, i: usize, d: &Demand) -> Result<(), Reject> {
        let n = &self.nodes[i];
        if d.needs_isolation && !n.isolates_workloads {
            return Err(Reject::Isolation);
        }
        if d.zones & (1u64 << n.zone) == 0 {
            return Err(Reject::Zone);
        }
        if d.kind != Kind::None && d.models & n.model_mask == 0 {
            return Err(Reject::Model);
        }
        if n.cpu_free < d.cpu_milli {
            return Err(Reject::Cpu);
        }
        if n.memory_free < d.memory_mib {
            return Err(Reject::Memory);
        }
        let ok = match d.kind {
            Kind::None => true,
            Kind::Whole(k) => {
                let mut need = k;
                if need == 0 {
                    true
                } else {
                    let mut ok = false;
                    for g in &n.gpus {
                        if g.fits_whole(d.models) {
                            need -= 1;
                            if need == 0 {
                                ok = true;
                                break;
                            }
                        }
                    }
                    ok
                }
            }
            Kind::Frac { milli, vram_gb } => {
                n.gpus.iter().any(|g| g.fits_frac(milli, vram_gb, d.models))
            }
            Kind::Mig(p) => (0..n.gpus.len()).any(|j| n.mig_plan(j, p, d.models).is_some()),
        };
        if ok {
            Ok(())
        } else {
            Err(self.gpu_reject(i, d))
        }
    }

    /// Why node `i`'s GPUs refuse `d`, which they do now: busy, or never
    /// (as the node is).
    fn gpu_reject(&self, i: usize, d: &Demand) -> Reject {
        let n = &self.nodes[i];
        let of_model = || n.gpus.iter().filter(|g| g.allowed(d.models));
        match d.kind {
            Kind::None => Reject::GpuBusy,
            Kind::Whole(k) => {
                let usable = of_model().filter(|g| g.mode != SharingMode::Mig).count();
                if usable == 0 {
                    Reject::GpuMode
                } else if usable < usize::from(k) {
                    Reject::GpuTooSmall
                } else {
                    Reject::GpuBusy
                }
            }
            Kind::Frac { milli, vram_gb } => {
                let mut sharing = of_model()
                    .filter(|g| g.mode == SharingMode::VGpu)
                    .peekable();
                if sharing.peek().is_none() {
                    Reject::GpuMode
                } else if milli > MILLI || sharing.clone().all(|g| g.vram_total < vram_gb) {
                    Reject::GpuTooSmall
                } else if sharing.any(|g| g.has_room_for(milli, vram_gb, d.models)) {
                    // Room enough, but only beside shares of another size.
                    Reject::ShareSize
                } else {
                    Reject::GpuBusy
                }
            }
            Kind::Mig(p) => {
                let in_mig: Vec<usize> = (0..n.gpus.len())
                    .filter(|&j| n.gpus[j].allowed(d.models) && n.gpus[j].mode == SharingMode::Mig)
                    .collect();
                let name = mig::profile_names().get(usize::from(p));
                let has_profile = |j: &usize| {
                    let layout = n.mig[*j].as_ref();
                    name.is_some_and(|name| {
                        layout.is_some_and(|l| l.geometry().profile(name).is_some())
                    })
                };
                // Room once its leases end: waiting helps. None even then,
                // with instances no lease holds in the way: it waits for an
                // operator.
                let room_without_leases = |j: &usize| {
                    let layout = n.mig[*j].as_ref();
                    name.is_some_and(|name| {
                        layout.is_some_and(|l| mig::plan(&l.without_leases(), name).is_some())
                    })
                };
                if in_mig.is_empty() {
                    Reject::GpuMode
                } else if !in_mig.iter().any(has_profile) {
                    Reject::MigProfile
                } else if in_mig
                    .iter()
                    .filter(|j| has_profile(j))
                    .any(room_without_leases)
                {
                    Reject::GpuBusy
                } else {
                    Reject::MigUnowned
                }
            }
        }
    }

    /// The first `count` GPUs free for a whole-GPU lease. When the node
    /// declares NVLink/NUMA domains, the tightest domain that holds them all
    /// is preferred (so a large domain stays whole for a large request).
    pub fn pick_whole(&self, i: usize, count: u8, models: u64) -> GpuSet {
        let n = &self.nodes[i];
        let usable: GpuSet = n
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.fits_whole(models))
            .fold(0, |m, (j, _)| m | (1 << j));
        let count = u32::from(count);
        if usable.count_ones() < count || count == 0 {
            return 0;
        }
        if !n.domains.is_empty() {
            let best = n
                .domains
                .iter()
                .map(|&d| d & usable)
                .filter(|m| m.count_ones() >= count)
                .min_by_key(|m| m.count_ones());
            if let Some(m) = best {
                return lowest_bits(m, count);
            }
        }
        lowest_bits(usable, count)
    }

    /// The GPU whose free milli fits `milli` most tightly (first index among
    /// equals); `None` when none fits.
    pub fn pick_frac_tightest(
        &self,
        i: usize,
        milli: u16,
        vram_gb: u32,
        models: u64,
    ) -> Option<u8> {
        let mut best: Option<(u16, u8)> = None;
        for (j, g) in self.nodes[i].gpus.iter().enumerate() {
            if g.fits_frac(milli, vram_gb, models) && best.is_none_or(|(m, _)| g.milli_free < m) {
                best = Some((g.milli_free, j as u8));
            }
        }
        best.map(|(_, j)| j)
    }

    /// The default GPU choice for `d` on node `i`: first free GPUs for whole
    /// leases (domain-aware), the tightest GPU for a slice.
    pub fn pick_default(&self, i: usize, d: &Demand) -> GpuSet {
        match d.kind {
            Kind::None => 0,
            Kind::Mig(p) => self.nodes[i]
                .pick_mig(p, d.models)
                .map_or(0, |(j, _, _)| 1 << j),
            Kind::Whole(k) => self.pick_whole(i, k, d.models),
            Kind::Frac { milli, vram_gb } => self
                .pick_frac_tightest(i, milli, vram_gb, d.models)
                .map_or(0, |j| 1 << j),
        }
    }

    /// Takes `d` on node `i` on the GPUs in `gpus`. Checks everything. A MIG
    /// demand gets the instance [`mig::plan`] chooses on its one GPU.
    pub fn allocate(&mut self, i: usize, d: &Demand, gpus: GpuSet) -> Result<AllocId, AllocError> {
        self.allocate_at(i, d, gpus, Existing::No)
    }

    /// Records a share of `d` that exists on GPU `gpu` of node `i` (rebuilding
    /// the cluster from what leases hold): it needs room, but may sit beside
    /// shares of another size, placed before its node took one size per GPU.
    pub fn allocate_existing_share(
        &mut self,
        i: usize,
        d: &Demand,
        gpu: u8,
    ) -> Result<AllocId, AllocError> {
        self.allocate_at(i, d, 1 << gpu, Existing::Share)
    }

    /// Records a MIG instance of `d`'s profile that exists at `start` on GPU
    /// `gpu` of node `i` (rebuilding the cluster from what leases hold).
    pub fn allocate_mig_at(
        &mut self,
        i: usize,
        d: &Demand,
        gpu: u8,
        start: u8,
    ) -> Result<AllocId, AllocError> {
        self.allocate_at(i, d, 1 << gpu, Existing::Mig { start })
    }

    /// Records a MIG instance of `profile` at `start` on GPU `gpu` of node
    /// `i` that belongs to no lease (as the node declares it): its slices
    /// are taken, by no allocation, so no policy places an instance over
    /// it, and the GPU is never re-sliced around it.
    pub fn add_unowned_mig(
        &mut self,
        i: usize,
        gpu: u8,
        profile: &str,
        start: u8,
    ) -> Result<(), AllocError> {
        let n = self.nodes.get_mut(i).ok_or(AllocError::NoSuchNode)?;
        let j = usize::from(gpu);
        if j >= n.gpus.len() || n.gpus[j].mode != SharingMode::Mig {
            return Err(AllocError::BadGpus);
        }
        let layout = n.mig[j].as_mut().ok_or(AllocError::MigUnsupported)?;
        layout
            .add_unowned(profile, start)
            .map_err(AllocError::Mig)?;
        let taken = layout
            .instances()
            .iter()
            .find(|x| x.start == start)
            .expect("the instance was just added")
            .profile;
        let (milli, vram_gb) = mig::size(taken, layout.geometry());
        let g = &mut n.gpus[j];
        g.milli_free = g.milli_free.saturating_sub(milli);
        g.vram_free = g.vram_free.saturating_sub(vram_gb);
        self.changed(i);
        Ok(())
    }

    fn allocate_at(
        &mut self,
        i: usize,
        d: &Demand,
        gpus: GpuSet,
        existing: Existing,
    ) -> Result<AllocId, AllocError> {
        if i >= self.nodes.len() {
            return Err(AllocError::NoSuchNode);
        }
        let mig_start = match existing {
            Existing::Mig { start } => Some(start),
            _ => None,
        };
        match existing {
            Existing::No => self.check(i, d).map_err(AllocError::NotFeasible)?,
            // Restoring what exists: an instance's slot, not a fresh plan; a
            // share beside others of any size.
            Existing::Mig { .. } | Existing::Share => {
                let n = &self.nodes[i];
                if n.cpu_free < d.cpu_milli {
                    return Err(AllocError::NotFeasible(Reject::Cpu));
                }
                if n.memory_free < d.memory_mib {
                    return Err(AllocError::NotFeasible(Reject::Memory));
                }
            }
        }
        let n = &self.nodes[i];
        if gpus as u64 >> n.gpus.len() != 0 {
            return Err(AllocError::BadGpus);
        }
        match d.kind {
            Kind::None => {
                if gpus != 0 {
                    return Err(AllocError::BadGpus);
                }
            }
            Kind::Whole(k) => {
                if gpus.count_ones() != u32::from(k)
                    || !gpu_indices(gpus).all(|j| n.gpus[usize::from(j)].fits_whole(d.models))
                {
                    return Err(AllocError::BadGpus);
                }
            }
            Kind::Frac { milli, vram_gb } => {
                if gpus.count_ones() != 1 {
                    return Err(AllocError::BadGpus);
                }
                let g = &n.gpus[gpus.trailing_zeros() as usize];
                let fits = match existing {
                    Existing::Share => g.has_room_for(milli, vram_gb, d.models),
                    _ => g.fits_frac(milli, vram_gb, d.models),
                };
                if !fits {
                    return Err(AllocError::BadGpus);
                }
            }
            Kind::Mig(_) => {
                if gpus.count_ones() != 1 {
                    return Err(AllocError::BadGpus);
                }
            }
        }
        let slot = self
            .free_slots
            .last()
            .copied()
            .unwrap_or(self.allocs.len() as u32);
        let mig = match d.kind {
            Kind::Mig(p) => {
                Some(self.take_mig(i, d, gpus.trailing_zeros() as usize, p, mig_start, slot)?)
            }
            _ => None,
        };
        let n = &mut self.nodes[i];
        n.cpu_free -= d.cpu_milli;
        n.memory_free -= d.memory_mib;
        for j in gpu_indices(gpus) {
            let g = &mut n.gpus[usize::from(j)];
            match d.kind {
                Kind::Whole(_) => {
                    g.milli_free = 0;
                    g.vram_free = 0;
                }
                Kind::Frac { milli, vram_gb } => {
                    g.milli_free -= milli;
                    g.vram_free -= vram_gb;
                    if g.one_share_size {
                        g.share_size = if g.leases == 0 || g.share_size == (milli, vram_gb) {
                            (milli, vram_gb)
                        } else {
                            MIXED_SHARES
                        };
                    }
                }
                Kind::Mig(_) => {
                    let h = mig.expect("a MIG allocation holds an instance");
                    g.milli_free = g.milli_free.saturating_sub(h.milli);
                    g.vram_free = g.vram_free.saturating_sub(h.vram_gb);
                }
                Kind::None => {}
            }
            g.leases += 1;
        }
        if let Some(t) = d.tag() {
            n.tags[t] += 1;
        }
        self.changed(i);
        self.gpu_milli_used += d.gpu_milli() + mig.map_or(0, |h| u64::from(h.milli));
        let a = Allocation {
            node: i as u32,
            demand: *d,
            gpus,
            mig,
        };
        let id = match self.free_slots.pop() {
            Some(s) => {
                self.allocs[s as usize] = Some(a);
                s
            }
            None => {
                self.allocs.push(Some(a));
                (self.allocs.len() - 1) as u32
            }
        };
        self.node_allocs[i].push(id);
        Ok(AllocId(id))
    }

    /// Gives back everything allocation `id` held.
    pub fn release(&mut self, id: AllocId) -> Result<Allocation, AllocError> {
        let a = self
            .allocs
            .get_mut(id.0 as usize)
            .and_then(Option::take)
            .ok_or(AllocError::UnknownAllocation)?;
        self.free_slots.push(id.0);
        let d = a.demand;
        let n = &mut self.nodes[a.node as usize];
        n.cpu_free += d.cpu_milli;
        n.memory_free += d.memory_mib;
        for j in gpu_indices(a.gpus) {
            let g = &mut n.gpus[usize::from(j)];
            match d.kind {
                Kind::Whole(_) => {
                    g.milli_free = MILLI;
                    g.vram_free = g.vram_total;
                }
                Kind::Frac { milli, vram_gb } => {
                    g.milli_free += milli;
                    g.vram_free += vram_gb;
                }
                Kind::Mig(_) => {
                    if let Some(h) = a.mig {
                        g.milli_free = (g.milli_free + h.milli).min(MILLI);
                        g.vram_free = (g.vram_free + h.vram_gb).min(g.vram_total);
                    }
                    if let Some(layout) = n.mig[usize::from(j)].as_mut() {
                        mig::release(layout, &id.0);
                    }
                }
                Kind::None => {}
            }
            g.leases -= 1;
            if g.leases == 0 {
                // Its enforcement's limits come back up once it is empty.
                g.share_size = (0, 0);
            }
        }
        if let Some(t) = d.tag() {
            n.tags[t] -= 1;
        }
        let held = &mut self.node_allocs[a.node as usize];
        if let Some(at) = held.iter().position(|&s| s == id.0) {
            held.swap_remove(at);
        }
        self.changed(a.node as usize);
        self.gpu_milli_used -= d.gpu_milli() + a.mig.map_or(0, |h| u64::from(h.milli));
        Ok(a)
    }

    /// Creates the MIG instance of allocation `slot` on GPU `j` of node `i`:
    /// at `start` when given, else where [`mig::plan`] says.
    fn take_mig(
        &mut self,
        i: usize,
        d: &Demand,
        j: usize,
        profile: u16,
        start: Option<u8>,
        slot: u32,
    ) -> Result<MigHold, AllocError> {
        let n = &mut self.nodes[i];
        if j >= n.gpus.len() || n.gpus[j].mode != SharingMode::Mig || !n.gpus[j].allowed(d.models) {
            return Err(AllocError::BadGpus);
        }
        let name = mig::profile_names()
            .get(usize::from(profile))
            .ok_or(AllocError::BadGpus)?;
        let layout = n.mig[j].as_mut().ok_or(AllocError::MigUnsupported)?;
        let instance = match start {
            Some(s) => mig::place_at(layout, name, s, slot),
            None => mig::place(layout, name, slot).map(|p| p.instance),
        }
        .map_err(AllocError::Mig)?;
        let (milli, vram_gb) = mig::size(instance.profile, layout.geometry());
        Ok(MigHold {
            profile: instance.profile,
            start: instance.start,
            milli,
            vram_gb,
        })
    }

    pub fn allocation(&self, id: AllocId) -> Option<&Allocation> {
        self.allocs.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// Live allocations.
    pub fn allocations(&self) -> impl Iterator<Item = (AllocId, &Allocation)> {
        self.allocs
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.as_ref().map(|a| (AllocId(i as u32), a)))
    }
}

/// What [`Cluster::allocate_at`] records: a new allocation, or one that
/// exists already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Existing {
    No,
    Mig { start: u8 },
    Share,
}

fn lowest_bits(mut m: GpuSet, count: u32) -> GpuSet {
    let mut out = 0;
    for _ in 0..count {
        let b = m & m.wrapping_neg();
        out |= b;
        m &= !b;
    }
    out
}
