//! What the liveness and migration checks read of the fleet, kept up to
//! date as the log is folded and heartbeats are heard: which nodes are
//! lost, each node filed by when it was last heard, and which nodes may
//! hold leases that must move. A decision pass and a liveness check then
//! look at the nodes whose state calls for it, not at every node of the
//! fleet.

use std::collections::{BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use lh_domain::fleet::{Fleet, Node};
use lh_events::{DrainMode, GpuHealth};

use super::Heard;

/// When a node was last heard (our clock), `None` for never: what it is
/// filed under.
type Key = (Option<DateTime<Utc>>, String);

#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct NodeWatch {
    /// The fleet's stamp up to which this follows it.
    synced_at: u64,
    /// Fleet nodes not lost, and lost ones, by when each was last heard.
    live: BTreeSet<Key>,
    lost: BTreeSet<Key>,
    /// Per fleet node: when it was last heard, and whether it is lost (its
    /// place in `live` or `lost`).
    filed: HashMap<String, (Option<DateTime<Utc>>, bool)>,
    /// Nodes whose leases may have to move: lost, drained with `move`, or
    /// with an unhealthy GPU.
    troubled: BTreeSet<String>,
}

/// Whether leases on `node` may have to move (see `why_move`, which
/// decides for each lease).
pub(super) fn troubled(node: &Node) -> bool {
    node.lost.is_some()
        || node.cordoned == Some(Some(DrainMode::Move))
        || node.gpus.iter().any(|g| g.health == GpuHealth::Unhealthy)
}

impl NodeWatch {
    /// Follows the nodes `fleet` changed since this last looked.
    pub fn follow(&mut self, fleet: &Fleet, heard: &HashMap<String, Heard>) {
        let last = fleet.stamps.last();
        if last == self.synced_at {
            return;
        }
        for id in fleet.stamps.changed_after(self.synced_at) {
            if let Some(node) = fleet.nodes.get(id) {
                self.file(node, heard.get(id).map(|h| h.local));
            }
        }
        self.synced_at = last;
    }

    /// Files every node of `fleet` anew (the fleet was replaced whole).
    pub fn rebuild(&mut self, fleet: &Fleet, heard: &HashMap<String, Heard>) {
        *self = NodeWatch::default();
        for node in fleet.nodes.values() {
            self.file(node, heard.get(&node.id).map(|h| h.local));
        }
        self.synced_at = fleet.stamps.last();
    }

    /// Node `id` was heard last at `local`: filed again, if the fleet has it.
    pub fn heard(&mut self, id: &str, local: DateTime<Utc>) {
        let Some(&(at, lost)) = self.filed.get(id) else {
            return;
        };
        if at != Some(local) {
            self.refile(id, Some(local), lost);
        }
    }

    fn file(&mut self, node: &Node, heard: Option<DateTime<Utc>>) {
        self.refile(&node.id, heard, node.lost.is_some());
        if troubled(node) {
            if !self.troubled.contains(&node.id) {
                self.troubled.insert(node.id.clone());
            }
        } else {
            self.troubled.remove(&node.id);
        }
    }

    fn refile(&mut self, id: &str, heard: Option<DateTime<Utc>>, lost: bool) {
        let key = match self.filed.get_mut(id) {
            Some(filed) => {
                let (at, was_lost) = std::mem::replace(filed, (heard, lost));
                let mut key = (at, id.to_string());
                let from = if was_lost {
                    &mut self.lost
                } else {
                    &mut self.live
                };
                from.remove(&key);
                key.0 = heard;
                key
            }
            None => {
                self.filed.insert(id.to_string(), (heard, lost));
                (heard, id.to_string())
            }
        };
        if lost {
            self.lost.insert(key);
        } else {
            self.live.insert(key);
        }
    }

    /// Nodes held lost.
    pub fn lost_count(&self) -> usize {
        self.lost.len()
    }

    /// Nodes not lost whose last heartbeat (if any) came before `before`.
    pub fn live_heard_before(&self, before: DateTime<Utc>) -> impl Iterator<Item = &Key> {
        self.live.range(..(Some(before), String::new()))
    }

    /// Lost nodes heard at `since` or after.
    pub fn lost_heard_since(&self, since: DateTime<Utc>) -> impl Iterator<Item = &Key> {
        self.lost.range((Some(since), String::new())..)
    }

    /// Every lost node.
    pub fn lost(&self) -> impl Iterator<Item = &Key> {
        self.lost.iter()
    }

    /// Nodes whose leases may have to move.
    pub fn troubled(&self) -> &BTreeSet<String> {
        &self.troubled
    }
}
