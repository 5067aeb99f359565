//! Times a node reports of what it did (a lease's start, end and
//! suspension, a GPU's change of health), held to a clock the node does
//! not control.
//!
//! A node's clock may run wrong, and a node may lie, yet its times decide
//! bills and lease-time. So a reader never takes them as given: each is
//! held to no later than the log server stored the report and no earlier
//! than the nodes' clock skew before that ([`held_to`]). A node moves what
//! it is billed by at most the skew. [`Envelope::held_to_the_log`] is the
//! one list of the times so held; the decide loop
//! (`lh_service::decider`) folds every stored event through it, so no
//! decider holds a time of its own.

use std::borrow::Cow;

use chrono::{DateTime, Duration, Utc};

use crate::{Actor, Envelope, EventData};

/// How far a node's clock may be from the log server's before its
/// timestamps are not believed, by default.
pub const DEFAULT_NODE_CLOCK_SKEW_SECS: i64 = 30;

/// A node's own timestamp of something it reports, held to what a clock
/// the node does not control saw (`witnessed_at`: when the log stored the
/// report, or when a heartbeat was heard): not later than that, nor earlier
/// than `skew` before it.
pub fn held_to(
    claimed: DateTime<Utc>,
    witnessed_at: DateTime<Utc>,
    skew: Duration,
) -> DateTime<Utc> {
    claimed.clamp(witnessed_at - skew.abs(), witnessed_at)
}

impl Envelope {
    /// This event as a reader must take it, stored at `stored_at`: the
    /// times its node reported held to the log ([`held_to`]), and the
    /// events a restatement carries each held to when it was stored. The
    /// event itself where nothing is off.
    pub fn held_to_the_log(&self, stored_at: DateTime<Utc>, skew: Duration) -> Cow<'_, Envelope> {
        if is_held(self, stored_at, skew) {
            return Cow::Borrowed(self);
        }
        let mut held = self.clone();
        hold(&mut held, stored_at, skew);
        Cow::Owned(held)
    }
}

/// The time of `envelope` that a node reported or that is worked out from
/// a node's, and what a reader takes it as; `None` for an event without.
fn node_time(
    envelope: &Envelope,
    stored_at: DateTime<Utc>,
    skew: Duration,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let node_time = |claimed| Some((claimed, held_to(claimed, stored_at, skew)));
    match &envelope.data {
        EventData::LeaseStarted(e) => node_time(e.started_at),
        // A node's end: the scheduler's own (no node ran it any more) is
        // dated by the scheduler.
        EventData::LeaseEnded(e)
            if e.node_id.is_some() || matches!(envelope.actor, Actor::Node(_)) =>
        {
            node_time(e.ended_at)
        }
        // The scheduler's own end is its word, but no end, anyone's, is
        // later than it was stored: nothing bills ahead of the log.
        EventData::LeaseEnded(e) => Some((e.ended_at, e.ended_at.min(stored_at))),
        EventData::LeaseSuspended(e) => node_time(e.suspended_at),
        EventData::NodeGpuHealthChanged(e) => node_time(e.at),
        // The scheduler works it out from a node's times (its last
        // heartbeat, a GPU's failure), held when they were heard; a
        // migration can still never end a run after it was stored.
        EventData::LeaseMigrated(e) => Some((e.billing_ends_at, e.billing_ends_at.min(stored_at))),
        // A notice is given when it is stored, at the latest.
        EventData::LeasePreemptionNoticed(_) => {
            Some((envelope.occurred_at, envelope.occurred_at.min(stored_at)))
        }
        _ => None,
    }
}

/// Whether a reader takes `envelope` as it is.
fn is_held(envelope: &Envelope, stored_at: DateTime<Utc>, skew: Duration) -> bool {
    node_time(envelope, stored_at, skew).is_none_or(|(claimed, held)| claimed == held)
        && envelope.data.restated_history().is_none_or(|history| {
            history
                .iter()
                .all(|e| is_held(&e.envelope, e.stored_at, skew))
        })
}

/// Holds `envelope`'s node times to the log, in place.
fn hold(envelope: &mut Envelope, stored_at: DateTime<Utc>, skew: Duration) {
    if let Some((_, held)) = node_time(envelope, stored_at, skew) {
        match &mut envelope.data {
            EventData::LeaseStarted(e) => e.started_at = held,
            EventData::LeaseEnded(e) => e.ended_at = held,
            EventData::LeaseSuspended(e) => e.suspended_at = held,
            EventData::NodeGpuHealthChanged(e) => e.at = held,
            EventData::LeaseMigrated(e) => e.billing_ends_at = held,
            EventData::LeasePreemptionNoticed(_) => envelope.occurred_at = held,
            _ => {}
        }
    }
    if let Some(history) = envelope.data.restated_history_mut() {
        for e in history {
            hold(&mut e.envelope, e.stored_at, skew);
        }
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::{fixtures, EndReason, LeaseRestated, StatedEvent};

    fn stored() -> DateTime<Utc> {
        "2026-12-03T10:00:00Z".parse().unwrap()
    }

    fn skew() -> Duration {
        Duration::seconds(DEFAULT_NODE_CLOCK_SKEW_SECS)
    }

    /// `claimed` seconds before `stored()` (after it where negative).
    fn ago(seconds: i64) -> DateTime<Utc> {
        stored() - Duration::seconds(seconds)
    }

    /// Reads one time of an event.
    type TimeOf = fn(&Envelope) -> DateTime<Utc>;

    fn by_node(data: EventData) -> Envelope {
        Envelope::new(Actor::Node("n1".into()), stored(), data)
    }

    fn started_at(envelope: &Envelope) -> DateTime<Utc> {
        match &envelope.data {
            EventData::LeaseStarted(e) => e.started_at,
            other => panic!("not a start: {other:?}"),
        }
    }

    #[test]
    fn a_node_time_within_the_skew_is_taken_as_it_is() {
        assert_eq!(held_to(ago(10), stored(), skew()), ago(10));
        assert_eq!(held_to(ago(30), stored(), skew()), ago(30));
        assert_eq!(held_to(stored(), stored(), skew()), stored());
        let start = by_node(EventData::LeaseStarted(fixtures::started(
            Uuid::nil(),
            "n1",
            ago(10),
        )));
        assert!(matches!(
            start.held_to_the_log(stored(), skew()),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn a_node_time_far_in_the_past_is_held_to_the_skew_before_the_storing() {
        assert_eq!(held_to(ago(3600), stored(), skew()), ago(30));
        // A negative skew is its size.
        assert_eq!(held_to(ago(3600), stored(), -skew()), ago(30));
        let start = by_node(EventData::LeaseStarted(fixtures::started(
            Uuid::nil(),
            "n1",
            ago(3600),
        )));
        assert_eq!(
            started_at(&start.held_to_the_log(stored(), skew())),
            ago(30)
        );
    }

    #[test]
    fn a_node_time_far_in_the_future_is_held_to_the_storing() {
        assert_eq!(held_to(ago(-600), stored(), skew()), stored());
        let start = by_node(EventData::LeaseStarted(fixtures::started(
            Uuid::nil(),
            "n1",
            ago(-600),
        )));
        assert_eq!(
            started_at(&start.held_to_the_log(stored(), skew())),
            stored()
        );
    }

    #[test]
    fn each_node_time_is_held_and_nothing_else_is_changed() {
        let lease = Uuid::from_u128(1);
        let far = ago(3600);
        let cases: Vec<(Envelope, TimeOf, DateTime<Utc>)> = vec![
            (
                by_node(EventData::LeaseEnded(fixtures::ended(
                    lease,
                    "n1",
                    far,
                    EndReason::Completed,
                ))),
                |e| match &e.data {
                    EventData::LeaseEnded(e) => e.ended_at,
                    _ => unreachable!(),
                },
                ago(30),
            ),
            (
                by_node(EventData::LeaseSuspended(crate::LeaseSuspended {
                    lease_id: lease,
                    node_id: "n1".into(),
                    gpu_indices: vec![0],
                    suspended_at: ago(-600),
                    reason: "idle".into(),
                })),
                |e| match &e.data {
                    EventData::LeaseSuspended(e) => e.suspended_at,
                    _ => unreachable!(),
                },
                stored(),
            ),
            (
                by_node(EventData::NodeGpuHealthChanged(
                    crate::NodeGpuHealthChanged {
                        node_id: "n1".into(),
                        gpu_index: 0,
                        gpu_uuid: "GPU-0".into(),
                        from: crate::GpuHealth::Healthy,
                        to: crate::GpuHealth::Unhealthy,
                        reason: "lost".into(),
                        evidence: Default::default(),
                        at: far,
                    },
                )),
                |e| match &e.data {
                    EventData::NodeGpuHealthChanged(e) => e.at,
                    _ => unreachable!(),
                },
                ago(30),
            ),
        ];
        for (envelope, time, expected) in cases {
            let held = envelope.held_to_the_log(stored(), skew());
            assert_eq!(time(&held), expected, "{}", envelope.event_type);
            let mut as_claimed = held.into_owned();
            as_claimed.data = envelope.data.clone();
            assert_eq!(as_claimed, envelope, "only the node's time changes");
        }
    }

    #[test]
    fn the_scheduler_s_own_times_are_only_kept_from_after_the_storing() {
        let lease = Uuid::from_u128(1);
        // The scheduler's end of a lease no node runs is its own.
        let mut own_end = fixtures::ended(lease, "n1", ago(3600), EndReason::Failed);
        own_end.node_id = None;
        let own_end = |ended_at| {
            let mut e = own_end.clone();
            e.ended_at = ended_at;
            Envelope::new(
                Actor::Service("scheduler".into()),
                stored(),
                EventData::LeaseEnded(e),
            )
        };
        assert!(matches!(
            own_end(ago(3600)).held_to_the_log(stored(), skew()),
            Cow::Borrowed(_)
        ));
        // Never later than it was stored: a century ahead bills nothing.
        let ahead = own_end(stored() + chrono::Duration::days(36_500));
        match &ahead.held_to_the_log(stored(), skew()).data {
            EventData::LeaseEnded(e) => assert_eq!(e.ended_at, stored()),
            other => panic!("{other:?}"),
        }
        // A move's last billed instant may be long before it was stored,
        // never after.
        let moved = |billing_ends_at| {
            Envelope::new(
                Actor::Service("scheduler".into()),
                stored(),
                EventData::LeaseMigrated(crate::LeaseMigrated {
                    lease_id: lease,
                    reason: "node lost".into(),
                    from_node_id: "n1".into(),
                    from_gpu_indices: vec![0],
                    billing_ends_at,
                    to: None,
                }),
            )
        };
        let billing_ends_at = |e: &Envelope| match &e.data {
            EventData::LeaseMigrated(m) => m.billing_ends_at,
            _ => unreachable!(),
        };
        let long_ago = moved(ago(3600));
        assert_eq!(
            billing_ends_at(&long_ago.held_to_the_log(stored(), skew())),
            ago(3600)
        );
        let ahead = moved(ago(-600));
        assert_eq!(
            billing_ends_at(&ahead.held_to_the_log(stored(), skew())),
            stored()
        );
        // A notice is given when it is stored, at the latest.
        let mut notice = Envelope::new(
            Actor::Service("scheduler".into()),
            ago(-600),
            EventData::LeasePreemptionNoticed(crate::LeasePreemptionNoticed {
                lease_id: lease,
                node_id: "n1".into(),
                preempted_for: Uuid::from_u128(2),
                deadline: ago(-720),
                reason: Default::default(),
            }),
        );
        let held = notice.held_to_the_log(stored(), skew()).into_owned();
        assert_eq!(held.occurred_at, stored());
        notice.occurred_at = ago(3600);
        assert!(matches!(
            notice.held_to_the_log(stored(), skew()),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn a_restatement_holds_each_event_it_carries_to_when_that_was_stored() {
        let lease = Uuid::from_u128(1);
        let first_stored = ago(7200);
        let start = Envelope::new(
            Actor::Node("n1".into()),
            first_stored,
            EventData::LeaseStarted(fixtures::started(
                lease,
                "n1",
                first_stored - Duration::hours(1),
            )),
        );
        let restated = Envelope::new(
            Actor::Service("scheduler".into()),
            stored(),
            EventData::LeaseRestated(LeaseRestated {
                lease_id: lease,
                tenant_id: Uuid::from_u128(2),
                history: vec![StatedEvent {
                    sequence: 5,
                    stored_at: first_stored,
                    envelope: Box::new(start),
                }],
            }),
        );
        let held = restated.held_to_the_log(stored(), skew());
        let history = held.data.restated_history().unwrap();
        assert_eq!(
            started_at(&history[0].envelope),
            first_stored - skew(),
            "held to its own storing, not the restatement's"
        );
        // Once held, it is held.
        assert!(matches!(
            held.held_to_the_log(stored(), skew()),
            Cow::Borrowed(_)
        ));
    }
}
