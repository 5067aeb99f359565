//! The fleet a decision pass plans on: the state's fleet as the log says
//! it, with the pass's own decisions on top. A pass changes a few nodes of
//! thousands, so only what its decisions touch is copied (a node, a lease's
//! holding); everything else is read from the state's fleet.

use std::collections::HashMap;

use lh_domain::fleet::{Fleet, Node};
use lh_events::{EventData, MigInstance, NodeGpusAllocated};
use uuid::Uuid;

/// What a decision reads of the fleet, whether the state's own or a pass's
/// [`PlannedFleet`] over it.
pub trait FleetView {
    fn node(&self, id: &str) -> Option<&Node>;
    /// Every node, in id order.
    fn nodes(&self) -> impl Iterator<Item = &Node>;
    /// Sequence of the last event on the node's subject (0 for none).
    fn node_sequence(&self, id: &str) -> u64;
    /// Node and GPU indices a live lease holds (a gang's first member's).
    fn holding(&self, lease: &Uuid) -> Option<&(String, Vec<u32>)>;
    /// A gang's other members: node and GPU indices of each.
    fn gang_members(&self, lease: &Uuid) -> &[(String, Vec<u32>)];
    /// Every node a live lease holds GPUs on.
    fn holding_nodes(&self, lease: &Uuid) -> Vec<String> {
        let first = self.holding(lease).map(|(node, _)| node.clone());
        let members = self
            .gang_members(lease)
            .iter()
            .map(|(node, _)| node.clone());
        first.into_iter().chain(members).collect()
    }
}

impl FleetView for Fleet {
    fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.get(id)
    }

    fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    fn node_sequence(&self, id: &str) -> u64 {
        self.node_sequence.get(id).copied().unwrap_or(0)
    }

    fn holding(&self, lease: &Uuid) -> Option<&(String, Vec<u32>)> {
        self.holdings.get(lease)
    }

    fn gang_members(&self, lease: &Uuid) -> &[(String, Vec<u32>)] {
        self.gang_members.get(lease).map_or(&[], Vec::as_slice)
    }
}

/// The fleet of one pass: `base` and what the pass changed. A lease entry
/// of `None` is one the pass gave back.
#[derive(Debug)]
pub struct PlannedFleet<'a> {
    base: &'a Fleet,
    /// Hashed: a node of the base is found by id in a tree of thousands,
    /// a cache miss a level; a pass finds the nodes it changed again and
    /// again.
    nodes: HashMap<String, Node>,
    node_sequence: HashMap<String, u64>,
    holdings: HashMap<Uuid, Option<(String, Vec<u32>)>>,
    gang_members: HashMap<Uuid, Vec<(String, Vec<u32>)>>,
    shares: HashMap<Uuid, Option<(u32, u32)>>,
    mig_instances: HashMap<Uuid, Option<MigInstance>>,
}

/// What folding one event reads and writes of a fleet.
enum Reach {
    Some(Vec<String>, Vec<Uuid>),
    /// Anything (a node registering looks for its leases among all of
    /// them; a restatement replays a whole history).
    All,
}

impl<'a> PlannedFleet<'a> {
    pub fn new(base: &'a Fleet) -> Self {
        PlannedFleet {
            base,
            nodes: HashMap::new(),
            node_sequence: HashMap::new(),
            holdings: HashMap::new(),
            gang_members: HashMap::new(),
            shares: HashMap::new(),
            mig_instances: HashMap::new(),
        }
    }

    /// The fleet as the log says it, under the pass's changes.
    pub fn base(&self) -> &'a Fleet {
        self.base
    }

    /// Ids of the nodes the pass changed, in no order.
    pub fn changed_nodes(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// Whether the pass changed node `id`.
    pub fn changed(&self, id: &str) -> bool {
        self.nodes.contains_key(id)
    }

    /// Node `id`, to change in this pass only.
    pub fn node_mut(&mut self, id: &str) -> Option<&mut Node> {
        if !self.nodes.contains_key(id) {
            let node = self.base.nodes.get(id)?.clone();
            self.nodes.insert(id.to_string(), node);
        }
        self.nodes.get_mut(id)
    }

    /// Folds one event in, as [`Fleet::apply`] does on the whole fleet:
    /// what it reaches is moved into a fleet of its own, folded there, and
    /// kept as this pass's; a placement (every pass's most frequent
    /// change) is folded in place.
    pub fn apply(&mut self, sequence: u64, data: &EventData) {
        if let EventData::NodeGpusAllocated(e) = data {
            return self.allocate(sequence, e);
        }
        let (nodes, leases) = match self.reach(data) {
            Reach::Some(nodes, leases) => (nodes, leases),
            Reach::All => (self.base.nodes.keys().cloned().collect(), self.all_leases()),
        };
        let mut part = Fleet::default();
        for id in &nodes {
            let node = self
                .nodes
                .remove(id)
                .or_else(|| self.base.nodes.get(id).cloned());
            if let Some(node) = node {
                part.nodes.insert(id.clone(), node);
            }
            let sequence = self
                .node_sequence
                .get(id)
                .or_else(|| self.base.node_sequence.get(id));
            if let Some(&sequence) = sequence {
                part.node_sequence.insert(id.clone(), sequence);
            }
        }
        for lease in &leases {
            if let Some(h) = self.holding(lease) {
                part.holdings.insert(*lease, h.clone());
            }
            let members = self.gang_members(lease);
            if !members.is_empty() {
                part.gang_members.insert(*lease, members.to_vec());
            }
            if let Some(s) = self.share(lease) {
                part.shares.insert(*lease, s);
            }
            if let Some(m) = self.mig_instance(lease) {
                part.mig_instances.insert(*lease, m.clone());
            }
        }
        part.apply(sequence, data);
        for id in nodes {
            if let Some(&sequence) = part.node_sequence.get(&id) {
                self.node_sequence.insert(id.clone(), sequence);
            }
            if let Some(node) = part.nodes.remove(&id) {
                self.nodes.insert(id, node);
            }
        }
        for lease in leases {
            self.holdings.insert(lease, part.holdings.remove(&lease));
            self.gang_members
                .insert(lease, part.gang_members.remove(&lease).unwrap_or_default());
            self.shares.insert(lease, part.shares.remove(&lease));
            self.mig_instances
                .insert(lease, part.mig_instances.remove(&lease));
        }
    }

    /// [`Fleet::apply`] of a `node.gpus_allocated`.
    fn allocate(&mut self, sequence: u64, e: &NodeGpusAllocated) {
        for a in &e.allocations {
            match self.holding(&a.lease_id) {
                None => {
                    self.holdings
                        .insert(a.lease_id, Some((e.node_id.clone(), a.gpu_indices.clone())));
                }
                Some((first, _)) if *first == e.node_id => continue,
                // Another member of a gang.
                Some(_) => {
                    let mut members = self.gang_members(&a.lease_id).to_vec();
                    if members.iter().any(|(n, _)| *n == e.node_id) {
                        continue;
                    }
                    members.push((e.node_id.clone(), a.gpu_indices.clone()));
                    self.gang_members.insert(a.lease_id, members);
                }
            }
            let share = a.milli.zip(a.vram_gb);
            if share.is_some() {
                self.shares.insert(a.lease_id, share);
            }
            if let Some(m) = &a.mig_instance {
                self.mig_instances.insert(a.lease_id, Some(m.clone()));
            }
            if let Some(node) = self.node_mut(&e.node_id) {
                node.hold(a.lease_id, &a.gpu_indices, share, a.mig_instance.as_ref());
            }
        }
        // A writer may apply its own event before the feed repeats older
        // ones: a node's sequence never moves backwards.
        let at = FleetView::node_sequence(self, &e.node_id).max(sequence);
        self.node_sequence.insert(e.node_id.clone(), at);
    }

    fn reach(&self, data: &EventData) -> Reach {
        match data {
            EventData::NodeGpusAllocated(e) => Reach::Some(
                vec![e.node_id.clone()],
                e.allocations.iter().map(|a| a.lease_id).collect(),
            ),
            EventData::LeasePlaced(e) => {
                Reach::Some(e.nodes().map(str::to_string).collect(), vec![e.lease_id])
            }
            EventData::LeaseEnded(e) => {
                Reach::Some(self.holding_nodes(&e.lease_id), vec![e.lease_id])
            }
            EventData::LeaseSuspended(e) => {
                Reach::Some(self.holding_nodes(&e.lease_id), vec![e.lease_id])
            }
            EventData::LeaseMigrated(e) => {
                let mut nodes = self.holding_nodes(&e.lease_id);
                nodes.extend(e.to.as_ref().map(|to| to.node_id.clone()));
                nodes.sort();
                nodes.dedup();
                Reach::Some(nodes, vec![e.lease_id])
            }
            EventData::NodeLost(e) => Reach::Some(vec![e.node_id.clone()], Vec::new()),
            EventData::NodeRejoined(e) => Reach::Some(vec![e.node_id.clone()], Vec::new()),
            EventData::NodeCordoned(e) => Reach::Some(vec![e.node_id.clone()], Vec::new()),
            EventData::NodeUncordoned(e) => Reach::Some(vec![e.node_id.clone()], Vec::new()),
            EventData::NodeGpuHealthChanged(e) => Reach::Some(vec![e.node_id.clone()], Vec::new()),
            EventData::NodeGpuSelfTested(e) => Reach::Some(vec![e.node_id.clone()], Vec::new()),
            _ => Reach::All,
        }
    }

    /// Every lease with a holding, share or instance, in the base or here.
    fn all_leases(&self) -> Vec<Uuid> {
        let mut leases: Vec<Uuid> = self
            .base
            .holdings
            .keys()
            .chain(self.base.shares.keys())
            .chain(self.base.mig_instances.keys())
            .chain(self.base.gang_members.keys())
            .chain(self.holdings.keys())
            .chain(self.shares.keys())
            .chain(self.mig_instances.keys())
            .copied()
            .collect();
        leases.sort_unstable();
        leases.dedup();
        leases
    }

    fn share(&self, lease: &Uuid) -> Option<(u32, u32)> {
        match self.shares.get(lease) {
            Some(mine) => *mine,
            None => self.base.shares.get(lease).copied(),
        }
    }

    fn mig_instance(&self, lease: &Uuid) -> Option<&MigInstance> {
        match self.mig_instances.get(lease) {
            Some(mine) => mine.as_ref(),
            None => self.base.mig_instances.get(lease),
        }
    }
}

impl FleetView for PlannedFleet<'_> {
    fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.get(id).or_else(|| self.base.nodes.get(id))
    }

    fn nodes(&self) -> impl Iterator<Item = &Node> {
        // The pass never adds a node: the base's, in its order, each as
        // the pass changed it.
        let changed = !self.nodes.is_empty();
        self.base.nodes.values().map(move |n| match changed {
            true => self.nodes.get(&n.id).unwrap_or(n),
            false => n,
        })
    }

    fn node_sequence(&self, id: &str) -> u64 {
        match self.node_sequence.get(id) {
            Some(&mine) => mine,
            None => self.base.node_sequence(id),
        }
    }

    fn holding(&self, lease: &Uuid) -> Option<&(String, Vec<u32>)> {
        match self.holdings.get(lease) {
            Some(mine) => mine.as_ref(),
            None => self.base.holdings.get(lease),
        }
    }

    fn gang_members(&self, lease: &Uuid) -> &[(String, Vec<u32>)] {
        match self.gang_members.get(lease) {
            Some(mine) => mine,
            None => self.base.gang_members(lease),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lh_events::*;

    fn registered(id: &str, n: u32) -> EventData {
        EventData::NodeRegistered(fixtures::node(id, "z", n, fixtures::MODEL, 40))
    }

    fn allocated(node: &str, lease: u128, gpus: Vec<u32>) -> EventData {
        EventData::NodeGpusAllocated(NodeGpusAllocated::one(node, Uuid::from_u128(lease), gpus))
    }

    /// A share of GPU `gpu` (a MIG instance's, with `mig`).
    fn shared(node: &str, lease: u128, gpu: u32, mig: Option<(&str, u8)>) -> EventData {
        EventData::NodeGpusAllocated(NodeGpusAllocated {
            node_id: node.into(),
            allocations: vec![NodeAllocation {
                lease_id: Uuid::from_u128(lease),
                gpu_indices: vec![gpu],
                milli: Some(250),
                vram_gb: Some(10),
                mig_instance: mig.map(|(profile, start)| MigInstance {
                    profile: profile.into(),
                    start,
                }),
            }],
        })
    }

    fn ended(lease: u128) -> EventData {
        EventData::LeaseEnded(LeaseEnded {
            lease_id: Uuid::from_u128(lease),
            node_id: None,
            ended_at: chrono::Utc::now(),
            reason: EndReason::Stopped,
            exit_code: None,
            failure: None,
        })
    }

    /// Folding into the planned fleet reads as folding into a copy of the whole
    /// fleet, and leaves the fleet under it as it was.
    #[test]
    fn a_planned_fleet_reads_as_a_copy_of_the_fleet() {
        let mut base = Fleet::default();
        for (i, e) in [
            registered("a", 4),
            registered("b", 4),
            registered("c", 2),
            allocated("a", 1, vec![0, 1]),
            allocated("b", 2, vec![3]),
        ]
        .iter()
        .enumerate()
        {
            base.apply(i as u64 + 1, e);
        }
        let before = serde_json::to_value(&base).unwrap();
        let mut copy = base.clone();
        let mut planned = PlannedFleet::new(&base);
        let lost = EventData::NodeLost(NodeLost {
            node_id: "c".into(),
            last_heard_at: chrono::Utc::now(),
            silence_ms: 1,
        });
        for e in [
            allocated("b", 3, vec![0]),
            ended(1),
            allocated("a", 4, vec![1, 2]),
            lost,
            allocated("b", 5, vec![1]),
            ended(2),
            shared("a", 6, 3, None),
            shared("a", 7, 3, None),
            shared("c", 8, 1, Some(("1g.5gb", 0))),
            // Held already: changes nothing but the node's sequence.
            shared("b", 6, 2, None),
            ended(6),
        ] {
            copy.apply(u64::MAX, &e);
            planned.apply(u64::MAX, &e);
        }
        let reserved = Uuid::from_u128(9);
        copy.nodes.get_mut("c").unwrap().gpus[0].held_by = Some(reserved);
        planned.node_mut("c").unwrap().gpus[0].held_by = Some(reserved);

        let nodes: Vec<&Node> = planned.nodes().collect();
        assert_eq!(nodes, copy.nodes.values().collect::<Vec<_>>());
        for id in ["a", "b", "c", "d"] {
            assert_eq!(planned.node(id), copy.nodes.get(id));
            assert_eq!(
                FleetView::node_sequence(&planned, id),
                copy.node_sequence(id)
            );
        }
        for lease in 0..10 {
            let lease = Uuid::from_u128(lease);
            assert_eq!(planned.holding(&lease), copy.holdings.get(&lease));
            assert_eq!(planned.share(&lease), copy.shares.get(&lease).copied());
            assert_eq!(planned.mig_instance(&lease), copy.mig_instances.get(&lease));
        }
        let mut changed: Vec<&str> = planned.changed_nodes().collect();
        changed.sort();
        assert_eq!(changed, ["a", "b", "c"]);
        assert_eq!(serde_json::to_value(&base).unwrap(), before);
    }
}
