//! Restating long-lived aggregates before the log's age limit takes their
//! first events (docs/adr/011-a-year-of-history.md).
//!
//! Each owner runs a [`Restater`] for its families through the one decide
//! loop: the fold remembers, per live aggregate, when it was last stated in
//! full and its subject's newest sequence; once a statement is older than
//! the restatement age, a reader task fetches the subject's events since
//! that statement, and the decider appends the restatement guarded by the
//! subject's newest sequence, so an event that raced it turns the write
//! into a conflict and a new reading, never into a restatement that hides
//! the event.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::{Bus, Expect, Stored};
use lh_events::{derived_id, subject, Actor, Envelope, EventData, StatedEvent};
use lh_telemetry::Readiness;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::decider::{self, Batch, Decider, Pace};

/// Most restatements asked for (subjects being read or waiting to be
/// appended) at once.
pub const MAX_RESTATEMENTS_IN_FLIGHT: usize = 64;
/// Most messages read from one subject for a restatement: the events since
/// its previous statement.
pub const MAX_SUBJECT_HISTORY_MESSAGES: usize = 100_000;
/// A subject asked for and not answered within this is asked for again.
const ASK_AGAIN_AFTER_SECS: i64 = 60;
/// Longest wait between looks for due restatements.
const MAX_SCAN_INTERVAL: Duration = Duration::from_secs(60);

/// The aggregate families that are restated, each by one owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Leases that have not ended (the scheduler).
    Lease,
    /// Nodes (the scheduler).
    Node,
    /// Tenants (the gateway).
    Tenant,
    /// The price books (pricing).
    PriceBook,
}

impl Family {
    fn filter(self) -> &'static str {
        match self {
            Family::Lease => subject::LEASES_ALL,
            Family::Node => subject::NODES_ALL,
            Family::Tenant => subject::TENANTS_ALL,
            Family::PriceBook => subject::PRICE_BOOKS_ALL,
        }
    }

    fn of(data: &EventData) -> Option<Family> {
        let event_type = data.event_type();
        let family = event_type.split('.').next()?;
        match family {
            "lease" => Some(Family::Lease),
            "node" => Some(Family::Node),
            "tenant" => Some(Family::Tenant),
            "price_book" => Some(Family::PriceBook),
            _ => None,
        }
    }
}

/// A live aggregate, as far as restating it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Statement {
    /// When its newest full statement was stored (the server's clock).
    stated_at: DateTime<Utc>,
    /// The sequence of that statement: its history is read from there.
    stated_sequence: u64,
    /// The newest sequence on its subject.
    last_sequence: u64,
}

/// A subject's events, read for its restatement.
#[derive(Debug)]
pub struct History {
    subject: String,
    events: Vec<Stored>,
}

/// The decider that restates one owner's families.
pub struct Restater {
    name: &'static str,
    families: Vec<Family>,
    filters: Vec<&'static str>,
    after: chrono::Duration,
    statements: HashMap<String, Statement>,
    /// Subjects whose history was asked for, and when.
    asked: HashMap<String, DateTime<Utc>>,
    histories: HashMap<String, Vec<Stored>>,
    /// Where requests for a subject's history (from a sequence) go.
    requests: tokio::sync::mpsc::Sender<(String, u64)>,
    next_scan: Option<DateTime<Utc>>,
}

impl Restater {
    /// A restater for `families` that restates an aggregate once its newest
    /// full statement is older than `after`; requests for histories go to
    /// `requests` (see [`read_histories`]).
    pub fn new(
        name: &'static str,
        families: &[Family],
        after: Duration,
        requests: tokio::sync::mpsc::Sender<(String, u64)>,
    ) -> Self {
        Self {
            name,
            families: families.to_vec(),
            filters: families.iter().map(|f| f.filter()).collect(),
            after: chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX),
            statements: HashMap::new(),
            asked: HashMap::new(),
            histories: HashMap::new(),
            requests,
            next_scan: None,
        }
    }

    /// Live aggregates it keeps track of.
    pub fn tracked(&self) -> usize {
        self.statements.len()
    }

    fn forget(&mut self, subject: &str) {
        self.statements.remove(subject);
        self.asked.remove(subject);
        self.histories.remove(subject);
    }

    fn scan_interval(&self) -> chrono::Duration {
        let tenth = self.after.to_std().unwrap_or(MAX_SCAN_INTERVAL) / 10;
        chrono::Duration::from_std(tenth.clamp(Duration::from_secs(1), MAX_SCAN_INTERVAL))
            .unwrap_or(chrono::Duration::seconds(60))
    }

    fn restatement(&mut self, subject: &str, now: DateTime<Utc>) -> Option<Batch> {
        let events = self.histories.remove(subject)?;
        self.asked.remove(subject);
        let statement = *self.statements.get(subject)?;
        let last = events.last()?.sequence;
        if last != statement.last_sequence {
            // Something was appended since it was read: read it again.
            return None;
        }
        let history: Vec<StatedEvent> = events
            .into_iter()
            .map(|e| StatedEvent {
                sequence: e.sequence,
                stored_at: e.stored_at,
                envelope: Box::new(e.envelope),
            })
            .collect();
        match lh_domain::restate::restatement(&history) {
            Ok(data) => {
                let envelope = Envelope::new(Actor::Service(self.name.into()), now, data)
                    .with_id(derived_id(&["restated", subject, &last.to_string()]));
                Some(vec![(envelope, Expect::LastSubjectSequence(last))])
            }
            Err(why) => {
                tracing::error!(service = self.name, subject, error = %why,
                    "cannot restate; its history will expire");
                metrics::counter!("lh_restatements_failed_total", "service" => self.name)
                    .increment(1);
                // Not asked again until a full statement comes.
                self.forget(subject);
                None
            }
        }
    }
}

impl Decider for Restater {
    type Signal = History;

    fn name(&self) -> &'static str {
        "restater"
    }

    fn filters(&self) -> &[&'static str] {
        &self.filters
    }

    fn pace(&self) -> Pace {
        Pace {
            quiet: Duration::from_millis(300),
            ..Pace::default()
        }
    }

    fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        self.apply_stored(sequence, envelope.occurred_at, envelope);
    }

    /// What it restates is read from the log as stored; it reads no
    /// node's times.
    fn node_clock_skew(&self) -> Option<chrono::Duration> {
        None
    }

    fn apply_stored(&mut self, sequence: u64, stored_at: DateTime<Utc>, envelope: &Envelope) {
        let data = &envelope.data;
        if !Family::of(data).is_some_and(|f| self.families.contains(&f)) {
            return;
        }
        let subject = data.aggregate_subject();
        if matches!(data, EventData::LeaseEnded(_) | EventData::LeaseRejected(_)) {
            self.forget(&subject);
            return;
        }
        let restated = data.restated_history().is_some();
        match self.statements.get_mut(&subject) {
            Some(s) if sequence <= s.last_sequence => {}
            Some(s) => {
                s.last_sequence = sequence;
                if restated {
                    s.stated_at = stored_at;
                    s.stated_sequence = sequence;
                }
            }
            // A subject first seen through an event that does not state it
            // from the start began before the log's first sequence: only a
            // restatement of it can tell it.
            None if data.is_full_statement() => {
                self.statements.insert(
                    subject,
                    Statement {
                        stated_at: stored_at,
                        stated_sequence: sequence,
                        last_sequence: sequence,
                    },
                );
            }
            None => {}
        }
    }

    fn snapshot(&self) -> Option<Box<serde_json::value::RawValue>> {
        crate::decider::snapshot_of(&self.statements)
    }

    fn restore(&mut self, state: &serde_json::value::RawValue) -> bool {
        match crate::decider::restored(state) {
            Some(statements) => {
                self.statements = statements;
                true
            }
            None => false,
        }
    }

    fn snapshot_key(&self) -> String {
        format!("{}-restater", self.name)
    }

    fn signal(&mut self, history: History, _now: DateTime<Utc>) -> bool {
        self.histories.insert(history.subject, history.events);
        true
    }

    fn decide(&mut self, now: DateTime<Utc>) -> Vec<Batch> {
        let read: Vec<String> = self.histories.keys().cloned().collect();
        let mut batches: Vec<Batch> = read
            .iter()
            .filter_map(|subject| self.restatement(subject, now))
            .collect();
        if self.next_scan.is_some_and(|at| now < at) {
            return batches;
        }
        self.next_scan = Some(now + self.scan_interval());
        let ask_again = chrono::Duration::seconds(ASK_AGAIN_AFTER_SECS);
        self.asked.retain(|_, at| now - *at < ask_again);
        let mut due: Vec<(&String, &Statement)> = self
            .statements
            .iter()
            .filter(|(subject, s)| {
                s.stated_at + self.after <= now && !self.asked.contains_key(*subject)
            })
            .collect();
        due.sort_by_key(|(_, s)| s.stated_at);
        let room = MAX_RESTATEMENTS_IN_FLIGHT.saturating_sub(self.asked.len());
        let mut asked = Vec::new();
        for (subject, s) in due.into_iter().take(room) {
            if self
                .requests
                .try_send((subject.clone(), s.stated_sequence))
                .is_err()
            {
                break;
            }
            asked.push(subject.clone());
        }
        for subject in asked {
            self.asked.insert(subject, now);
        }
        batches.retain(|b| !b.is_empty());
        batches
    }

    fn appended(&mut self, batch: &Batch) {
        for (envelope, _) in batch {
            metrics::counter!("lh_restatements_total", "service" => self.name).increment(1);
            tracing::info!(service = self.name, subject = %envelope.data.aggregate_subject(),
                event_type = envelope.event_type, "restated");
        }
    }
}

/// Answers a [`Restater`]'s requests: reads each subject's history from the
/// sequence asked and hands it back as a signal.
pub async fn read_histories(
    bus: Bus,
    mut requests: tokio::sync::mpsc::Receiver<(String, u64)>,
    histories: tokio::sync::mpsc::Sender<History>,
) {
    while let Some((subject, from)) = requests.recv().await {
        match bus
            .subject_history(&subject, from, MAX_SUBJECT_HISTORY_MESSAGES)
            .await
        {
            Ok(events) if !events.is_empty() => {
                if histories.send(History { subject, events }).await.is_err() {
                    return;
                }
            }
            Ok(_) => {}
            // Asked again later (see ASK_AGAIN_AFTER_SECS).
            Err(e) => tracing::warn!(subject, error = %e, "cannot read a subject to restate it"),
        }
    }
}

/// Starts restating `families` for the service `name` (the actor of its
/// restatements) at the age `common` configures, until `shutdown`.
pub fn spawn(
    bus: &Bus,
    common: &crate::CommonArgs,
    name: &'static str,
    families: &'static [Family],
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let after = common.restate_after()?;
    Ok(tokio::spawn(run(
        bus.clone(),
        name,
        families,
        after,
        crate::clock::SystemClock::shared(),
        shutdown,
    )))
}

/// Restates `families` for the service `name` until `shutdown`, starting
/// over after a failure.
pub async fn run(
    bus: Bus,
    name: &'static str,
    families: &'static [Family],
    after: Duration,
    clock: SharedClock,
    shutdown: CancellationToken,
) {
    let mut wait = Duration::from_millis(200);
    while !shutdown.is_cancelled() {
        let (ask, asked) = tokio::sync::mpsc::channel(MAX_RESTATEMENTS_IN_FLIGHT);
        let (answer, mut answers) = tokio::sync::mpsc::channel(MAX_RESTATEMENTS_IN_FLIGHT);
        let reader = tokio::spawn(read_histories(bus.clone(), asked, answer));
        let mut restater = Restater::new(name, families, after, ask);
        let signals = futures::stream::poll_fn(move |cx| answers.poll_recv(cx));
        let result = decider::run_with_signals(
            &bus,
            &mut restater,
            clock.as_ref(),
            shutdown.clone(),
            Readiness::default(),
            signals,
        )
        .await;
        reader.abort();
        match result {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(service = name, error = %e, retry_in_ms = wait.as_millis() as u64,
                    "the restater stopped; starting it again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use lh_events::fixtures;
    use uuid::Uuid;

    fn at(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
    }

    fn env(data: EventData) -> Envelope {
        Envelope::new(Actor::Admin, at(0), data)
    }

    #[test]
    fn a_statement_older_than_the_age_is_read_and_restated_with_its_guard() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let mut r = Restater::new("t", &[Family::Lease], Duration::from_secs(30), tx);
        let lease = Uuid::from_u128(7);
        let request = env(EventData::LeaseRequested(fixtures::whole_request(
            lease,
            Uuid::from_u128(8),
            1,
            fixtures::MODEL,
        )));
        r.apply_stored(5, at(0), &request);
        assert!(r.decide(at(29)).is_empty());
        assert!(rx.try_recv().is_err(), "not due yet");
        r.next_scan = None;
        assert!(r.decide(at(31)).is_empty());
        assert_eq!(rx.try_recv().unwrap(), (subject::lease(lease), 5));
        let stored = Stored {
            sequence: 5,
            subject: subject::lease(lease),
            envelope: request.clone(),
            payload: Default::default(),
            pending: 0,
            stored_at: at(0),
            trace_parent: None,
        };
        r.signal(
            History {
                subject: subject::lease(lease),
                events: vec![stored.clone()],
            },
            at(31),
        );
        let batches = r.decide(at(31));
        assert_eq!(batches.len(), 1);
        let (restated, expect) = &batches[0][0];
        assert_eq!(*expect, Expect::LastSubjectSequence(5));
        assert_eq!(restated.event_type, "lease.restated");
        // Stored: the next is due an age later.
        r.apply_stored(9, at(31), restated);
        r.next_scan = None;
        assert!(r.decide(at(40)).is_empty());
        assert!(rx.try_recv().is_err());

        // A history read before a newer event is not restated.
        r.next_scan = None;
        let stop = env(EventData::LeaseStopRequested(
            lh_events::LeaseStopRequested { lease_id: lease },
        ));
        r.apply_stored(12, at(45), &stop);
        r.decide(at(62));
        assert_eq!(rx.try_recv().unwrap(), (subject::lease(lease), 9));
        r.signal(
            History {
                subject: subject::lease(lease),
                events: vec![stored],
            },
            at(62),
        );
        assert!(r.decide(at(62)).is_empty(), "stale history");
    }

    #[test]
    fn ended_leases_and_subjects_begun_before_the_log_are_not_restated() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let mut r = Restater::new("t", &[Family::Lease], Duration::from_secs(30), tx);
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        r.apply_stored(
            1,
            at(0),
            &env(EventData::LeaseRequested(fixtures::whole_request(
                a,
                Uuid::nil(),
                1,
                fixtures::MODEL,
            ))),
        );
        r.apply_stored(
            2,
            at(0),
            &env(EventData::LeaseEnded(fixtures::ended(
                a,
                "n",
                at(0),
                lh_events::EndReason::Stopped,
            ))),
        );
        r.apply_stored(
            3,
            at(0),
            &env(EventData::LeaseStopRequested(
                lh_events::LeaseStopRequested { lease_id: b },
            )),
        );
        assert_eq!(r.tracked(), 0);
        r.decide(at(100));
        assert!(rx.try_recv().is_err());
    }
}
