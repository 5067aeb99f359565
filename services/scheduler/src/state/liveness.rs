//! Node liveness: heartbeats heard, and `node.lost` / `node.rejoined` when
//! a node falls silent or is heard again.

use chrono::{DateTime, Utc};
use lh_domain::fleet::Fleet;
use lh_events::Expect;
use lh_events::{EventData, NodeLost, NodeRejoined};

use super::*;

/// The last heartbeat of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heard {
    /// When we received it (our clock: silence is measured on it).
    pub local: DateTime<Utc>,
    /// The node's own timestamp in it (billing of its leases ends there).
    pub node_at: DateTime<Utc>,
}

impl State {
    /// A live heartbeat of `node_id` stamped `node_at` arrived at `local`.
    /// The first one after the whole fleet was silent longer than the loss
    /// window means the scheduler can hear again (NATS came back, its
    /// subscription was renewed): every node's silence counts from then,
    /// so the others get the time their next heartbeat needs.
    pub fn heard_live(
        &mut self,
        node_id: &str,
        node_at: DateTime<Utc>,
        local: DateTime<Utc>,
        rules: &Rules,
    ) {
        if self
            .last_heard_any
            .is_some_and(|any| local - any > rules.node_lost_after)
        {
            tracing::info!(
                silence_ms = (local - self.last_heard_any.unwrap_or(local)).num_milliseconds(),
                "heartbeats again after the whole fleet was silent"
            );
            self.hearing_resumed_at = Some(local);
        }
        let node_at = lh_domain::rating::clamp_node_time(node_at, local, rules.node_clock_skew);
        self.heard(node_id, node_at, local);
    }

    /// A heartbeat of `node_id` stamped `node_at` arrived at `local` (or
    /// was read back from the telemetry stream, `local` being its stamp).
    pub fn heard(&mut self, node_id: &str, node_at: DateTime<Utc>, local: DateTime<Utc>) {
        self.last_heard_any = Some(self.last_heard_any.map_or(local, |any| any.max(local)));
        let h = self
            .heard
            .entry(node_id.to_string())
            .or_insert(Heard { local, node_at });
        if local >= h.local {
            *h = Heard { local, node_at };
        }
    }

    /// Nodes whose liveness changes at `now`: `(node, lost)` for each node
    /// to declare lost (`true`) or rejoined (`false`).
    pub fn liveness_changes(&self, now: DateTime<Utc>, rules: &Rules) -> Vec<(String, bool)> {
        let Some(since) = self.liveness_since else {
            return Vec::new();
        };
        // Silence counts from our start, or from when we could hear again.
        let listening_since = self.hearing_resumed_at.map_or(since, |r| r.max(since));
        let fleet_quiet_since = self.last_heard_any.map_or(since, |any| any.max(since));
        let live_nodes = self
            .fleet
            .nodes
            .values()
            .filter(|n| n.lost.is_none())
            .count();
        let fleet_silence = now - fleet_quiet_since;
        let deaf = live_nodes >= 2
            && fleet_silence > rules.node_lost_after
            && fleet_silence <= rules.fleet_silence_grace;
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
    /// heard again; `scratch` follows.
    pub(super) fn decide_liveness(
        &self,
        now: DateTime<Utc>,
        rules: &Rules,
        scratch: &mut Fleet,
        out: &mut Vec<Batch>,
    ) {
        for (node_id, lost) in self.liveness_changes(now, rules) {
            let since = self.liveness_since.unwrap_or(now);
            let heard = self.heard.get(&node_id).copied();
            let node_seq = scratch.node_sequence.get(&node_id).copied().unwrap_or(0);
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
            scratch.apply(u64::MAX, &envelope.data);
            out.push(vec![(envelope, Expect::LastSubjectSequence(node_seq))]);
        }
    }
}
