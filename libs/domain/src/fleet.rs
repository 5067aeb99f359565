//! The GPU fleet as the log describes it: nodes, their GPUs and which lease
//! holds each. An evolve function over events; the scheduler and the
//! spot-broker both fold the log into it.

use std::collections::{BTreeMap, HashMap};

use lh_events::{EventData, MigInstance, NodeRegistered};
use uuid::Uuid;

/// One GPU as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub vram_gb: u32,
    /// Lease holding it whole, if any.
    pub held_by: Option<uuid::Uuid>,
    /// Fractional or MIG leases sharing it.
    pub shares: Vec<Share>,
    /// In MIG mode: only MIG leases, each in its own GPU instance.
    pub mig: bool,
    /// MIG instances on it that no lease holds, as its node last declared
    /// them: no lease is placed over them.
    #[serde(default)]
    pub unowned_mig: Vec<MigInstance>,
    /// As its node-agent judges it; only a healthy GPU takes new leases.
    pub health: lh_events::GpuHealth,
    /// When it last changed health (the node's clock).
    pub health_since: Option<chrono::DateTime<chrono::Utc>>,
}

/// One fractional or MIG lease's share of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Share {
    pub lease_id: uuid::Uuid,
    pub milli: u32,
    pub vram_gb: u32,
    /// The GPU instance of a MIG lease.
    pub mig: Option<lh_events::MigInstance>,
}

impl Gpu {
    /// Neither held whole nor shared.
    pub fn is_free(&self) -> bool {
        self.held_by.is_none() && self.shares.is_empty()
    }

    /// Milli-GPU in use (1000 when held whole).
    pub fn used_milli(&self) -> u32 {
        if self.held_by.is_some() {
            1000
        } else {
            self.shares.iter().map(|s| s.milli).sum()
        }
    }

    /// VRAM GB in use (all of it when held whole).
    pub fn used_vram_gb(&self) -> u32 {
        if self.held_by.is_some() {
            self.vram_gb
        } else {
            self.shares.iter().map(|s| s.vram_gb).sum()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Node {
    pub id: String,
    pub zone: String,
    pub gpus: Vec<Gpu>,
    /// Set while the node is lost: when it was last heard from (its own
    /// clock). A lost node takes no leases.
    pub lost: Option<chrono::DateTime<chrono::Utc>>,
    /// Set while an operator has cordoned it: no new leases; with
    /// `Some(Move)` its leases are moved away too.
    pub cordoned: Option<Option<lh_events::DrainMode>>,
    /// What the node declared it isolates workloads with.
    #[serde(default)]
    pub isolation: lh_events::Isolation,
    /// What the node declared enforces GPU shares.
    #[serde(default)]
    pub gpu_sharing: lh_events::GpuSharing,
    /// Its host name, as it registered: how a gang's other members reach
    /// it.
    #[serde(default)]
    pub hostname: String,
    /// The interconnect it declared, if its label is a valid one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<String>,
}

impl Node {
    /// Takes new leases: heard from and not cordoned.
    pub fn is_schedulable(&self) -> bool {
        self.lost.is_none() && self.cordoned.is_none()
    }

    /// `lease_id` holds the GPUs at `indices`: whole, or a share
    /// `(milli, VRAM GB)` of each (with its MIG instance, for a MIG lease).
    /// What [`Fleet`] folds a placement into, on the node's side.
    pub fn hold(
        &mut self,
        lease_id: Uuid,
        indices: &[u32],
        share: Option<(u32, u32)>,
        mig: Option<&MigInstance>,
    ) {
        for gpu in self.gpus.iter_mut().filter(|g| indices.contains(&g.index)) {
            match share {
                Some((milli, vram_gb)) => gpu.shares.push(Share {
                    lease_id,
                    milli,
                    vram_gb,
                    mig: mig.cloned(),
                }),
                None => gpu.held_by = Some(lease_id),
            }
        }
    }
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Fleet {
    pub nodes: BTreeMap<String, Node>,
    /// Stream sequence of the last event on each node's subject, for the
    /// expected-last-subject-sequence of the next write.
    pub node_sequence: HashMap<String, u64>,
    /// GPUs each live lease holds: node and GPU indices (a gang's first
    /// member's).
    pub holdings: HashMap<Uuid, (String, Vec<u32>)>,
    /// A gang's other members: node and GPU indices of each, in node-rank
    /// order.
    #[serde(default)]
    pub gang_members: HashMap<Uuid, Vec<(String, Vec<u32>)>>,
    /// The share of a fractional or MIG lease: `(milli, VRAM GB)` of its
    /// one GPU.
    pub shares: HashMap<Uuid, (u32, u32)>,
    /// The GPU instance of each MIG lease.
    pub mig_instances: HashMap<Uuid, MigInstance>,
    /// Which nodes changed, and in what order. Not part of what the log
    /// says (a snapshot leaves it out): it lets a reader that keeps work
    /// per node re-read only the nodes that changed since it last looked.
    #[serde(skip)]
    pub stamps: NodeStamps,
}

/// Every change to a node (registered, a lease's GPUs held or given back,
/// lost, rejoined, cordoned, a GPU's health) stamps it with the next number.
#[derive(Debug, Clone, Default)]
pub struct NodeStamps {
    last: u64,
    of: HashMap<String, u64>,
    by: BTreeMap<u64, String>,
}

impl NodeStamps {
    /// The newest stamp (0 before any change).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Nodes changed after stamp `since`, each once, in the order of their
    /// latest change.
    pub fn changed_after(&self, since: u64) -> impl Iterator<Item = &str> {
        self.by
            .range(since.saturating_add(1)..)
            .map(|(_, id)| id.as_str())
    }

    fn stamp(&mut self, node_id: &str) {
        self.last += 1;
        match self.of.get_mut(node_id) {
            Some(at) => {
                let id = self
                    .by
                    .remove(at)
                    .expect("every stamped node is in both maps");
                *at = self.last;
                self.by.insert(self.last, id);
            }
            None => {
                self.of.insert(node_id.to_string(), self.last);
                self.by.insert(self.last, node_id.to_string());
            }
        }
    }
}

impl Fleet {
    /// Folds one stored event in.
    pub fn apply(&mut self, sequence: u64, data: &EventData) {
        match data {
            EventData::NodeRegistered(e) => {
                self.register(e);
                self.saw_node_event(&e.node_id, sequence);
            }
            EventData::NodeGpusAllocated(e) => {
                for a in &e.allocations {
                    let share = a.milli.zip(a.vram_gb);
                    let mig = a.mig_instance.clone();
                    self.hold(&e.node_id, a.lease_id, &a.gpu_indices, share, mig);
                }
                self.saw_node_event(&e.node_id, sequence);
            }
            EventData::LeasePlaced(e) => {
                let indices: Vec<u32> = e.gpus.iter().map(|g| g.index).collect();
                let share = e.gpus.first().and_then(|g| g.milli.zip(g.vram_gb));
                let mig = e.gpus.first().and_then(|g| g.mig_instance.clone());
                self.hold(&e.node_id, e.lease_id, &indices, share, mig);
                for m in e.members.iter().skip(1) {
                    let indices: Vec<u32> = m.gpus.iter().map(|g| g.index).collect();
                    self.hold(&m.node_id, e.lease_id, &indices, None, None);
                }
            }
            EventData::LeaseEnded(e) => self.release(e.lease_id),
            EventData::LeaseSuspended(e) => self.release(e.lease_id),
            EventData::LeaseMigrated(e) => {
                self.release(e.lease_id);
                if let Some(to) = &e.to {
                    let indices: Vec<u32> = to.gpus.iter().map(|g| g.index).collect();
                    let share = to.gpus.first().and_then(|g| g.milli.zip(g.vram_gb));
                    let mig = to.gpus.first().and_then(|g| g.mig_instance.clone());
                    self.hold(&to.node_id, e.lease_id, &indices, share, mig);
                }
            }
            EventData::NodeLost(e) => {
                if let Some(n) = self.nodes.get_mut(&e.node_id) {
                    n.lost = Some(e.last_heard_at);
                    self.stamps.stamp(&e.node_id);
                }
                self.saw_node_event(&e.node_id, sequence);
            }
            EventData::NodeGpuHealthChanged(e) => {
                if let Some(g) = self
                    .nodes
                    .get_mut(&e.node_id)
                    .and_then(|n| n.gpus.iter_mut().find(|g| g.index == e.gpu_index))
                {
                    g.health = e.to;
                    g.health_since = Some(e.at);
                    self.stamps.stamp(&e.node_id);
                }
                self.saw_node_event(&e.node_id, sequence);
            }
            EventData::NodeCordoned(e) => {
                if let Some(n) = self.nodes.get_mut(&e.node_id) {
                    n.cordoned = Some(e.drain);
                    self.stamps.stamp(&e.node_id);
                }
                self.saw_node_event(&e.node_id, sequence);
            }
            EventData::NodeUncordoned(e) => {
                if let Some(n) = self.nodes.get_mut(&e.node_id) {
                    n.cordoned = None;
                    self.stamps.stamp(&e.node_id);
                }
                self.saw_node_event(&e.node_id, sequence);
            }
            EventData::NodeGpuSelfTested(e) => self.saw_node_event(&e.node_id, sequence),
            // A node or lease whose history expired before this fold began
            // is known from its restatement; one already known is not
            // folded again (see lh_events::LeaseRestated).
            EventData::NodeRestated(r) => {
                if !self.nodes.contains_key(&r.node_id) {
                    for e in &r.history {
                        self.apply(e.sequence, &e.envelope.data);
                    }
                }
                self.saw_node_event(&r.node_id, sequence);
            }
            EventData::LeaseRestated(r) if !self.holdings.contains_key(&r.lease_id) => {
                for e in &r.history {
                    self.apply(e.sequence, &e.envelope.data);
                }
            }
            EventData::NodeRejoined(e) => {
                if let Some(n) = self.nodes.get_mut(&e.node_id) {
                    n.lost = None;
                    self.stamps.stamp(&e.node_id);
                }
                self.saw_node_event(&e.node_id, sequence);
            }
            _ => {}
        }
    }

    fn saw_node_event(&mut self, node_id: &str, sequence: u64) {
        // A writer may apply its own event before the feed repeats older
        // ones: never move a node's sequence backwards.
        let seq = self.node_sequence.entry(node_id.to_string()).or_default();
        *seq = (*seq).max(sequence);
    }

    fn register(&mut self, e: &NodeRegistered) {
        // Re-registration keeps what live leases hold.
        let on_gpu = |index: u32| {
            let held_here = |(n, idx): &(String, Vec<u32>)| n == &e.node_id && idx.contains(&index);
            let members = self
                .gang_members
                .iter()
                .filter(|(_, members)| members.iter().any(held_here))
                .map(|(l, _)| *l);
            let mut leases: Vec<Uuid> = self
                .holdings
                .iter()
                .filter(|(_, h)| held_here(h))
                .map(|(l, _)| *l)
                .chain(members)
                .collect();
            leases.sort();
            leases
        };
        let gpus = e
            .gpus
            .iter()
            .map(|g| {
                let leases = on_gpu(g.index);
                let mut gpu = Gpu {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    model: g.model.clone(),
                    vram_gb: g.vram_gb,
                    held_by: None,
                    shares: Vec::new(),
                    mig: g.mig,
                    unowned_mig: g.unowned_mig_instances.clone(),
                    health: lh_events::GpuHealth::Healthy,
                    health_since: None,
                };
                // Re-registration keeps what the agent said of its health.
                if let Some(old) = self
                    .nodes
                    .get(&e.node_id)
                    .and_then(|n| n.gpus.iter().find(|o| o.uuid == g.uuid))
                {
                    gpu.health = old.health;
                    gpu.health_since = old.health_since;
                }
                for l in leases {
                    match self.shares.get(&l) {
                        Some(&(milli, vram_gb)) => gpu.shares.push(Share {
                            lease_id: l,
                            milli,
                            vram_gb,
                            mig: self.mig_instances.get(&l).cloned(),
                        }),
                        None => gpu.held_by = Some(l),
                    }
                }
                gpu
            })
            .collect();
        // Registering again does not end a loss (only being heard does)
        // nor a cordon (only an operator does).
        let lost = self.nodes.get(&e.node_id).and_then(|n| n.lost);
        let cordoned = self.nodes.get(&e.node_id).and_then(|n| n.cordoned);
        self.stamps.stamp(&e.node_id);
        self.nodes.insert(
            e.node_id.clone(),
            Node {
                id: e.node_id.clone(),
                zone: e.zone.clone(),
                gpus,
                lost,
                cordoned,
                isolation: e.isolation,
                gpu_sharing: e.gpu_sharing,
                hostname: e.hostname.clone(),
                fabric: e
                    .fabric
                    .clone()
                    .filter(|f| lh_events::fabric_label_is_valid(f)),
            },
        );
    }

    fn hold(
        &mut self,
        node_id: &str,
        lease_id: Uuid,
        indices: &[u32],
        share: Option<(u32, u32)>,
        mig: Option<MigInstance>,
    ) {
        match self.holdings.get(&lease_id) {
            None => {
                self.holdings
                    .insert(lease_id, (node_id.to_string(), indices.to_vec()));
            }
            Some((first, _)) if first == node_id => return,
            // Another node of a gang: its `lease.placed` and each member's
            // `node.gpus_allocated` both say so.
            Some(_) => {
                let members = self.gang_members.entry(lease_id).or_default();
                if members.iter().any(|(n, _)| n == node_id) {
                    return;
                }
                members.push((node_id.to_string(), indices.to_vec()));
            }
        }
        if let Some(s) = share {
            self.shares.insert(lease_id, s);
        }
        if let Some(m) = &mig {
            self.mig_instances.insert(lease_id, m.clone());
        }
        if let Some(node) = self.nodes.get_mut(node_id) {
            self.stamps.stamp(node_id);
            node.hold(lease_id, indices, share, mig.as_ref());
        }
    }

    fn release(&mut self, lease_id: Uuid) {
        let Some(first) = self.holdings.remove(&lease_id) else {
            return;
        };
        self.shares.remove(&lease_id);
        self.mig_instances.remove(&lease_id);
        let members = self.gang_members.remove(&lease_id).unwrap_or_default();
        for (node_id, indices) in std::iter::once(first).chain(members) {
            if let Some(node) = self.nodes.get_mut(&node_id) {
                self.stamps.stamp(&node_id);
                for gpu in node.gpus.iter_mut().filter(|g| indices.contains(&g.index)) {
                    if gpu.held_by == Some(lease_id) {
                        gpu.held_by = None;
                    }
                    gpu.shares.retain(|s| s.lease_id != lease_id);
                }
            }
        }
    }

    /// `(zone, model) -> (total GPUs, held GPUs)`; a GPU with any
    /// fractional share counts as held.
    pub fn usage_by_zone_model(&self) -> BTreeMap<(String, String), (u32, u32)> {
        let mut out: BTreeMap<(String, String), (u32, u32)> = BTreeMap::new();
        for node in self.nodes.values() {
            for gpu in &node.gpus {
                let e = out
                    .entry((node.zone.clone(), gpu.model.clone()))
                    .or_default();
                e.0 += 1;
                if !gpu.is_free() {
                    e.1 += 1;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::*;

    fn registered(n: u32) -> EventData {
        EventData::NodeRegistered(fixtures::node("a", "z", n, fixtures::MODEL, 40))
    }

    #[test]
    fn holds_and_releases_follow_the_log() {
        let mut f = Fleet::default();
        f.apply(1, &registered(4));
        let lease = Uuid::from_u128(7);
        f.apply(
            2,
            &EventData::NodeGpusAllocated(NodeGpusAllocated::one("a", lease, vec![1, 2])),
        );
        assert_eq!(f.node_sequence["a"], 2);
        assert_eq!(
            f.usage_by_zone_model()[&("z".into(), "A100-40GB".into())],
            (4, 2)
        );
        // A node re-registering keeps its holdings.
        f.apply(3, &registered(4));
        assert_eq!(
            f.usage_by_zone_model()[&("z".into(), "A100-40GB".into())],
            (4, 2)
        );
        f.apply(
            4,
            &EventData::LeaseEnded(LeaseEnded {
                lease_id: lease,
                node_id: Some("a".into()),
                ended_at: chrono::Utc::now(),
                reason: EndReason::Stopped,
                exit_code: None,
                failure: None,
            }),
        );
        assert_eq!(
            f.usage_by_zone_model()[&("z".into(), "A100-40GB".into())],
            (4, 0)
        );
    }

    #[test]
    fn fractional_shares_add_up_per_gpu_and_survive_re_registration() {
        let mut f = Fleet::default();
        f.apply(1, &registered(2));
        let share = |lease: u128, milli: u32, vram_gb: u32| {
            EventData::NodeGpusAllocated(NodeGpusAllocated {
                node_id: "a".into(),
                allocations: vec![NodeAllocation {
                    lease_id: Uuid::from_u128(lease),
                    gpu_indices: vec![1],
                    milli: Some(milli),
                    vram_gb: Some(vram_gb),
                    mig_instance: None,
                }],
            })
        };
        f.apply(2, &share(1, 300, 10));
        f.apply(3, &share(2, 500, 20));
        let gpu = |f: &Fleet| f.nodes["a"].gpus[1].clone();
        assert_eq!((gpu(&f).used_milli(), gpu(&f).used_vram_gb()), (800, 30));
        assert!(!gpu(&f).is_free() && gpu(&f).held_by.is_none());
        f.apply(4, &registered(2));
        assert_eq!((gpu(&f).used_milli(), gpu(&f).used_vram_gb()), (800, 30));
        f.apply(
            5,
            &EventData::LeaseEnded(LeaseEnded {
                lease_id: Uuid::from_u128(1),
                node_id: Some("a".into()),
                ended_at: chrono::Utc::now(),
                reason: EndReason::Stopped,
                exit_code: None,
                failure: None,
            }),
        );
        assert_eq!((gpu(&f).used_milli(), gpu(&f).used_vram_gb()), (500, 20));
        assert_eq!(
            f.usage_by_zone_model()[&("z".into(), "A100-40GB".into())],
            (2, 1)
        );
    }
}
