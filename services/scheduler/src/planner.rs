//! Placement through the lh-placement engine with Leasehold's default
//! policy (`leasehold`), deterministic for a fixed seed.
//!
//! The engine's [`Cluster`] mirrors the fleet state (nodes, whole
//! holdings, fractional shares and MIG instances where they are) as of the
//! first placement of a decision pass, and again after the pass reserves
//! GPUs (preemption, starvation); placements within a pass update it in
//! place. The engine is kept from pass to pass: each pass loads again only
//! the nodes that changed since the last (by the log, or by the last pass's
//! own placements), so that the cluster, the policy's per-node caches and
//! the engine's kept verdicts are not rebuilt at every pass. It decides
//! exactly as an engine built afresh would: same nodes in the same order,
//! each as the fleet holds it, and the decisions numbered from 0.

use std::collections::{HashMap, HashSet};

use lh_domain::catalog;
use lh_domain::fleet::{Gpu, Node};
use lh_events::{GpuAsk, GpuHealth, GpuSharing, Isolation};
use lh_placement::policy::Leasehold;
use lh_placement::{
    Cluster, Engine, GpuDemand, GpuSpec, MigHold, NodeSpec, Pending, Provenance, Request, ShapeMix,
    ShapeMixConfig, SharingMode,
};

use crate::state::planned_fleet::{FleetView, PlannedFleet};

/// Seed of every placement engine: decisions are a function of the state.
pub const SEED: u64 = 42;
/// CPU and memory are not modelled by the scheduler yet: nodes get this much.
const UNLIMITED: u64 = 1 << 40;

/// The shape of what a lease asks for, in engine terms: what the shape mix
/// counts (a few shapes among thousands of leases), and what a placement
/// request is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseShape {
    Whole(u32),
    Fraction {
        milli: u32,
        vram_gb: u32,
    },
    /// A MIG instance of a profile of the lease's model ("" for a profile the
    /// model lacks, which fits nowhere).
    Mig {
        profile: &'static str,
    },
}

impl LeaseShape {
    /// The shape of `ask` on a GPU of `model` (whose MIG geometry names
    /// the profiles there are).
    pub fn of(ask: &GpuAsk, model: &str) -> Self {
        match ask {
            GpuAsk::Fraction(f) => LeaseShape::Fraction {
                milli: f.milli,
                vram_gb: f.vram_gb,
            },
            GpuAsk::Mig(p) => LeaseShape::Mig {
                profile: catalog::profiles(model)
                    .iter()
                    .find(|x| x.name == p)
                    .map_or("", |x| x.name),
            },
            GpuAsk::Whole(n) => LeaseShape::Whole(*n),
        }
    }

    fn request(self, model: &str) -> Option<Request> {
        let r = match self {
            LeaseShape::Whole(n) => Request::whole(u8::try_from(n).ok()?, 0, 0),
            LeaseShape::Fraction { milli, vram_gb } => {
                Request::fraction(u16::try_from(milli).ok()?, vram_gb, 0, 0)
            }
            LeaseShape::Mig { profile } => mig_request(profile),
        };
        Some(r.with_models([model]))
    }
}

fn mig_request(profile: &str) -> Request {
    Request {
        gpu: GpuDemand::Mig {
            profile: profile.to_string(),
        },
        ..Request::cpu_only(0, 0)
    }
}

/// A placement the engine chose.
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    pub node_id: String,
    pub zone: String,
    /// Fleet GPU indices, ascending.
    pub gpu_indices: Vec<u32>,
    /// The MIG instance created for a MIG ask.
    pub mig: Option<MigHold>,
    pub provenance: Provenance,
}

/// The distribution of task shapes the policy measures fragmentation
/// against: the shapes of the live leases (placed and waiting), plus one
/// whole GPU of any model as a prior, so that an idle GPU counts as worth
/// keeping whole (fractions pack onto GPUs already shared).
pub fn shape_mix<'a>(shapes: impl IntoIterator<Item = (LeaseShape, &'a str)>) -> ShapeMix {
    // Thousands of leases, of a few shapes: each shape is made a request
    // once, with its count.
    let mut counts: HashMap<(LeaseShape, &str), u64> = HashMap::new();
    for shape in shapes {
        *counts.entry(shape).or_default() += 1;
    }
    let mut requests: Vec<(Request, u64)> = counts
        .into_iter()
        .filter_map(|((shape, model), count)| Some((shape.request(model)?, count)))
        .collect();
    requests.push((Request::whole(1, 0, 0), 1));
    ShapeMix::from_counted_requests(
        requests.iter().map(|(r, count)| (r, *count)),
        ShapeMixConfig {
            popularity: 1.0,
            include_cpu_only: false,
            with_memory: false,
        },
    )
}

pub struct Planner {
    engine: Engine,
    /// Fleet GPU index per GPU position, every engine node's in turn: node
    /// `i`'s are `gpu_index[gpu_from[i]..gpu_from[i + 1]]`. (The engine
    /// nodes are the fleet's schedulable nodes in id order, so an id is
    /// found by a binary search.)
    gpu_index: Vec<u32>,
    gpu_from: Vec<usize>,
    /// What the policy measures against.
    shape_mix: ShapeMix,
    /// The fleet's newest stamp when the engine was last brought up to date
    /// with it.
    synced_at: u64,
    /// Engine nodes that may differ from the fleet as the log says it:
    /// placed on since, or loaded from a pass's own changes.
    dirty: HashSet<usize>,
    /// The most GPUs any engine node has: a lease of more spans nodes.
    largest_node_gpus: usize,
}

/// A node as the engine takes it, written into `spec` (its strings reuse
/// their room), with the fleet index of each of its GPUs there in
/// `indices`; `false` for a node that takes nothing new.
fn fill_spec(spec: &mut NodeSpec, indices: &mut Vec<u32>, n: &Node) -> bool {
    // A lost or cordoned node, a degraded or unhealthy GPU, takes
    // nothing new.
    if !n.is_schedulable() {
        return false;
    }
    // A share's caps hold only where the node enforces them: on any
    // other node a GPU is whole, and takes no share.
    let shares_enforced = n.gpu_sharing.enforces_shares();
    set(&mut spec.id, &n.id);
    set(&mut spec.zone, &n.zone);
    set(&mut spec.fabric, n.fabric.as_deref().unwrap_or_default());
    spec.cpu_milli = UNLIMITED;
    spec.memory_mib = UNLIMITED;
    spec.domains.clear();
    spec.isolates_workloads = n.isolation == Isolation::Container;
    // MPS holds every client of a GPU to the smallest share it
    // hosted since its daemon started (ADR 016); HAMi-core
    // holds each client to its own.
    spec.one_share_size_per_gpu = n.gpu_sharing == GpuSharing::Mps;
    indices.clear();
    let mut count = 0;
    for g in healthy(n) {
        let mode = if g.mig {
            SharingMode::Mig
        } else if shares_enforced {
            SharingMode::VGpu
        } else {
            SharingMode::Whole
        };
        match spec.gpus.get_mut(count) {
            Some(s) => {
                set(&mut s.model, &g.model);
                (s.vram_gb, s.mode) = (g.vram_gb, mode);
            }
            None => spec.gpus.push(GpuSpec {
                model: g.model.clone(),
                vram_gb: g.vram_gb,
                mode,
            }),
        }
        indices.push(g.index);
        count += 1;
    }
    spec.gpus.truncate(count);
    true
}

/// `to` says `from` (copied only where it said something else: a fleet's
/// nodes mostly have alike GPUs).
fn set(to: &mut String, from: &str) {
    if to != from {
        to.clear();
        to.push_str(from);
    }
}

fn empty_spec() -> NodeSpec {
    NodeSpec::uniform(
        String::new(),
        String::new(),
        UNLIMITED,
        UNLIMITED,
        0,
        GpuSpec {
            model: String::new(),
            vram_gb: 0,
            mode: SharingMode::Whole,
        },
    )
}

/// The GPUs of `n` the engine places on, in the node's order.
fn healthy(n: &Node) -> impl Iterator<Item = &Gpu> + Clone {
    n.gpus
        .iter()
        .filter(|g| g.health == GpuHealth::Healthy)
        .take(lh_placement::cluster::MAX_GPUS_PER_NODE)
}

/// Takes on engine node `i` (as added, or cleared) what fleet node `n`
/// holds.
fn load(cluster: &mut Cluster, i: usize, n: &Node) {
    let shares_enforced = n.gpu_sharing.enforces_shares();
    for (j, g) in healthy(n).enumerate() {
        let set = 1u32 << j;
        // Instances no lease holds, as the node declared them: their
        // slots are taken before any lease's is restored.
        for m in &g.unowned_mig {
            if let Err(e) = cluster.add_unowned_mig(i, j as u8, &m.profile, m.start) {
                tracing::debug!(node = %n.id, gpu = g.index, profile = %m.profile, start = m.start, error = %e,
                    "a MIG instance the node declares unowned does not fit the placement rules");
            }
        }
        if g.held_by.is_some() {
            let d = cluster.demand(&Request::whole(1, 0, 0).with_models([&g.model]));
            let _ = cluster.allocate(i, &d, set);
        }
        for s in &g.shares {
            if let Some(m) = &s.mig {
                let d = cluster.demand(&mig_request(&m.profile).with_models([&g.model]));
                let _ = cluster.allocate_mig_at(i, &d, j as u8, m.start);
                continue;
            }
            if !shares_enforced {
                // Placed before the node stopped enforcing shares:
                // the GPU is busy until they end.
                let d = cluster.demand(&Request::whole(1, 0, 0).with_models([&g.model]));
                let _ = cluster.allocate(i, &d, set);
                break;
            }
            let r = Request {
                gpu: GpuDemand::Fraction {
                    milli: s.milli.min(1000) as u16,
                    vram_gb: s.vram_gb,
                },
                ..Request::cpu_only(0, 0)
            }
            .with_models([&g.model]);
            let d = cluster.demand(&r);
            // As it is, even beside shares of another size.
            let _ = cluster.allocate_existing_share(i, &d, j as u8);
        }
    }
}

fn default_policy(shape_mix: &ShapeMix) -> Box<dyn lh_placement::Policy> {
    Box::new(Leasehold::new(shape_mix.clone()))
}

impl Planner {
    /// An engine over `fleet` as it is now.
    pub fn new(fleet: &impl FleetView, shape_mix: &ShapeMix) -> Self {
        let (mut spec, mut indices) = (empty_spec(), Vec::new());
        let (mut gpu_index, mut gpu_from) = (Vec::new(), vec![0]);
        let mut cluster = Cluster::default();
        let nodes = fleet.nodes();
        cluster.reserve(nodes.size_hint().0);
        gpu_from.reserve(nodes.size_hint().0);
        for n in nodes {
            if !fill_spec(&mut spec, &mut indices, n) {
                continue;
            }
            let i = cluster.add_node(&spec);
            load(&mut cluster, i, n);
            gpu_index.extend_from_slice(&indices);
            gpu_from.push(gpu_index.len());
        }
        let largest_node_gpus = cluster.nodes().iter().map(|n| n.gpus.len()).max();
        Planner {
            largest_node_gpus: largest_node_gpus.unwrap_or(0),
            engine: Engine::new(cluster, default_policy(shape_mix), SEED),
            gpu_index,
            gpu_from,
            shape_mix: shape_mix.clone(),
            synced_at: 0,
            dirty: HashSet::new(),
        }
    }

    /// The engine node of fleet node `id`, if it has one.
    fn index_of(&self, id: &str) -> Option<usize> {
        let nodes = self.engine.cluster().nodes();
        nodes.binary_search_by(|n| n.id.as_str().cmp(id)).ok()
    }

    /// Fleet GPU index per GPU position of engine node `i`.
    fn gpu_indices_of(&self, i: usize) -> &[u32] {
        &self.gpu_index[self.gpu_from[i]..self.gpu_from[i + 1]]
    }

    /// The engine for a pass over `planned`, deciding as [`Planner::new`]
    /// over it would: the one `kept` from before, brought up to date node
    /// by node (the nodes the log or a pass changed since), or a new one
    /// where nodes came, went, or changed shape.
    pub fn sync<'k>(
        kept: &'k mut Option<Planner>,
        planned: &PlannedFleet,
        shape_mix: &ShapeMix,
    ) -> &'k mut Planner {
        let base = planned.base();
        let current = kept
            .take()
            .filter(|p| p.synced_at <= base.stamps.last())
            .and_then(|mut p| p.update(planned, shape_mix).then_some(p));
        let planner = kept.insert(match current {
            Some(p) => p,
            None => {
                let mut p = Planner::new(planned, shape_mix);
                p.dirty = planned
                    .changed_nodes()
                    .filter_map(|id| p.index_of(id))
                    .collect();
                p
            }
        });
        planner.synced_at = base.stamps.last();
        // A new engine numbers its decisions from 0: the seeded draws of
        // each decision follow.
        planner.engine.set_sequence(0);
        planner
    }

    /// Brings the engine up to date with `planned`; `false` where only a
    /// new engine can be (a node came, went, or changed shape).
    fn update(&mut self, planned: &PlannedFleet, shape_mix: &ShapeMix) -> bool {
        if self.shape_mix != *shape_mix {
            self.engine.set_policy(default_policy(shape_mix));
            self.shape_mix = shape_mix.clone();
        }
        let mut todo: Vec<usize> = std::mem::take(&mut self.dirty).into_iter().collect();
        let changed = planned
            .base()
            .stamps
            .changed_after(self.synced_at)
            .chain(planned.changed_nodes());
        for id in changed {
            let schedulable = planned.node(id).is_some_and(Node::is_schedulable);
            match (self.index_of(id), schedulable) {
                (Some(i), true) => todo.push(i),
                (None, false) => {}
                _ => return false,
            }
        }
        todo.sort_unstable();
        todo.dedup();
        let (mut spec, mut indices) = (empty_spec(), Vec::new());
        for i in todo {
            let id = &self.engine.cluster().node(i).id;
            let Some(n) = planned.node(id) else {
                return false;
            };
            if !fill_spec(&mut spec, &mut indices, n)
                || !self.engine.cluster().same_shape(i, &spec)
                || self.gpu_indices_of(i) != indices
            {
                return false;
            }
            let cluster = self.engine.cluster_mut();
            cluster.clear_node(i).expect("an engine node");
            load(cluster, i, n);
            if planned.changed(&n.id) {
                self.dirty.insert(i);
            }
        }
        true
    }

    /// Whether a lease of `shape` takes more GPUs than any node has: a gang,
    /// placed with [`Planner::place_gang`].
    pub fn spans_nodes(&self, shape: LeaseShape) -> bool {
        matches!(shape, LeaseShape::Whole(n) if n as usize > self.largest_node_gpus)
    }

    /// Places a gang (see [`Planner::spans_nodes`]) as [`Planner::place`]
    /// places one lease: every member, in node-rank order, or none.
    pub fn place_gang(
        &mut self,
        shape: LeaseShape,
        model: &str,
        needs_isolation: bool,
        zones: &[String],
    ) -> Result<Vec<Chosen>, Option<Pending>> {
        let request = placement_request(shape, model, needs_isolation, zones).ok_or(None)?;
        let members = self.engine.schedule_gang(&request).map_err(Some)?;
        Ok(members
            .into_iter()
            .map(|(decision, id)| self.chosen(decision, id))
            .collect())
    }

    /// Places a gang again on the nodes it ran on, `members` (node id, GPUs
    /// there) in node-rank order, as [`Engine::schedule_gang_on`] does:
    /// every member on its own node, or `None` with nothing taken.
    pub fn place_gang_on(
        &mut self,
        shape: LeaseShape,
        model: &str,
        needs_isolation: bool,
        zones: &[String],
        members: &[(String, u32)],
    ) -> Option<Vec<Chosen>> {
        let request = placement_request(shape, model, needs_isolation, zones)?;
        let on = members
            .iter()
            .map(|(id, gpus)| Some((self.index_of(id)?, *gpus)))
            .collect::<Option<Vec<_>>>()?;
        let members = self.engine.schedule_gang_on(&request, &on)?;
        Some(
            members
                .into_iter()
                .map(|(decision, id)| self.chosen(decision, id))
                .collect(),
        )
    }

    /// Decides where a lease of `shape` on `model` goes and takes it in this engine, on
    /// a node that isolates workloads when `needs_isolation`, in one of
    /// `zones` (empty: any). When no node
    /// can take it, the engine's [`Pending`] says whether busy GPUs or the
    /// fleet itself keep it out; `None` when the ask is out of the engine's
    /// range (so nothing ever fits).
    pub fn place(
        &mut self,
        shape: LeaseShape,
        model: &str,
        needs_isolation: bool,
        zones: &[String],
    ) -> Result<Chosen, Option<Pending>> {
        let request = placement_request(shape, model, needs_isolation, zones).ok_or(None)?;
        let decision = self.engine.decide(&request).map_err(Some)?;
        let id = self
            .engine
            .place(&request, &decision)
            .expect("the engine's own choice fits");
        Ok(self.chosen(decision, id))
    }

    /// What the engine's `decision`, taken as allocation `id`, gives in the
    /// fleet's terms; its node is one this engine changed from now on.
    fn chosen(&mut self, decision: lh_placement::Decision, id: lh_placement::AllocId) -> Chosen {
        self.dirty.insert(decision.node);
        let cluster = self.engine.cluster();
        let mig = cluster.allocation(id).and_then(|a| a.mig);
        let node = cluster.node(decision.node);
        let index = self.gpu_indices_of(decision.node);
        let mut gpu_indices: Vec<u32> = decision
            .gpu_indices()
            .into_iter()
            .map(|p| index[usize::from(p)])
            .collect();
        gpu_indices.sort_unstable();
        Chosen {
            node_id: node.id.clone(),
            zone: cluster.zone_name(node.zone).to_string(),
            gpu_indices,
            mig,
            provenance: decision.provenance,
        }
    }
}

/// The engine's request for a lease of `shape` on `model`, on a node that
/// isolates workloads when `needs_isolation`, in one of `zones` (empty:
/// any); `None` when the ask is out of the engine's range.
fn placement_request(
    shape: LeaseShape,
    model: &str,
    needs_isolation: bool,
    zones: &[String],
) -> Option<Request> {
    let mut request = shape.request(model)?;
    request.needs_isolation = needs_isolation;
    if !zones.is_empty() {
        request = request.with_zones(zones.iter().cloned());
    }
    Some(request)
}
