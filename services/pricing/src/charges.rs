//! Charges: turns finished leases into `charge.accrued` events, priced by
//! `lh_domain::rating`.
//!
//! [`Fold`] is the in-memory state rebuilt from the log (price books, the
//! billing facts of each lease, which leases already have charges); it does
//! no I/O. [`Charges`] puts it on the decide loop (`lh_service::decider`),
//! which feeds it from sequence 1 and, once it has caught up with the head
//! of the log, publishes the charges of every lease that ended and
//! has none yet — all charges of one lease in one atomic batch whose first
//! message expects the lease's charge subject to be empty. A restarted or
//! second replica therefore never charges a lease twice: the log already
//! holds the charges (the fold saw them), or the server refuses the batch.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::{Bus, BusError, Expect, MAX_BATCH_MESSAGES};
use lh_domain::rating::{self, Segment};
use lh_events::{
    subject, Actor, ChargeAccrued, EndReason, Envelope, EventData, PriceBookPublished, Tier,
};
use lh_service::decider::{Batch, Decider, Pace};
use uuid::Uuid;

use crate::SERVICE;

/// Subjects the charges fold reads.
pub const FILTERS: &[&str] = &[
    subject::LEASES_ALL,
    subject::CHARGES_ALL,
    subject::PRICE_BOOKS_ALL,
];
/// A feed silent this long has delivered everything there is.
const QUIET: Duration = Duration::from_millis(300);
/// Wait before retrying a publish that failed for a reason other than a conflict.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the log says about one lease, as far as billing cares.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct LeaseFacts {
    tenant_id: Option<Uuid>,
    tier: Option<Tier>,
    gpus: Option<u32>,
    vram_gb_per_gpu: Option<u32>,
    /// The node-agent's `lease.started.started_at` of the current run.
    started_at: Option<DateTime<Utc>>,
    /// Earlier runs, closed when the lease was moved off a lost node:
    /// `(started_at, billing_ends_at)`.
    runs: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// The `lease.ended` envelope, once billable.
    ended: Option<Envelope>,
}

/// The charges of one lease, ready to publish.
#[derive(Debug, Clone)]
pub struct Bill {
    pub lease_id: Uuid,
    pub charges: Vec<ChargeAccrued>,
    /// The `lease.ended` event the charges are caused by.
    pub cause: Envelope,
}

/// What to do with a lease awaiting its charges.
#[derive(Debug)]
pub enum Plan {
    Publish(Box<Bill>),
    /// No price book is known yet: try again later.
    WaitForBook,
    /// Can never be billed (facts missing from the log): drop it.
    Unbillable(String),
}

/// Most charged leases the fold remembers (see `Fold::charged`).
pub const MAX_REMEMBERED_CHARGED_LEASES: usize = 100_000;

/// Rating state folded from the log.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Fold {
    /// Every price book version seen, sorted by version.
    books: Vec<PriceBookPublished>,
    leases: HashMap<Uuid, LeaseFacts>,
    /// Leases with at least one charge in the log (or just published),
    /// the newest [`MAX_REMEMBERED_CHARGED_LEASES`] of them: an event that
    /// comes for a lease after its charges is a late repeat, and a year of
    /// leases must not stay in memory.
    charged: HashSet<Uuid>,
    /// `charged` in the order its leases were charged, oldest first.
    charged_order: VecDeque<Uuid>,
    /// Ended, billable leases without charges, in id order.
    due: BTreeSet<Uuid>,
    /// Sequence of the last event folded.
    pub sequence: u64,
    /// Sequence of the last event on the price book subject folded.
    #[serde(default)]
    pub book_sequence: u64,
}

impl Fold {
    /// Folds one event of the log.
    pub fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        self.sequence = self.sequence.max(sequence);
        match &envelope.data {
            EventData::PriceBookPublished(book)
                if !self.books.iter().any(|b| b.version == book.version) =>
            {
                self.books.push(book.clone());
                self.books.sort_by_key(|b| b.version);
            }
            EventData::LeaseRequested(e) => {
                if let Some(l) = self.open(e.lease_id) {
                    l.tenant_id = Some(e.tenant_id);
                    l.tier = Some(e.tier);
                }
            }
            EventData::LeasePlaced(e) => {
                if let Some(l) = self.open(e.lease_id) {
                    l.gpus = Some(e.gpus.len() as u32);
                    // A fractional lease is billed by its share's VRAM.
                    let share = e.gpus.first().and_then(|g| g.vram_gb);
                    l.vram_gb_per_gpu = Some(share.unwrap_or(e.vram_gb_per_gpu));
                }
            }
            EventData::LeaseStarted(e) => {
                if let Some(l) = self.open(e.lease_id) {
                    l.started_at.get_or_insert(e.started_at);
                }
            }
            EventData::LeaseEnded(e) => self.ended(e, envelope),
            EventData::LeaseMigrated(e) => {
                if let Some(l) = self.open(e.lease_id) {
                    // The old run is billed until the old node was last
                    // heard from; the next starts when the new node says so.
                    if let Some(started) = l.started_at.take() {
                        l.runs.push((started, e.billing_ends_at.max(started)));
                    }
                    if let Some(to) = &e.to {
                        l.gpus = Some(to.gpus.len() as u32);
                        let share = to.gpus.first().and_then(|g| g.vram_gb);
                        l.vram_gb_per_gpu = Some(share.unwrap_or(to.vram_gb_per_gpu));
                    }
                }
            }
            EventData::LeaseSuspended(e) => {
                if let Some(l) = self.open(e.lease_id) {
                    // Suspended: the run ends when the workload stopped; a
                    // resumed lease opens the next at its new start.
                    if let Some(started) = l.started_at.take() {
                        l.runs.push((started, e.suspended_at.max(started)));
                    }
                }
            }
            // Rejected leases never run (one that has run is queued, not
            // rejected, by the scheduler): forget them.
            EventData::LeaseRejected(e) if !self.due.contains(&e.lease_id) => {
                self.leases.remove(&e.lease_id);
            }
            EventData::ChargeAccrued(c) => self.mark_charged(c.lease_id),
            _ => {}
        }
    }

    /// Whether the history a restatement carries must be folded: it is a
    /// price book's (versions fold once), or a lease's whose request this
    /// fold never read (its history expired before this reader started).
    /// Facts gathered from the events before such a restatement are
    /// dropped: the restatement carries them too.
    pub fn needs_history(&mut self, data: &EventData) -> bool {
        match data {
            EventData::PriceBookRestated(_) => true,
            EventData::LeaseRestated(r) => {
                if self.charged.contains(&r.lease_id) {
                    return false;
                }
                let known = self
                    .leases
                    .get(&r.lease_id)
                    .is_some_and(|f| f.tenant_id.is_some());
                if !known {
                    self.leases.remove(&r.lease_id);
                    self.due.remove(&r.lease_id);
                }
                !known
            }
            _ => false,
        }
    }

    /// The facts of a lease not yet charged or closed.
    fn open(&mut self, lease_id: Uuid) -> Option<&mut LeaseFacts> {
        if self.charged.contains(&lease_id) {
            return None;
        }
        let facts = self.leases.entry(lease_id).or_default();
        // After lease.ended nothing changes what it costs.
        if facts.ended.is_some() {
            return None;
        }
        Some(facts)
    }

    fn ended(&mut self, e: &lh_events::LeaseEnded, envelope: &Envelope) {
        let Some(facts) = self.open(e.lease_id) else {
            return;
        };
        let last_run = e.reason != EndReason::Cancelled
            && facts.started_at.is_some_and(|started| e.ended_at > started);
        if !last_run {
            facts.started_at = None;
        }
        if last_run || !facts.runs.is_empty() {
            facts.ended = Some(envelope.clone());
            self.due.insert(e.lease_id);
        } else {
            // Cancelled, never started, or ended before it started: nothing to bill.
            self.leases.remove(&e.lease_id);
        }
    }

    /// Records that `lease_id` has its charges; forgets its facts.
    pub fn mark_charged(&mut self, lease_id: Uuid) {
        if self.charged.insert(lease_id) {
            self.charged_order.push_back(lease_id);
            if self.charged_order.len() > MAX_REMEMBERED_CHARGED_LEASES {
                if let Some(oldest) = self.charged_order.pop_front() {
                    self.charged.remove(&oldest);
                }
            }
        }
        self.leases.remove(&lease_id);
        self.due.remove(&lease_id);
    }

    /// Drops a lease that can never be billed.
    pub fn drop_due(&mut self, lease_id: Uuid) {
        self.due.remove(&lease_id);
        self.leases.remove(&lease_id);
    }

    /// Ended leases still waiting for their charges.
    pub fn due(&self) -> Vec<Uuid> {
        self.due.iter().copied().collect()
    }

    pub fn is_charged(&self, lease_id: Uuid) -> bool {
        self.charged.contains(&lease_id)
    }

    /// The book a lease started at `started_at` is billed with: the newest
    /// version whose `effective_from` is not after the start, else the oldest.
    pub fn book_for(&self, started_at: DateTime<Utc>) -> Option<&PriceBookPublished> {
        self.books
            .iter()
            .rev()
            .find(|b| b.effective_from <= started_at)
            .or_else(|| self.books.first())
    }

    pub fn has_book(&self) -> bool {
        !self.books.is_empty()
    }

    /// What to do about a due lease.
    pub fn plan(&self, lease_id: Uuid) -> Plan {
        let Some(facts) = self.leases.get(&lease_id) else {
            return Plan::Unbillable("no facts about the lease".into());
        };
        let Some(cause) = &facts.ended else {
            return Plan::Unbillable("lease has not ended".into());
        };
        let EventData::LeaseEnded(ended) = &cause.data else {
            return Plan::Unbillable("cause is not lease.ended".into());
        };
        let mut runs = facts.runs.clone();
        runs.extend(facts.started_at.map(|s| (s, ended.ended_at)));
        if runs.is_empty() {
            return Plan::Unbillable("lease has not both started and ended".into());
        }
        let (Some(tenant_id), Some(tier)) = (facts.tenant_id, facts.tier) else {
            return Plan::Unbillable("no lease.requested in the log".into());
        };
        let (Some(gpus), Some(vram_gb_per_gpu)) = (facts.gpus, facts.vram_gb_per_gpu) else {
            return Plan::Unbillable("no lease.placed in the log".into());
        };
        let mut charges = Vec::new();
        for (index, (started_at, ended_at)) in runs.into_iter().enumerate() {
            let Some(book) = self.book_for(started_at) else {
                return Plan::WaitForBook;
            };
            let segment = Segment {
                lease_id,
                index: index as u32,
                tenant_id,
                tier,
                gpus,
                vram_gb_per_gpu,
                started_at,
                ended_at,
            };
            let run = rating::charges(book, &segment);
            if run.is_empty() && ended_at > started_at {
                return Plan::Unbillable(format!(
                    "price book v{} has no price for tier {}",
                    book.version,
                    tier.as_str()
                ));
            }
            charges.extend(run);
        }
        if charges.is_empty() {
            return Plan::Unbillable("no billable second".into());
        }
        Plan::Publish(Box::new(Bill {
            lease_id,
            charges,
            cause: cause.clone(),
        }))
    }
}

/// The id of the default price book (version 1).
pub fn default_book_id() -> Uuid {
    crate::books::book_id(rating::DEFAULT_BOOK_VERSION)
}

/// Publishes the default price book when the log holds none. Several
/// replicas may race: the subject must be empty, so only one wins.
pub async fn ensure_price_book(bus: &Bus, now: DateTime<Utc>) -> anyhow::Result<()> {
    if bus.subject_last_sequence(&subject::price_book()).await? > 0 {
        return Ok(());
    }
    let book = rating::default_price_book(now);
    let envelope = Envelope::new(
        Actor::Service(SERVICE.into()),
        now,
        EventData::PriceBookPublished(book),
    )
    .with_id(default_book_id());
    match bus.publish(&envelope, Expect::LastSubjectSequence(0)).await {
        Ok(appended) => {
            tracing::info!(
                sequence = appended.sequence,
                "published the default price book"
            );
            Ok(())
        }
        Err(BusError::Conflict(e)) => {
            tracing::info!(error = %e, "another replica published the price book first");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The charge events of a bill, in batches of at most [`MAX_BATCH_MESSAGES`].
pub fn envelopes(bill: &Bill, now: DateTime<Utc>) -> Vec<Envelope> {
    bill.charges
        .iter()
        .map(|c| {
            Envelope::new(
                Actor::Service(SERVICE.into()),
                now,
                EventData::ChargeAccrued(c.clone()),
            )
            .caused_by(&bill.cause)
            .with_id(c.charge_id)
        })
        .collect()
}

/// One lease's charges as decisions: one atomic batch whose first message
/// expects `lh.evt.charge.<lease_id>` to be empty. A lease longer than
/// [`MAX_BATCH_MESSAGES`] months (over five years) needs several batches;
/// each later one expects the charge subject to be empty too, and the decide
/// loop chains that to the sequence the batch before it got.
pub fn bill_batches(bill: &Bill, now: DateTime<Utc>) -> Vec<Batch> {
    envelopes(bill, now)
        .chunks(MAX_BATCH_MESSAGES)
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let expect = if i == 0 {
                        Expect::LastSubjectSequence(0)
                    } else {
                        Expect::Any
                    };
                    (e.clone(), expect)
                })
                .collect()
        })
        .collect()
}

/// The price books as the fold knows them, shared with the price book
/// RPC: every version, and the stream sequence of the last event on the
/// price book subject the fold has read (a publish is guarded by it).
#[derive(Debug, Clone, Default)]
pub struct Shelf {
    pub books: Vec<PriceBookPublished>,
    pub sequence: u64,
}

pub type SharedShelf = std::sync::Arc<std::sync::RwLock<Shelf>>;

/// Charging on the decide loop: folds the log and, once caught up, charges
/// every lease that ended and has no charges yet.
#[derive(Default)]
pub struct Charges {
    pub fold: Fold,
    warned_no_book: bool,
    /// How far a node's timestamps may be from the log server's clock.
    node_clock_skew: chrono::Duration,
    shelf: SharedShelf,
}

impl Charges {
    pub fn new(node_clock_skew: chrono::Duration) -> Self {
        Self {
            node_clock_skew,
            ..Self::default()
        }
    }

    /// The books this fold keeps up to date for others to read.
    pub fn shelf(&self) -> SharedShelf {
        self.shelf.clone()
    }

    fn apply_stored_event(&mut self, sequence: u64, stored_at: DateTime<Utc>, envelope: &Envelope) {
        if let Some(history) = envelope.data.restated_history() {
            if self.fold.needs_history(&envelope.data) {
                for e in history {
                    self.apply_stored(e.sequence, e.stored_at, &e.envelope);
                }
            }
            self.fold.sequence = self.fold.sequence.max(sequence);
            return;
        }
        let held = held_to_the_log(envelope, stored_at, self.node_clock_skew);
        self.fold.apply(sequence, &held);
    }

    fn update_shelf(&self) {
        let mut shelf = self.shelf.write().expect("shelf lock");
        if shelf.sequence != self.fold.book_sequence || shelf.books.len() != self.fold.books.len() {
            shelf.books = self.fold.books.clone();
            shelf.sequence = self.fold.book_sequence;
        }
    }
}

/// `envelope` with the times a node reports of a lease held to `stored_at`
/// (see [`lh_domain::rating::clamp_node_time`]); other events as they are.
pub fn held_to_the_log(
    envelope: &Envelope,
    stored_at: DateTime<Utc>,
    skew: chrono::Duration,
) -> std::borrow::Cow<'_, Envelope> {
    use lh_domain::rating::clamp_node_time as clamp;
    // The node's time in the event, and what it is held to.
    let (claimed, held_at) = match &envelope.data {
        EventData::LeaseStarted(e) => (e.started_at, clamp(e.started_at, stored_at, skew)),
        EventData::LeaseEnded(e) if e.node_id.is_some() => {
            (e.ended_at, clamp(e.ended_at, stored_at, skew))
        }
        EventData::LeaseSuspended(e) => (e.suspended_at, clamp(e.suspended_at, stored_at, skew)),
        // The scheduler works it out from a node's times (its last
        // heartbeat, a GPU's failure), held when they were heard; a
        // migration can still never end a run after it was stored.
        EventData::LeaseMigrated(e) => (e.billing_ends_at, e.billing_ends_at.min(stored_at)),
        _ => return std::borrow::Cow::Borrowed(envelope),
    };
    if claimed == held_at {
        return std::borrow::Cow::Borrowed(envelope);
    }
    tracing::warn!(event = envelope.data.event_type(), lease = ?envelope.data.lease_id(),
        %stored_at, "a node's timestamp is off the log's clock by more than the skew allowed; held to it");
    let mut held = envelope.clone();
    match &mut held.data {
        EventData::LeaseStarted(e) => e.started_at = held_at,
        EventData::LeaseEnded(e) => e.ended_at = held_at,
        EventData::LeaseSuspended(e) => e.suspended_at = held_at,
        EventData::LeaseMigrated(e) => e.billing_ends_at = held_at,
        _ => {}
    }
    std::borrow::Cow::Owned(held)
}

impl Decider for Charges {
    type Signal = std::convert::Infallible;

    fn name(&self) -> &'static str {
        SERVICE
    }

    fn filters(&self) -> &[&'static str] {
        FILTERS
    }

    fn pace(&self) -> Pace {
        Pace {
            quiet: QUIET,
            backoff_min: RETRY_AFTER,
            ..Pace::default()
        }
    }

    fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        self.fold.apply(sequence, envelope);
    }

    fn apply_stored(&mut self, sequence: u64, stored_at: DateTime<Utc>, envelope: &Envelope) {
        if matches!(
            envelope.data,
            EventData::PriceBookPublished(_) | EventData::PriceBookRestated(_)
        ) {
            self.fold.book_sequence = self.fold.book_sequence.max(sequence);
        }
        self.apply_stored_event(sequence, stored_at, envelope);
        self.update_shelf();
    }

    fn snapshot(&self) -> Option<serde_json::Value> {
        serde_json::to_value(&self.fold).ok()
    }

    fn restore(&mut self, state: serde_json::Value) -> bool {
        match serde_json::from_value(state) {
            Ok(fold) => {
                self.fold = fold;
                self.update_shelf();
                true
            }
            Err(_) => false,
        }
    }

    fn decide(&mut self, now: DateTime<Utc>) -> Vec<Batch> {
        let mut decisions = Vec::new();
        for lease_id in self.fold.due() {
            match self.fold.plan(lease_id) {
                // Nothing billable (no second was run): nothing to write.
                Plan::Publish(bill) if bill.charges.is_empty() => self.fold.mark_charged(lease_id),
                Plan::Publish(bill) => decisions.extend(bill_batches(&bill, now)),
                Plan::WaitForBook => {
                    if !self.warned_no_book {
                        tracing::warn!(%lease_id, "no price book in the log yet; charges wait");
                        self.warned_no_book = true;
                    }
                }
                Plan::Unbillable(why) => {
                    tracing::error!(%lease_id, %why, "lease cannot be billed");
                    self.fold.drop_due(lease_id);
                }
            }
        }
        decisions
    }

    fn appended(&mut self, batch: &Batch) {
        metrics::counter!("lh_charges_published_total").increment(batch.len() as u64);
        if let Some((
            Envelope {
                data: EventData::ChargeAccrued(c),
                ..
            },
            _,
        )) = batch.first()
        {
            tracing::info!(lease_id = %c.lease_id, charges = batch.len(), "lease charged");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use lh_events::*;

    fn env(data: EventData) -> Envelope {
        Envelope::new(Actor::Admin, Utc::now(), data)
    }

    fn t(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 2, h, m, s).unwrap()
    }

    fn lease_events(
        lease_id: Uuid,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        reason: EndReason,
    ) -> Vec<Envelope> {
        let tenant = Uuid::from_u128(7);
        vec![
            env(EventData::LeaseRequested(fixtures::whole_request(
                lease_id,
                tenant,
                2,
                fixtures::MODEL,
            ))),
            env(EventData::LeasePlaced(fixtures::placed(
                lease_id,
                "n1",
                "z",
                fixtures::MODEL,
                40,
                &[0, 1],
            ))),
            env(EventData::LeaseStarted(fixtures::started(
                lease_id, "n1", start,
            ))),
            env(EventData::LeaseEnded(fixtures::ended(
                lease_id, "n1", end, reason,
            ))),
        ]
    }

    fn fold(events: &[Envelope]) -> Fold {
        let mut f = Fold::default();
        for (i, e) in events.iter().enumerate() {
            f.apply(i as u64 + 1, e);
        }
        f
    }

    fn book(version: u32, from: DateTime<Utc>, price: &str) -> Envelope {
        let mut b = rating::default_price_book(from);
        b.version = version;
        b.tiers[0].price_cny_per_gb_hour = price.parse().unwrap();
        env(EventData::PriceBookPublished(b))
    }

    #[test]
    fn an_ended_lease_is_due_until_its_charge_is_seen() {
        let lease = Uuid::from_u128(1);
        let mut events = vec![book(1, t(0, 0, 0), "0.5")];
        events.extend(lease_events(
            lease,
            t(10, 0, 0),
            t(10, 1, 30),
            EndReason::Stopped,
        ));
        let mut f = fold(&events);
        assert_eq!(f.due(), vec![lease]);
        let Plan::Publish(bill) = f.plan(lease) else {
            panic!("expected a bill")
        };
        assert_eq!(bill.charges.len(), 1);
        assert_eq!(bill.charges[0].amount.to_string(), "1.00");
        assert_eq!(bill.charges[0].billed_seconds, 90);
        let charge = envelopes(&bill, Utc::now()).remove(0);
        assert_eq!(charge.id, bill.charges[0].charge_id);
        assert_eq!(charge.causation_id, Some(bill.cause.id));
        assert_eq!(charge.actor, Actor::Service("lh-pricing".into()));
        f.apply(99, &charge);
        assert!(f.due().is_empty());
        assert!(f.is_charged(lease));
    }

    #[test]
    fn a_node_clock_far_off_moves_the_bill_by_the_skew_at_most() {
        let lease = Uuid::from_u128(1);
        let mut charges = Charges::new(chrono::Duration::seconds(30));
        charges.apply_stored(1, t(0, 0, 0), &book(1, t(0, 0, 0), "0.5"));
        // The node says it started an hour before the log stored its
        // report, and ended ten minutes after the log stored that.
        let events = lease_events(lease, t(9, 0, 0), t(10, 11, 30), EndReason::Stopped);
        let stored = [t(10, 0, 0), t(10, 0, 0), t(10, 0, 0), t(10, 1, 30)];
        for (i, (e, at)) in events.iter().zip(stored).enumerate() {
            charges.apply_stored(2 + i as u64, at, e);
        }
        let Plan::Publish(bill) = charges.fold.plan(lease) else {
            panic!("expected a bill")
        };
        // From 09:59:30 (30 s of skew allowed) to 10:01:30 (when stored).
        assert_eq!(bill.charges[0].billed_seconds, 120);
    }

    /// The default book and a lease that ran 90 s; its `lease.ended` apart.
    fn book_and_lease_until_its_end(lease: Uuid) -> (Vec<Envelope>, Envelope) {
        let mut events = vec![book(1, t(0, 0, 0), "0.5")];
        events.extend(lease_events(
            lease,
            t(10, 0, 0),
            t(10, 1, 30),
            EndReason::Stopped,
        ));
        let ended = events.pop().unwrap();
        (events, ended)
    }

    #[test]
    fn a_lease_and_book_known_only_from_restatements_are_billed_the_same() {
        let lease = Uuid::from_u128(1);
        let (events, ended) = book_and_lease_until_its_end(lease);
        let stated = |events: &[Envelope], first: u64| -> Vec<StatedEvent> {
            events
                .iter()
                .enumerate()
                .map(|(i, e)| StatedEvent {
                    sequence: first + i as u64,
                    stored_at: t(10, 0, 0),
                    envelope: Box::new(e.clone()),
                })
                .collect()
        };
        let book_restated = lh_domain::restate::restatement(&stated(&events[..1], 1)).unwrap();
        let lease_restated = lh_domain::restate::restatement(&stated(&events[1..], 2)).unwrap();
        let whole = {
            let mut all = events.clone();
            all.push(ended.clone());
            fold(&all)
        };
        // Started after the history expired; an event of the lease before
        // its restatement is read and then stood in for by it.
        let mut charges = Charges::new(chrono::Duration::seconds(30));
        charges.apply_stored(40, t(10, 0, 0), &events[3]);
        charges.apply_stored(50, t(10, 0, 0), &env(book_restated));
        charges.apply_stored(51, t(10, 0, 0), &env(lease_restated.clone()));
        charges.apply_stored(52, t(10, 1, 30), &ended);
        let (Plan::Publish(fresh), Plan::Publish(known)) =
            (charges.fold.plan(lease), whole.plan(lease))
        else {
            panic!("both bill the lease")
        };
        assert_eq!(fresh.charges, known.charges);
        assert_eq!(fresh.charges[0].billed_seconds, 90);
        // To a fold that knows the lease, its restatement changes nothing.
        let mut again = Charges::new(chrono::Duration::seconds(30));
        for (i, e) in events.iter().enumerate() {
            again.apply_stored(1 + i as u64, t(10, 0, 0), e);
        }
        again.apply_stored(51, t(10, 0, 0), &env(lease_restated));
        again.apply_stored(52, t(10, 1, 30), &ended);
        let Plan::Publish(bill) = again.fold.plan(lease) else {
            panic!("billed")
        };
        assert_eq!(bill.charges, known.charges);
    }

    #[test]
    fn a_snapshot_taken_back_bills_the_same() {
        let lease = Uuid::from_u128(1);
        let (events, ended) = book_and_lease_until_its_end(lease);
        let mut before = Charges::new(chrono::Duration::seconds(30));
        for (i, e) in events.iter().enumerate() {
            before.apply_stored(1 + i as u64, t(10, 0, 0), e);
        }
        let mut after = Charges::new(chrono::Duration::seconds(30));
        let bytes = serde_json::to_vec(&before.snapshot().unwrap()).unwrap();
        assert!(after.restore(serde_json::from_slice(&bytes).unwrap()));
        for c in [&mut before, &mut after] {
            c.apply_stored(9, t(10, 1, 30), &ended);
        }
        let (Plan::Publish(a), Plan::Publish(b)) =
            (before.fold.plan(lease), after.fold.plan(lease))
        else {
            panic!("both bill")
        };
        assert_eq!(a.charges, b.charges);
        assert!(!after.restore(serde_json::json!({"books": 3})));
    }

    #[test]
    fn the_fold_remembers_a_bounded_number_of_charged_leases() {
        let mut f = Fold::default();
        let first = Uuid::from_u128(1);
        for n in 1..=(MAX_REMEMBERED_CHARGED_LEASES as u128 + 1) {
            f.mark_charged(Uuid::from_u128(n));
            // A lease charged once per run is remembered once.
            f.mark_charged(Uuid::from_u128(n));
        }
        assert_eq!(f.charged.len(), MAX_REMEMBERED_CHARGED_LEASES);
        assert_eq!(f.charged_order.len(), MAX_REMEMBERED_CHARGED_LEASES);
        assert!(!f.is_charged(first), "the oldest is forgotten");
        assert!(f.is_charged(Uuid::from_u128(2)));
    }

    #[test]
    fn a_migrated_lease_is_billed_per_run_without_overlap() {
        let lease = Uuid::from_u128(1);
        let mut events = vec![book(1, t(0, 0, 0), "0.5")];
        let mut run = lease_events(lease, t(10, 0, 0), t(10, 5, 0), EndReason::Stopped);
        let ended = run.pop().unwrap();
        events.extend(run);
        // The node was last heard at 10:01:30; the lease ran again from
        // 10:01:34 on another node until 10:05:00.
        events.push(env(EventData::LeaseMigrated(LeaseMigrated {
            lease_id: lease,
            reason: "node n1 lost".into(),
            from_node_id: "n1".into(),
            from_gpu_indices: vec![0, 1],
            billing_ends_at: t(10, 1, 30),
            to: None,
        })));
        events.push(env(EventData::LeaseStarted(LeaseStarted {
            lease_id: lease,
            node_id: "n2".into(),
            started_at: t(10, 1, 34),
        })));
        events.push(ended);
        let f = fold(&events);
        let Plan::Publish(bill) = f.plan(lease) else {
            panic!("expected a bill")
        };
        let runs: Vec<_> = bill
            .charges
            .iter()
            .map(|c| (c.from, c.to, c.billed_seconds))
            .collect();
        assert_eq!(
            runs,
            vec![
                (t(10, 0, 0), t(10, 1, 30), 90),
                (t(10, 1, 34), t(10, 5, 0), 206)
            ]
        );
        assert_ne!(bill.charges[0].charge_id, bill.charges[1].charge_id);
        // 80 GB x 0.5 CNY/GB-h: 90 s -> 1.00, 206 s -> 2.29 (2.2888...).
        assert_eq!(bill.charges[0].amount.to_string(), "1.00");
        assert_eq!(bill.charges[1].amount.to_string(), "2.29");

        // Moved and then cancelled while waiting: the first run is still billed.
        let mut events = vec![book(1, t(0, 0, 0), "0.5")];
        let mut run = lease_events(lease, t(10, 0, 0), t(10, 5, 0), EndReason::Cancelled);
        let ended = run.pop().unwrap();
        events.extend(run);
        events.push(env(EventData::LeaseMigrated(LeaseMigrated {
            lease_id: lease,
            reason: "node n1 lost".into(),
            from_node_id: "n1".into(),
            from_gpu_indices: vec![0, 1],
            billing_ends_at: t(10, 1, 30),
            to: None,
        })));
        events.push(ended);
        let Plan::Publish(bill) = fold(&events).plan(lease) else {
            panic!("expected a bill")
        };
        assert_eq!(bill.charges.len(), 1);
        assert_eq!(bill.charges[0].billed_seconds, 90);
    }

    #[test]
    fn a_fraction_is_billed_by_its_vram() {
        let lease = Uuid::from_u128(1);
        let mut events = vec![book(1, t(0, 0, 0), "0.5")];
        let mut lifecycle = lease_events(lease, t(10, 0, 0), t(10, 1, 30), EndReason::Stopped);
        if let EventData::LeasePlaced(p) = &mut lifecycle[1].data {
            p.vram_gb_per_gpu = 10;
            p.gpus.truncate(1);
            p.gpus[0].milli = Some(300);
            p.gpus[0].vram_gb = Some(10);
        }
        events.extend(lifecycle);
        let Plan::Publish(bill) = fold(&events).plan(lease) else {
            panic!("expected a bill")
        };
        assert_eq!(bill.charges[0].vram_gb, 10);
        assert_eq!(bill.charges[0].gpus, 1);
        // 10 GB x 0.5 CNY/GB-h x 90 s = 0.125, rounded half away from zero.
        assert_eq!(bill.charges[0].amount.to_string(), "0.13");
    }

    #[test]
    fn a_replayed_log_with_charges_has_nothing_due() {
        let lease = Uuid::from_u128(1);
        let mut events = vec![book(1, t(0, 0, 0), "0.5")];
        events.extend(lease_events(
            lease,
            t(10, 0, 0),
            t(10, 1, 30),
            EndReason::Completed,
        ));
        let Plan::Publish(bill) = fold(&events).plan(lease) else {
            panic!()
        };
        events.extend(envelopes(&bill, Utc::now()));
        assert!(fold(&events).due().is_empty());
    }

    #[test]
    fn cancelled_never_started_or_backwards_leases_are_not_billed() {
        let a = Uuid::from_u128(1);
        let b = Uuid::from_u128(2);
        let c = Uuid::from_u128(3);
        let mut events = vec![book(1, t(0, 0, 0), "0.5")];
        events.extend(lease_events(
            a,
            t(10, 0, 0),
            t(10, 1, 0),
            EndReason::Cancelled,
        ));
        events.extend(lease_events(
            c,
            t(10, 0, 0),
            t(10, 0, 0),
            EndReason::Stopped,
        ));
        let mut never = lease_events(b, t(10, 0, 0), t(10, 1, 0), EndReason::Stopped);
        never.remove(2); // no lease.started
        events.extend(never);
        assert!(fold(&events).due().is_empty());
    }

    #[test]
    fn the_book_is_the_newest_in_force_at_start_else_the_oldest() {
        let f = fold(&[
            book(2, t(12, 0, 0), "0.7"),
            book(1, t(8, 0, 0), "0.5"),
            book(3, t(20, 0, 0), "0.9"),
        ]);
        assert_eq!(f.book_for(t(7, 0, 0)).unwrap().version, 1);
        assert_eq!(f.book_for(t(9, 0, 0)).unwrap().version, 1);
        assert_eq!(f.book_for(t(12, 0, 0)).unwrap().version, 2);
        assert_eq!(f.book_for(t(23, 0, 0)).unwrap().version, 3);
    }

    #[test]
    fn no_book_means_wait() {
        let lease = Uuid::from_u128(1);
        let f = fold(&lease_events(
            lease,
            t(10, 0, 0),
            t(10, 1, 30),
            EndReason::Stopped,
        ));
        assert!(matches!(f.plan(lease), Plan::WaitForBook));
    }

    #[test]
    fn billing_uses_the_node_agents_timestamps_not_event_times() {
        let lease = Uuid::from_u128(1);
        let mut events = vec![book(1, t(0, 0, 0), "0.5")];
        // Envelopes all occur "now"; the started/ended timestamps say 1 h.
        events.extend(lease_events(
            lease,
            t(10, 0, 0),
            t(11, 0, 0),
            EndReason::Failed,
        ));
        let Plan::Publish(bill) = fold(&events).plan(lease) else {
            panic!()
        };
        assert_eq!(bill.charges[0].billed_seconds, 3600);
        assert_eq!(bill.charges[0].amount.to_string(), "40.00");
    }
}
