//! Node liveness: heartbeats heard, and `node.lost` / `node.rejoined` when
//! a node falls silent or is heard again.

use chrono::{DateTime, Utc};
use lh_events::{EventData, Expect, NodeLost, NodeRejoined};
use lh_service::decider::Batch;

use super::{node_event, FleetView, PlannedFleet, Rules, State};

/// Heartbeats heard again after the whole fleet fell silent, from too few
/// nodes yet to take it that the scheduler hears again.
#[derive(Debug, Clone, Default)]
pub struct Resuming {
    pub since: DateTime<Utc>,
    /// How long the fleet had been silent before it.
    pub silence_ms: i64,
    pub nodes: std::collections::BTreeSet<String>,
    /// Whether it holds losses back while it waits for a second node: not
    /// when it began with the node that was last heard alone.
    pub shields: bool,
}

/// The last heartbeat of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heard {
    /// When we received it (our clock: silence is measured on it).
    pub local: DateTime<Utc>,
    /// The node's own timestamp in it (billing of its leases ends there).
    pub node_at: DateTime<Utc>,
}

/// Most nodes heard that the fleet does not hold (yet), past the fleet's
/// own size.
pub const MAX_UNREGISTERED_NODES_HEARD: usize = 1_024;

impl State {
    /// A live heartbeat of `node_id` stamped `node_at` arrived at `local`.
    /// Heartbeats of two nodes within one loss window, after the whole
    /// fleet was silent longer than that, mean the scheduler hears again
    /// (NATS came back, its subscription was renewed): every node's silence
    /// counts from the first of them, so the others get the time their
    /// next heartbeat needs.
    pub fn heard_live(
        &mut self,
        node_id: &str,
        node_at: DateTime<Utc>,
        local: DateTime<Utc>,
        rules: &Rules,
    ) {
        let node_at = lh_events::node_time::held_to(node_at, local, rules.node_clock_skew);
        // A node the fleet does not know says nothing about our hearing.
        if !self.fleet.nodes.contains_key(node_id) {
            self.heard(node_id, node_at, local);
            return;
        }
        // A lone voice after the silence (one node whose host flaps) is not
        // the hearing back: it takes two nodes within one loss window (or
        // the only one there is).
        if let Some(r) = self
            .resuming
            .take_if(|r| local - r.since > rules.node_lost_after)
        {
            // Nobody joined it: the next time that node alone is heard after
            // a silence, it shields no one.
            self.lone_voice = (r.nodes.len() == 1)
                .then(|| r.nodes.into_iter().next())
                .flatten();
        }
        if self.resuming.is_none()
            && self
                .last_heard_any
                .is_some_and(|any| local - any > rules.node_lost_after)
        {
            self.resuming = Some(Resuming {
                since: local,
                silence_ms: self
                    .last_heard_any
                    .map_or(0, |any| (local - any).num_milliseconds()),
                nodes: Default::default(),
                shields: self.lone_voice.as_deref() != Some(node_id),
            });
        }
        let live_nodes = self.fleet.nodes.len() - self.watch.lost_count();
        if let Some(r) = &mut self.resuming {
            r.nodes.insert(node_id.to_string());
            if r.nodes.len() >= live_nodes.clamp(1, 2) {
                tracing::info!(
                    silence_ms = r.silence_ms,
                    "heartbeats again after the whole fleet was silent"
                );
                self.hearing_resumed_at = Some(r.since);
                self.resuming = None;
                self.lone_voice = None;
            }
        }
        self.heard(node_id, node_at, local);
    }

    /// Nodes whose last heartbeat is kept.
    pub fn heard_nodes(&self) -> usize {
        self.heard.len()
    }

    /// A heartbeat of `node_id` stamped `node_at` arrived at `local` (or
    /// was read back from the telemetry stream, `local` being its stamp).
    pub fn heard(&mut self, node_id: &str, node_at: DateTime<Utc>, local: DateTime<Utc>) {
        if self.fleet.nodes.contains_key(node_id) {
            self.last_heard_any = Some(self.last_heard_any.map_or(local, |any| any.max(local)));
        } else if self.heard.len() >= self.fleet.nodes.len() + MAX_UNREGISTERED_NODES_HEARD
            && !self.heard.contains_key(node_id)
        {
            // Kept for a node whose registration the fold has not read
            // yet; past this, names no registration backs are dropped.
            return;
        }
        let h = self
            .heard
            .entry(node_id.to_string())
            .or_insert(Heard { local, node_at });
        if local >= h.local {
            *h = Heard { local, node_at };
        }
        let local = h.local;
        self.watch.heard(node_id, local);
    }

    /// Nodes whose liveness changes at `now`: `(node, lost)` for each node
    /// to declare lost (`true`) or rejoined (`false`), in node order. Only
    /// the nodes silent past the window and the lost nodes heard within it
    /// are looked at (see [`super::watch`]).
    pub fn liveness_changes(&self, now: DateTime<Utc>, rules: &Rules) -> Vec<(String, bool)> {
        let Some(since) = self.liveness_since else {
            return Vec::new();
        };
        // Silence counts from our start, or from when we could hear again.
        let listening_since = self.hearing_resumed_at.map_or(since, |r| r.max(since));
        let live_nodes = self.fleet.nodes.len() - self.watch.lost_count();
        let deaf = self.deaf(now, since, live_nodes, rules);
        // A node is silent when both its last heartbeat (or our start, if
        // none came) and the time we could hear again are before this.
        let silent_before = now - rules.node_lost_after;
        let mut out: Vec<(String, bool)> = if listening_since < silent_before {
            let lost = self
                .watch
                .live_heard_before(silent_before)
                .filter(|_| !deaf)
                .map(|(_, id)| (id.clone(), true));
            let rejoined = self
                .watch
                .lost_heard_since(silent_before)
                .map(|(_, id)| (id.clone(), false));
            lost.chain(rejoined).collect()
        } else {
            // Nobody can have been silent that long yet.
            self.watch
                .lost()
                .map(|(_, id)| (id.clone(), false))
                .collect()
        };
        out.sort_unstable();
        out
    }

    /// Whether at `now` we cannot hear the fleet rather than its nodes are
    /// gone: at least two live nodes (`live_nodes`) and the whole fleet
    /// silent past the loss window but within the grace for a silence of
    /// NATS itself, or heartbeats only just back from too few nodes.
    /// Silence counts from `since` at the earliest.
    fn deaf(
        &self,
        now: DateTime<Utc>,
        since: DateTime<Utc>,
        live_nodes: usize,
        rules: &Rules,
    ) -> bool {
        let fleet_quiet_since = self.last_heard_any.map_or(since, |any| any.max(since));
        let fleet_silence = now - fleet_quiet_since;
        let resuming = self
            .resuming
            .as_ref()
            .is_some_and(|r| r.shields && now - r.since <= rules.node_lost_after);
        live_nodes >= 2
            && (resuming
                || (fleet_silence > rules.node_lost_after
                    && fleet_silence <= rules.fleet_silence_grace))
    }

    /// [`State::liveness_changes`] by looking at every node, as it was
    /// before the nodes were filed by when they were heard: what the tests
    /// hold the filed one to.
    #[cfg(test)]
    pub(super) fn liveness_changes_walking(
        &self,
        now: DateTime<Utc>,
        rules: &Rules,
    ) -> Vec<(String, bool)> {
        let Some(since) = self.liveness_since else {
            return Vec::new();
        };
        let listening_since = self.hearing_resumed_at.map_or(since, |r| r.max(since));
        let live_nodes = self
            .fleet
            .nodes
            .values()
            .filter(|n| n.lost.is_none())
            .count();
        let deaf = self.deaf(now, since, live_nodes, rules);
        let mut out = Vec::new();
        for node in self.fleet.nodes.values() {
            let last = self
                .heard
                .get(&node.id)
                .map_or(since, |h| h.local)
                .max(listening_since);
            let silent = now - last > rules.node_lost_after;
            if deaf && silent && node.lost.is_none() {
                continue;
            }
            match (node.lost.is_some(), silent) {
                (false, true) => out.push((node.id.clone(), true)),
                (true, false) => out.push((node.id.clone(), false)),
                _ => {}
            }
        }
        out
    }

    /// `node.lost` for nodes silent too long, `node.rejoined` for lost nodes
    /// heard again; `planned` follows.
    pub(super) fn decide_liveness(
        &self,
        now: DateTime<Utc>,
        rules: &Rules,
        planned: &mut PlannedFleet,
        out: &mut Vec<Batch>,
    ) {
        for (node_id, lost) in self.liveness_changes(now, rules) {
            let since = self.liveness_since.unwrap_or(now);
            let heard = self.heard.get(&node_id).copied();
            let node_seq = planned.node_sequence(&node_id);
            let data = if lost {
                let last_local = heard.map_or(since, |h| h.local);
                EventData::NodeLost(NodeLost {
                    node_id: node_id.clone(),
                    // Never heard since we started: bill no later than that.
                    last_heard_at: heard.map_or(since, |h| h.node_at),
                    silence_ms: (now - last_local).num_milliseconds().max(0) as u64,
                })
            } else {
                EventData::NodeRejoined(NodeRejoined {
                    node_id: node_id.clone(),
                    heard_at: heard.map_or(now, |h| h.node_at),
                })
            };
            let envelope = node_event(&node_id, node_seq, now, data);
            planned.apply(u64::MAX, &envelope.data);
            out.push(vec![(envelope, Expect::LastSubjectSequence(node_seq))]);
        }
    }
}
