//! Who may act on an aggregate now: the one rule every reader applies to a
//! stored event before it folds it.
//!
//! The subject and the owner table say which kind of publisher may write an
//! event type (`lh_events::subject::may_publish`), and the server's
//! permissions hold each node to its own origin token. Neither says whether
//! the publisher holds the aggregate *now*: any node may write `lease.ended`
//! on any lease id, as itself. So a node's report on a lease is obeyed only
//! while the lease is placed on that very node, by the payload's account as
//! well as the subject's, and has not ended; a tenant's request only on its
//! own lease; a node's report on a node only about itself. Everything else
//! is refused: the reader steps over it as `not_authorized`, exactly as it
//! steps over an event it cannot decode, so it reaches no fold, view, bill
//! or report.
//!
//! The rule needs the lease's placement as the log says it now, so it keeps
//! a [`LeaseHold`] per lease that has not ended, folded from the same events
//! it judges, in log order. The decide loop keeps it in its snapshot and the
//! projection loop in its transaction, so every reader judges every event
//! alike, on a replay as live. Pure: the caller brings each event with its
//! node times already held to the log (`lh_events::node_time`).

use std::borrow::Cow;
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use lh_events::{
    Actor, Envelope, EventData, NodeEnrolled, NodeRegistered, SkipReason, StatedEvent,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What the rule knows of a lease that has not ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseHold {
    /// Whose lease it is; `None` where the log placed it before stating it
    /// (never, from this platform's own writers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<Uuid>,
    /// The node it is placed on now: only this node may report on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// When its current run started, as the readers take it: its end and
    /// suspension are held to no earlier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// The node it last left (moved away, suspended): a late report of
    /// that node is refused as stale, not as an attack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_node: Option<String>,
    /// A gang's other members, the nodes besides `node_id` it holds GPUs
    /// on: each may report on its own part.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// The other members of the gang it last left: their late reports are
    /// stale too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_members: Vec<String>,
}

impl LeaseHold {
    /// Whether `node` holds the lease now, alone or as a gang's member.
    pub fn held_by(&self, node: &str) -> bool {
        self.node_id.as_deref() == Some(node) || self.members.iter().any(|m| m == node)
    }

    /// Whether `node` held the lease before its last move.
    fn left_by(&self, node: &str) -> bool {
        self.previous_node.as_deref() == Some(node)
            || self.previous_members.iter().any(|m| m == node)
    }

    /// The lease leaves every node it holds: the first member, and a
    /// gang's others.
    fn leave(&mut self) {
        if let Some(left) = self.node_id.take() {
            self.previous_node = Some(left);
        }
        self.previous_members = std::mem::take(&mut self.members);
    }
}

/// Why an event is not obeyed: a sentence for the log and the trail, and
/// the reason readers count it under.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct NotAuthorized {
    /// `not_authorized`, or `not_enrolled` for the registration of a node no
    /// operator enrolled (a node that starts before its enrollment, as
    /// every new one may, is not an attack on anyone).
    pub reason: SkipReason,
    pub detail: String,
}

/// The leases' holds and the nodes' enrollments, and the rule that judges
/// each event against them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authority {
    leases: HashMap<Uuid, LeaseHold>,
    /// Each node's newest enrollment: what its registration may claim.
    #[serde(default)]
    nodes: HashMap<String, NodeEnrolled>,
}

impl Authority {
    /// Leases that have not ended, as far as this reader has read.
    pub fn held_leases(&self) -> usize {
        self.leases.len()
    }

    /// The hold of lease `lease_id`, if it has not ended.
    pub fn lease(&self, lease_id: Uuid) -> Option<&LeaseHold> {
        self.leases.get(&lease_id)
    }

    /// The holds of `lease_ids` (those that have not ended), for a reader
    /// that keeps them outside its memory and loads what a batch touches.
    pub fn holds_of<'a>(
        &'a self,
        lease_ids: impl IntoIterator<Item = Uuid> + 'a,
    ) -> impl Iterator<Item = (Uuid, Option<&'a LeaseHold>)> + 'a {
        lease_ids
            .into_iter()
            .map(move |id| (id, self.leases.get(&id)))
    }

    /// Node `node_id`'s enrollment, if an operator enrolled it.
    pub fn enrollment(&self, node_id: &str) -> Option<&NodeEnrolled> {
        self.nodes.get(node_id)
    }

    /// Takes `enrollment` as node `node_id`'s, for a reader that loads
    /// them from its own store.
    pub fn set_enrollment(&mut self, node_id: &str, enrollment: Option<NodeEnrolled>) {
        match enrollment {
            Some(e) => self.nodes.insert(node_id.to_string(), e),
            None => self.nodes.remove(node_id),
        };
    }

    /// Takes `hold` as lease `lease_id`'s (`None`: the lease has ended or is
    /// unknown), for a reader that loads holds from its own store.
    pub fn set_hold(&mut self, lease_id: Uuid, hold: Option<LeaseHold>) {
        match hold {
            Some(hold) => self.leases.insert(lease_id, hold),
            None => self.leases.remove(&lease_id),
        };
    }

    /// Judges `envelope` (its node times held to the log already) and, when
    /// it is obeyed, folds it into the holds. What comes back is the event
    /// as readers must take it: itself, or with a time put back in order
    /// (an end before its start), or a restatement without the events in
    /// it that were never obeyed.
    pub fn admit<'a>(
        &mut self,
        envelope: &'a Envelope,
    ) -> Result<Cow<'a, Envelope>, NotAuthorized> {
        self.judge(envelope)?;
        if let EventData::LeaseRestated(restated) = &envelope.data {
            return Ok(self.restate(envelope, restated.lease_id, &restated.history));
        }
        if let EventData::NodeRestated(restated) = &envelope.data {
            return Ok(self.restate_node(envelope, &restated.node_id, &restated.history));
        }
        if let Some(history) = envelope.data.restated_history() {
            let kept = kept_history(history, |e| judge_stateless(e).is_ok());
            return Ok(with_history(envelope, kept));
        }
        Ok(self.fold(envelope))
    }

    /// [`Authority::admit`] for an event as stored at `stored_at`: its node
    /// times held to the log first (`lh_events::node_time`, by `skew`;
    /// `None` for a reader that takes no node's times).
    pub fn admit_stored<'a>(
        &mut self,
        envelope: &'a Envelope,
        stored_at: DateTime<Utc>,
        skew: Option<chrono::Duration>,
    ) -> Result<Cow<'a, Envelope>, NotAuthorized> {
        let Some(skew) = skew else {
            return self.admit(envelope);
        };
        match envelope.held_to_the_log(stored_at, skew) {
            Cow::Borrowed(envelope) => self.admit(envelope),
            Cow::Owned(held) => self
                .admit(&held)
                .map(|taken| Cow::Owned(taken.into_owned())),
        }
    }

    /// Refuses what the actor may not do to the aggregate as it stands.
    fn judge(&self, envelope: &Envelope) -> Result<(), NotAuthorized> {
        judge_stateless(envelope)?;
        if let EventData::NodeRegistered(registered) = &envelope.data {
            let Some(enrolled) = self.nodes.get(&registered.node_id) else {
                return Err(NotAuthorized {
                    reason: SkipReason::NotEnrolled,
                    ..refused(envelope, "a node no operator enrolled")
                });
            };
            return beyond_enrollment(registered, enrolled)
                .map_or(Ok(()), |what| Err(refused(envelope, &what)));
        }
        let Some(lease_id) = envelope.data.lease_id() else {
            return Ok(());
        };
        let hold = self.leases.get(&lease_id);
        match &envelope.actor {
            Actor::Node(node) => {
                let stale = |what: String| NotAuthorized {
                    reason: SkipReason::StaleReport,
                    ..refused(envelope, &format!("{what}, which this node has left"))
                };
                // Nothing holds it: a late report of a lease that ended
                // (the rule keeps nothing of ended leases, so it cannot
                // tell whose), or a guess at an id, which moves nothing.
                // Refused and counted, without a page.
                let Some(hold) = hold else {
                    return Err(NotAuthorized {
                        reason: SkipReason::StaleReport,
                        ..refused(envelope, "a lease that is unknown or has ended")
                    });
                };
                match &hold.node_id {
                    _ if hold.held_by(node) => Ok(()),
                    Some(placed) if hold.left_by(node) => {
                        Err(stale(format!("a lease placed on node {placed:?}")))
                    }
                    Some(placed) => Err(refused(
                        envelope,
                        &format!("a lease placed on node {placed:?}"),
                    )),
                    None if hold.left_by(node) => {
                        Err(stale("a lease placed on no node now".to_string()))
                    }
                    None => Err(refused(envelope, "a lease placed on no node now")),
                }
            }
            Actor::Tenant(tenant) => match &envelope.data {
                // A new lease is the tenant's by its payload (checked
                // above); a second request under the same id must agree.
                EventData::LeaseRequested(_) => match hold.and_then(|h| h.tenant_id) {
                    Some(owner) if owner != *tenant => {
                        Err(refused(envelope, "a lease of another tenant"))
                    }
                    _ => Ok(()),
                },
                // A lease no longer held has ended: a late stop changes
                // nothing, and no reader could tell whose it was.
                _ => match hold.and_then(|h| h.tenant_id) {
                    Some(owner) if owner != *tenant => {
                        Err(refused(envelope, "a lease of another tenant"))
                    }
                    _ => Ok(()),
                },
            },
            _ => Ok(()),
        }
    }

    /// Folds an obeyed event into the holds.
    fn fold<'a>(&mut self, envelope: &'a Envelope) -> Cow<'a, Envelope> {
        match &envelope.data {
            EventData::LeaseRequested(r) => {
                self.leases.entry(r.lease_id).or_insert_with(|| LeaseHold {
                    tenant_id: Some(r.tenant_id),
                    ..LeaseHold::default()
                });
            }
            EventData::LeasePlaced(p) => {
                let hold = self.leases.entry(p.lease_id).or_default();
                if let Some(left) = hold.node_id.take().filter(|n| *n != p.node_id) {
                    hold.previous_node = Some(left);
                }
                if !hold.members.is_empty() {
                    hold.previous_members = std::mem::take(&mut hold.members);
                }
                hold.node_id = Some(p.node_id.clone());
                hold.members = p.nodes().skip(1).map(str::to_string).collect();
                hold.started_at = None;
            }
            EventData::LeaseMigrated(m) => {
                if let Some(hold) = self.leases.get_mut(&m.lease_id) {
                    hold.leave();
                    hold.node_id = m.to.as_ref().map(|to| to.node_id.clone());
                    hold.started_at = None;
                }
            }
            EventData::LeaseStarted(s) => {
                if let Some(hold) = self.leases.get_mut(&s.lease_id) {
                    hold.started_at.get_or_insert(s.started_at);
                }
            }
            EventData::LeaseSuspended(s) => {
                let started_at = self.leases.get_mut(&s.lease_id).and_then(|hold| {
                    hold.leave();
                    hold.started_at.take()
                });
                if let Some(started_at) = started_at.filter(|at| s.suspended_at < *at) {
                    let mut held = envelope.clone();
                    if let EventData::LeaseSuspended(s) = &mut held.data {
                        s.suspended_at = started_at;
                    }
                    return Cow::Owned(held);
                }
            }
            EventData::LeaseEnded(e) => {
                let started_at = self
                    .leases
                    .remove(&e.lease_id)
                    .and_then(|hold| hold.started_at);
                if let Some(started_at) = started_at.filter(|at| e.ended_at < *at) {
                    let mut held = envelope.clone();
                    if let EventData::LeaseEnded(e) = &mut held.data {
                        e.ended_at = started_at;
                    }
                    return Cow::Owned(held);
                }
            }
            EventData::LeaseRejected(r) => {
                self.leases.remove(&r.lease_id);
            }
            EventData::NodeEnrolled(e) => {
                self.nodes.insert(e.node_id.clone(), e.clone());
            }
            _ => {}
        }
        Cow::Borrowed(envelope)
    }

    /// A restatement of a lease: its history judged afresh, in order, as if
    /// read from the start (an older one may hold events no reader obeyed),
    /// and the lease's hold taken from what it obeyed.
    fn restate<'a>(
        &mut self,
        envelope: &'a Envelope,
        lease_id: Uuid,
        history: &[StatedEvent],
    ) -> Cow<'a, Envelope> {
        let mut fresh = Authority::default();
        let mut kept: Vec<StatedEvent> = Vec::with_capacity(history.len());
        let mut changed = false;
        for stated in history {
            let same_lease = stated.envelope.data.lease_id() == Some(lease_id);
            match fresh.admit(&stated.envelope) {
                Ok(taken) if same_lease => {
                    if let Cow::Owned(taken) = taken {
                        changed = true;
                        kept.push(StatedEvent {
                            envelope: Box::new(taken),
                            ..stated.clone()
                        });
                    } else {
                        kept.push(stated.clone());
                    }
                }
                _ => changed = true,
            }
        }
        // A reader that holds the lease read what the restatement stands
        // for already, and more surely: a restatement may have left out
        // old events. One new to the lease takes it from the restatement.
        if !self.leases.contains_key(&lease_id) {
            self.set_hold(lease_id, fresh.leases.remove(&lease_id));
        }
        if changed {
            with_history(envelope, Some(kept))
        } else {
            Cow::Borrowed(envelope)
        }
    }
}

impl Authority {
    /// A restatement of a node: its history judged afresh, in order, its
    /// enrollment taken from what it carries.
    fn restate_node<'a>(
        &mut self,
        envelope: &'a Envelope,
        node_id: &str,
        history: &[StatedEvent],
    ) -> Cow<'a, Envelope> {
        let mut fresh = Authority::default();
        let mut kept: Vec<StatedEvent> = Vec::with_capacity(history.len());
        // A reader that holds the node's enrollment read it after all a
        // restatement stands for: its registrations count only within
        // that newest one, and the reader keeps it.
        let newest = self.nodes.get(node_id);
        for stated in history {
            let within_newest = match (&stated.envelope.data, newest) {
                (EventData::NodeRegistered(registered), Some(enrolled)) => {
                    beyond_enrollment(registered, enrolled).is_none()
                }
                _ => true,
            };
            if fresh.admit(&stated.envelope).is_ok() && within_newest {
                kept.push(stated.clone());
            }
        }
        if let Some(enrolled) = fresh.nodes.remove(node_id) {
            self.nodes.entry(node_id.to_string()).or_insert(enrolled);
        }
        if kept.len() == history.len() {
            Cow::Borrowed(envelope)
        } else {
            with_history(envelope, Some(kept))
        }
    }
}

/// What `registered` claims beyond `enrolled`, in words; `None` when it
/// claims nothing more.
fn beyond_enrollment(registered: &NodeRegistered, enrolled: &NodeEnrolled) -> Option<String> {
    if registered.zone != enrolled.zone {
        return Some(format!(
            "zone {:?}, enrolled in {:?}",
            registered.zone, enrolled.zone
        ));
    }
    if registered.gpus.len() > enrolled.max_gpus as usize {
        return Some(format!(
            "{} GPUs, enrolled for at most {}",
            registered.gpus.len(),
            enrolled.max_gpus
        ));
    }
    let mut indices = std::collections::HashSet::new();
    let mut uuids = std::collections::HashSet::new();
    for gpu in &registered.gpus {
        if !enrolled.gpu_models.contains(&gpu.model) {
            return Some(format!("a {} GPU, not an enrolled model", gpu.model));
        }
        if crate::catalog::vram_gb(&gpu.model).is_some_and(|vram| gpu.vram_gb > vram) {
            return Some(format!("a {} with {} GB", gpu.model, gpu.vram_gb));
        }
        if !indices.insert(gpu.index) || !uuids.insert(gpu.uuid.as_str()) {
            return Some(format!("GPU {} ({}) twice", gpu.index, gpu.uuid));
        }
    }
    if registered.isolation > enrolled.max_isolation {
        return Some(format!(
            "{} isolation, enrolled for at most {}",
            registered.isolation.as_str(),
            enrolled.max_isolation.as_str()
        ));
    }
    if !registered.gpu_sharing.is_none() && !enrolled.gpu_sharing.contains(&registered.gpu_sharing)
    {
        return Some(format!(
            "GPU sharing by {:?}, not enrolled",
            registered.gpu_sharing
        ));
    }
    None
}

/// What needs no state to refuse: a node speaking of another node, a
/// tenant speaking for another tenant.
fn judge_stateless(envelope: &Envelope) -> Result<(), NotAuthorized> {
    match &envelope.actor {
        Actor::Node(node) => match envelope.data.reporting_node() {
            Some(named) if named == node => Ok(()),
            Some(named) => Err(refused(
                envelope,
                &format!("a payload naming node {named:?}"),
            )),
            // A node's end must say whose it is: readers date an end by
            // its node's clock only when it names one.
            None if matches!(envelope.data, EventData::LeaseEnded(_)) => {
                Err(refused(envelope, "an end naming no node"))
            }
            None => Ok(()),
        },
        Actor::Tenant(tenant) => match envelope.data.tenant_id() {
            Some(named) if named != *tenant => {
                Err(refused(envelope, "a payload naming another tenant"))
            }
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

fn refused(envelope: &Envelope, what: &str) -> NotAuthorized {
    let target = envelope
        .data
        .lease_id()
        .map(|id| format!("lease {id}"))
        .unwrap_or_else(|| envelope.data.aggregate_subject());
    NotAuthorized {
        reason: SkipReason::NotAuthorized,
        detail: format!(
            "{} by {} on {target}: {what}",
            envelope.event_type,
            actor_name(&envelope.actor)
        ),
    }
}

fn actor_name(actor: &Actor) -> String {
    match actor {
        Actor::Tenant(id) => format!("tenant {id}"),
        Actor::Admin => "admin".into(),
        Actor::Auditor => "auditor".into(),
        Actor::Service(name) => format!("service {name}"),
        Actor::Node(node) => format!("node {node:?}"),
        Actor::Operator(op) => format!("operator {:?}", op.name),
    }
}

/// The stated events `keep` keeps; `None` when it keeps them all.
fn kept_history(
    history: &[StatedEvent],
    keep: impl Fn(&Envelope) -> bool,
) -> Option<Vec<StatedEvent>> {
    if history.iter().all(|e| keep(&e.envelope)) {
        return None;
    }
    Some(
        history
            .iter()
            .filter(|e| keep(&e.envelope))
            .cloned()
            .collect(),
    )
}

/// `envelope` with its restated history replaced by `kept`, where given.
fn with_history(envelope: &Envelope, kept: Option<Vec<StatedEvent>>) -> Cow<'_, Envelope> {
    let Some(kept) = kept else {
        return Cow::Borrowed(envelope);
    };
    let mut owned = envelope.clone();
    match &mut owned.data {
        EventData::LeaseRestated(r) => r.history = kept,
        EventData::TenantRestated(r) => r.history = kept,
        EventData::NodeRestated(r) => r.history = kept,
        EventData::PriceBookRestated(r) => r.history = kept,
        _ => {}
    }
    Cow::Owned(owned)
}

#[cfg(test)]
mod tests;
