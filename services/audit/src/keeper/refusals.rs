//! What the readers refused to obey, summed for operators: the copy tells
//! each refused event it committed, and once an interval ends one
//! `security.events_refused` per publisher and reason goes on the log.
//! A flood from one credential is thus a handful of events, never one per
//! forgery; the forgeries themselves are in the trail with their reasons.
//!
//! The tally lives in memory: a keeper that dies before an interval ends
//! loses that interval's sums (the metric `lh_events_skipped_total` and
//! the trail's rows keep the refusals).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::Bus;
use lh_events::{Actor, Envelope, EventData, Expect, SecurityEventsRefused, SkipReason};

/// How long one summary sums.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// Publishers one interval names; the rest are summed as `others`.
pub const MAX_PUBLISHERS_PER_INTERVAL: usize = 64;
/// Event types one summary names; the rest are summed as `others`.
pub const MAX_EVENT_TYPES_PER_SUMMARY: usize = 32;
/// The name of what is past a limit.
const OTHERS: &str = "others";

/// Whether a refusal of this kind is an operator's business: a message
/// that claims what its writer may not, as opposed to one that is merely
/// malformed, old or newer than this reader.
pub fn is_security_refusal(reason: SkipReason) -> bool {
    matches!(
        reason,
        SkipReason::NotAuthorized
            | SkipReason::NotEnrolled
            | SkipReason::StaleReport
            | SkipReason::NotOwner
            | SkipReason::WrongSubject
    )
}

/// One refused event, as the copy committed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub publisher: String,
    pub reason: SkipReason,
    pub event_type: String,
    pub sequence: u64,
}

#[derive(Debug, Default)]
struct Tally {
    refused: u64,
    first_sequence: u64,
    last_sequence: u64,
    by_event_type: BTreeMap<String, u64>,
}

/// The sums by publisher and reason.
type Tallies = BTreeMap<(String, &'static str), Tally>;

/// The refusals of the interval under way, and when it began.
#[derive(Debug)]
pub struct RefusalTally {
    inner: Mutex<(DateTime<Utc>, Tallies)>,
}

impl RefusalTally {
    pub fn new(now: DateTime<Utc>) -> Self {
        RefusalTally {
            inner: Mutex::new((now, BTreeMap::new())),
        }
    }

    pub fn add(&self, refusals: impl IntoIterator<Item = Refusal>) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let tallies = &mut inner.1;
        for r in refusals {
            let known = tallies.keys().any(|(p, _)| *p == r.publisher);
            let publisher = if known || distinct_publishers(tallies) < MAX_PUBLISHERS_PER_INTERVAL {
                r.publisher
            } else {
                OTHERS.to_string()
            };
            let tally = tallies.entry((publisher, r.reason.as_str())).or_default();
            if tally.refused == 0 {
                tally.first_sequence = r.sequence;
            }
            tally.refused += 1;
            tally.first_sequence = tally.first_sequence.min(r.sequence);
            tally.last_sequence = tally.last_sequence.max(r.sequence);
            let known = tally.by_event_type.contains_key(&r.event_type);
            let key = if known || tally.by_event_type.len() < MAX_EVENT_TYPES_PER_SUMMARY {
                r.event_type
            } else {
                OTHERS.to_string()
            };
            *tally.by_event_type.entry(key).or_default() += 1;
        }
    }

    /// The summaries of the interval that ended by `now`, and a new
    /// interval from `now`; none before an interval has passed.
    pub fn take_ended(&self, now: DateTime<Utc>) -> Vec<SecurityEventsRefused> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (from, _) = *inner;
        let interval = chrono::Duration::from_std(INTERVAL).unwrap_or(chrono::Duration::zero());
        if now < from + interval {
            return Vec::new();
        }
        let tallies = std::mem::take(&mut inner.1);
        inner.0 = now;
        tallies
            .into_iter()
            .map(|((publisher, reason), t)| SecurityEventsRefused {
                publisher,
                reason: reason.to_string(),
                from,
                to: now,
                refused: t.refused,
                first_sequence: t.first_sequence,
                last_sequence: t.last_sequence,
                by_event_type: t.by_event_type,
            })
            .collect()
    }
}

/// How many publishers `tallies` names (keys are ordered by publisher).
fn distinct_publishers(tallies: &Tallies) -> usize {
    let mut publishers: Vec<&String> = tallies.keys().map(|(p, _)| p).collect();
    publishers.dedup();
    publishers.len()
}

/// Publishes each ended interval's summaries, until the future is
/// dropped. A summary the log refuses is logged and dropped.
pub async fn publish_summaries(
    bus: Bus,
    tally: std::sync::Arc<RefusalTally>,
) -> std::convert::Infallible {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        every.tick().await;
        for summary in tally.take_ended(Utc::now()) {
            let (publisher, reason, refused) = (
                summary.publisher.clone(),
                summary.reason.clone(),
                summary.refused,
            );
            tracing::warn!(
                publisher,
                reason,
                refused,
                "events refused: their publisher may not do what they say"
            );
            let envelope = Envelope::new(
                Actor::Service("audit".into()),
                Utc::now(),
                EventData::SecurityEventsRefused(summary),
            );
            if let Err(e) = bus.publish(&envelope, Expect::Any).await {
                tracing::warn!(error = %e, publisher, refused, "a security.events_refused summary was not stored");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, 0).unwrap()
    }

    fn refusal(publisher: &str, reason: SkipReason, event_type: &str, sequence: u64) -> Refusal {
        Refusal {
            publisher: publisher.into(),
            reason,
            event_type: event_type.into(),
            sequence,
        }
    }

    #[test]
    fn refusals_are_summed_per_publisher_and_reason_once_the_interval_ends() {
        let tally = RefusalTally::new(at(0));
        tally.add([
            refusal("node-b", SkipReason::NotAuthorized, "lease.ended", 9),
            refusal("node-b", SkipReason::NotAuthorized, "lease.ended", 4),
            refusal("node-b", SkipReason::NotAuthorized, "lease.suspended", 12),
            refusal("node-b", SkipReason::StaleReport, "lease.started", 13),
            refusal("node-c", SkipReason::NotAuthorized, "lease.ended", 14),
        ]);
        assert!(tally.take_ended(at(9)).is_empty(), "the interval runs on");
        let summaries = tally.take_ended(at(10));
        assert_eq!(summaries.len(), 3);
        let b = &summaries[0];
        assert_eq!(
            (b.publisher.as_str(), b.reason.as_str(), b.refused),
            ("node-b", "not_authorized", 3)
        );
        assert_eq!((b.first_sequence, b.last_sequence), (4, 12));
        assert_eq!(b.by_event_type["lease.ended"], 2);
        assert_eq!((b.from, b.to), (at(0), at(10)));
        assert_eq!(summaries[1].reason, "stale_report");
        assert_eq!(summaries[2].publisher, "node-c");
        assert!(tally.take_ended(at(25)).is_empty(), "nothing since");
    }

    #[test]
    fn a_flood_of_publishers_and_types_is_bounded() {
        let tally = RefusalTally::new(at(0));
        for i in 0..1_000u64 {
            tally.add([refusal(
                &format!("node-n{i}"),
                SkipReason::NotAuthorized,
                &format!("t{}", i % 100),
                i,
            )]);
        }
        for i in 0..100u64 {
            tally.add([refusal(
                "node-n0",
                SkipReason::NotAuthorized,
                &format!("x{i}"),
                i,
            )]);
        }
        let summaries = tally.take_ended(at(10));
        assert_eq!(summaries.len(), MAX_PUBLISHERS_PER_INTERVAL + 1);
        let others = summaries.iter().find(|s| s.publisher == OTHERS).unwrap();
        assert_eq!(others.refused, 1_000 - MAX_PUBLISHERS_PER_INTERVAL as u64);
        assert!(summaries
            .iter()
            .all(|s| s.by_event_type.len() <= MAX_EVENT_TYPES_PER_SUMMARY + 1));
        assert_eq!(summaries.iter().map(|s| s.refused).sum::<u64>(), 1_100);
    }

    #[test]
    fn only_what_claims_too_much_is_an_operators_business() {
        assert!(is_security_refusal(SkipReason::NotAuthorized));
        assert!(is_security_refusal(SkipReason::NotOwner));
        assert!(!is_security_refusal(SkipReason::Junk));
        assert!(!is_security_refusal(SkipReason::UnknownType));
    }
}
