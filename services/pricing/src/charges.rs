//! Charges: turns running and finished leases into `charge.accrued`
//! events, priced by `lh_domain::rating`.
//!
//! [`Fold`] is the in-memory state rebuilt from the log (price books, spot
//! prices, the billing facts of each open lease and how far each is
//! charged); it does no I/O. [`Charges`] puts it on the decide loop
//! (`lh_service::decider`), which feeds it from sequence 1 (or a snapshot)
//! and, once it has caught up with the head of the log, publishes:
//!
//! * for a running lease, one charge per UTC hour once that hour is over
//!   and a grace after it ([`DEFAULT_ACCRUAL_GRACE_SECS`]) has passed, so
//!   that a late report of its end is in, and
//! * for an ended lease, the charges of the hours not yet charged, up to
//!   the end of its billable time.
//!
//! A charge's id is derived from (lease, hour); its amount is
//! `round(C(to)) - round(C(from))` ([`lh_domain::rating`]), continuing from
//! the cumulative cost the lease's previous charge carries. All charges a
//! pass writes for a lease go in one atomic batch whose first message
//! expects the sequence of the lease's last charge on
//! `lh.evt.charge.<lease_id>` (0 for the first), so a restarted or second
//! replica never charges an hour twice: the log already holds the charge
//! (the fold saw it), or the server refuses the batch.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::{Bus, BusError, Expect, MAX_BATCH_MESSAGES};
use lh_domain::rating::{self, Accrued, Interval, PricePoint};
use lh_events::{
    subject, Actor, ChargeAccrued, ChargeModel, EndReason, Envelope, EventData, PriceBookPublished,
    ReservationCommitted, Tier,
};
use lh_service::decider::{Batch, Decider, Pace};
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::SERVICE;

/// Subjects the charges fold reads.
pub const FILTERS: &[&str] = &[
    subject::LEASES_ALL,
    subject::CHARGES_ALL,
    subject::PRICE_BOOKS_ALL,
    subject::SPOT_ALL,
    subject::RESERVATIONS_ALL,
    subject::BALANCES_ALL,
    subject::CREDITS_ALL,
    subject::QUOTES_ALL,
];
/// A feed silent this long has delivered everything there is.
const QUIET: Duration = Duration::from_millis(300);
/// Wait before retrying a publish that failed for a reason other than a conflict.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long after an hour ends its charges are written, by default: a
/// node's report of an end is held to within the node clock skew (30 s) of
/// when the log stored it, and a lost node is declared within seconds, so
/// by then the log says whether the lease ran the whole hour.
pub const DEFAULT_ACCRUAL_GRACE_SECS: i64 = 300;
/// Longest accrual grace accepted: a day.
pub const MAX_ACCRUAL_GRACE_SECS: i64 = 24 * 3600;
/// Most spot price points kept per (zone, GPU model) before the ones no
/// open lease needs are dropped.
const PRUNE_MARKET_AT_POINTS: usize = 1024;
/// How long after it expires a quote is remembered: far longer than a
/// request made with it takes to reach the log.
pub const QUOTE_KEPT_AFTER_EXPIRY: chrono::Duration = chrono::Duration::days(1);
/// Places of a charge's (informational) average unit price.
const UNIT_PRICE_SCALE: u32 = 6;

/// What the log says about one open lease, as far as billing cares.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct LeaseFacts {
    tenant_id: Option<Uuid>,
    tier: Option<Tier>,
    gpu_model: Option<String>,
    zone: Option<String>,
    gpus: Option<u32>,
    vram_gb_per_gpu: Option<u32>,
    /// The book the lease is billed on, chosen at its first start.
    book_version: Option<u32>,
    /// The node-agent's `lease.started.started_at` of the current run.
    started_at: Option<DateTime<Utc>>,
    /// Closed runs with time not yet charged: ended at a notice, a
    /// suspension, a lost node or the lease's end.
    runs: Vec<Interval>,
    /// The event the next charges are caused by: the last `lease.started`,
    /// then `lease.ended`.
    cause: Option<Envelope>,
    /// Whether `lease.ended` was read: no run opens any more.
    ended: bool,
    /// The cumulative cost up to `charged_to`, as the last charge says.
    accrued: Accrued,
    /// The `to` of the lease's last charge.
    charged_to: Option<DateTime<Utc>>,
    /// Stream sequence of the lease's last charge (0: none yet).
    last_charge_sequence: u64,
    /// Not a lease but a reservation's commitment, billed whether used or
    /// not, hour by hour as its term passes.
    #[serde(default)]
    commitment: bool,
    /// The reservation covering this `reserved` lease, until when.
    #[serde(default)]
    covered_by: Option<(Uuid, DateTime<Utc>)>,
    /// Someone asked for the lease to stop: an exhausted balance need not.
    #[serde(default)]
    stop_requested: bool,
    /// The version the lease's quote names: its book, chosen at request.
    #[serde(default)]
    quoted_version: Option<u32>,
}

impl LeaseFacts {
    /// Every billable interval not yet wholly charged; the open run counts
    /// up to `now`.
    fn intervals(&self, now: DateTime<Utc>) -> Vec<Interval> {
        let mut runs = self.runs.clone();
        if let Some(start) = self.started_at {
            runs.push(Interval {
                start,
                end: now.max(start),
            });
        }
        runs
    }

    /// Closes the open run at `at` (not before it started).
    fn close_run(&mut self, at: DateTime<Utc>) {
        if let Some(start) = self.started_at.take() {
            self.runs.push(Interval {
                start,
                end: at.max(start),
            });
        }
    }

    /// The end of the lease's billable time, once it has ended.
    fn billable_end(&self) -> Option<DateTime<Utc>> {
        if !self.ended || self.started_at.is_some() {
            return None;
        }
        Some(
            self.runs
                .iter()
                .map(|r| r.end)
                .max()
                .unwrap_or(DateTime::<Utc>::MIN_UTC),
        )
    }

    /// Whether every billable second is charged: nothing more to do.
    fn done(&self) -> bool {
        self.billable_end()
            .is_some_and(|end| self.runs.is_empty() || self.charged_to.is_some_and(|to| to >= end))
    }
}

/// What a lease is priced on.
struct Priced<'a> {
    tenant_id: Uuid,
    tier: Tier,
    gpus: u32,
    vram_gb: u32,
    book: &'a PriceBookPublished,
    model: ChargeModel,
    market: Vec<PricePoint>,
    reservation_id: Option<Uuid>,
}

/// What to do with a lease that may have charges due.
#[derive(Debug)]
pub enum Plan {
    /// The charges due, oldest hour first.
    Publish(Box<Bill>),
    /// Nothing is due now.
    Nothing,
    /// No price book is known yet: try again later.
    WaitForBook,
    /// Can never be billed (facts missing from the log): drop it.
    Unbillable(String),
}

/// The charges of one lease due now, ready to publish.
#[derive(Debug, Clone)]
pub struct Bill {
    pub lease_id: Uuid,
    pub charges: Vec<ChargeAccrued>,
    /// The event the charges are caused by.
    pub cause: Envelope,
    /// Sequence of the lease's last charge in the log: the first message
    /// expects it.
    pub after_sequence: u64,
}

/// Most charged leases the fold remembers (see `Fold::charged`).
pub const MAX_REMEMBERED_CHARGED_LEASES: usize = 100_000;

/// Rating state folded from the log.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Fold {
    /// Every price book version seen, sorted by version.
    books: Vec<PriceBookPublished>,
    /// Open leases: requested and not yet wholly charged.
    leases: HashMap<Uuid, LeaseFacts>,
    /// Spot prices per `(zone, gpu_model)`, by `at`; the points before what
    /// an open lease still needs are dropped.
    market: HashMap<String, Vec<PricePoint>>,
    /// Per market, how many points it may hold before the next prune. A
    /// long spot lease pins its market's old points; were the prune tried
    /// at every new price it would scan every open lease each time, so
    /// after a prune the market may grow to twice what it kept first.
    #[serde(skip)]
    market_prune_at: HashMap<String, usize>,
    /// Leases wholly charged (or never billable), the newest
    /// [`MAX_REMEMBERED_CHARGED_LEASES`] of them: an event that comes for
    /// a lease after its charges is a late repeat, and a year of leases
    /// must not stay in memory.
    charged: HashSet<Uuid>,
    /// `charged` in the order its leases were charged, oldest first.
    charged_order: VecDeque<Uuid>,
    /// Leases whose facts changed since the last full look at them.
    touched: BTreeSet<Uuid>,
    /// Reservations whose commitment is not yet wholly charged, with the
    /// GPUs of the leases they cover now.
    #[serde(default)]
    reservations: HashMap<Uuid, (ReservationCommitted, u32)>,
    /// Sequence of the last event folded.
    pub sequence: u64,
    /// Sequence of the last event on the price book subject folded.
    #[serde(default)]
    pub book_sequence: u64,
    /// The prepaid tenants' balances.
    #[serde(default)]
    pub balances: crate::balances::Balances,
    /// The price book version and expiry of each quote, until a day after
    /// it expires (a lease is asked for with it before it expires).
    #[serde(default)]
    quotes: HashMap<Uuid, lh_events::QuoteIssued>,
}

fn market_key(zone: &str, gpu_model: &str) -> String {
    format!("{zone}/{gpu_model}")
}

impl Fold {
    /// Folds one event of the log.
    pub fn apply(&mut self, sequence: u64, envelope: &Envelope) {
        self.sequence = self.sequence.max(sequence);
        match &envelope.data {
            EventData::PriceBookPublished(book)
                if !self.books.iter().any(|b| b.version == book.version) =>
            {
                // Whoever publishes checks a book first; one that slipped
                // past (a ladder of a million steps, a price that overflows
                // the arithmetic) must not reach a bill.
                if let Err(e) = rating::validate_book(book) {
                    tracing::error!(version = book.version, error = %e,
                        "a price book pricing cannot charge with; ignored");
                    return;
                }
                self.books.push(book.clone());
                self.books.sort_by_key(|b| b.version);
            }
            EventData::SpotPriceSet(p) => self.price_set(p, envelope.occurred_at),
            EventData::ReservationCommitted(r) => self.committed(r, envelope),
            EventData::QuoteIssued(q) => {
                self.quotes
                    .retain(|_, k| k.expires_at + QUOTE_KEPT_AFTER_EXPIRY > envelope.occurred_at);
                self.quotes.insert(q.quote_id, q.clone());
            }
            EventData::LeaseRequested(e) => {
                // Only the tenant's own quote binds a book (the gateway
                // checks it; a request written otherwise gets none).
                let quoted_version = e
                    .quote_id
                    .and_then(|q| self.quotes.get(&q))
                    .filter(|q| q.tenant_id == e.tenant_id)
                    .map(|q| q.price_book_version);
                if let Some(l) = self.open(e.lease_id) {
                    l.quoted_version = quoted_version;
                    l.tenant_id = Some(e.tenant_id);
                    l.tier = Some(e.tier);
                    l.gpu_model = Some(e.gpu_model.clone());
                }
            }
            EventData::LeasePlaced(e) => {
                if let Some(l) = self.open(e.lease_id) {
                    l.gpus = Some(e.gpus.len() as u32);
                    // A fractional lease is billed by its share's VRAM.
                    let share = e.gpus.first().and_then(|g| g.vram_gb);
                    l.vram_gb_per_gpu = Some(share.unwrap_or(e.vram_gb_per_gpu));
                    l.zone = Some(e.zone.clone());
                }
            }
            EventData::LeaseStarted(e) => {
                let book = self.book_for(e.started_at).map(|b| b.version);
                let first_start = self.open(e.lease_id).is_some_and(|l| {
                    l.book_version.is_none() && l.runs.is_empty() && l.started_at.is_none()
                });
                if let Some(l) = self.open(e.lease_id) {
                    if l.started_at.is_none() {
                        l.started_at = Some(e.started_at);
                        l.cause = Some(envelope.clone());
                    }
                    if l.book_version.is_none() {
                        l.book_version = l.quoted_version.or(book);
                    }
                }
                if first_start {
                    self.cover(e.lease_id, e.started_at);
                }
            }
            EventData::LeaseEnded(e) => self.ended(e, envelope),
            EventData::LeaseMigrated(e) => {
                if let Some(l) = self.open(e.lease_id) {
                    // The old run is billed until the old node was last
                    // heard from; the next starts when the new node says so.
                    l.close_run(e.billing_ends_at);
                    if let Some(to) = &e.to {
                        l.gpus = Some(to.gpus.len() as u32);
                        let share = to.gpus.first().and_then(|g| g.vram_gb);
                        l.vram_gb_per_gpu = Some(share.unwrap_or(to.vram_gb_per_gpu));
                        l.zone = Some(to.zone.clone());
                    }
                }
            }
            EventData::LeaseSuspended(e) => {
                if let Some(l) = self.open(e.lease_id) {
                    // Suspended: the run ends when the workload stopped; a
                    // resumed lease opens the next at its new start.
                    l.close_run(e.suspended_at);
                }
            }
            EventData::LeasePreemptionNoticed(e) => {
                if let Some(l) = self.open(e.lease_id) {
                    // The notice period is the tenant's time to save work,
                    // not billed: the run ends when the notice is given.
                    l.close_run(envelope.occurred_at);
                }
            }
            // Rejected leases never run (one that has run is queued, not
            // rejected, by the scheduler): forget them.
            EventData::LeaseRejected(e)
                if self
                    .leases
                    .get(&e.lease_id)
                    .is_some_and(|l| l.runs.is_empty() && l.started_at.is_none()) =>
            {
                self.leases.remove(&e.lease_id);
                self.touched.remove(&e.lease_id);
            }
            EventData::ChargeAccrued(c) => {
                self.balances.apply(sequence, &envelope.data);
                self.charge_read(sequence, c)
            }
            EventData::LeaseStopRequested(e) => {
                if let Some(l) = self.open(e.lease_id) {
                    l.stop_requested = true;
                }
            }
            EventData::BalanceToppedUp(_)
            | EventData::BalanceLow(_)
            | EventData::BalanceExhausted(_)
            | EventData::BalanceRestored(_)
            | EventData::CreditGranted(_) => self.balances.apply(sequence, &envelope.data),
            _ => {}
        }
    }

    /// A reservation: its commitment is billed like a lease that runs for
    /// its whole term on its GPUs, at the reserved tier's price.
    fn committed(&mut self, r: &ReservationCommitted, envelope: &Envelope) {
        if self.charged.contains(&r.reservation_id) || self.leases.contains_key(&r.reservation_id) {
            return;
        }
        let book_version = self.book_for(r.starts_at).map(|b| b.version);
        self.reservations.insert(r.reservation_id, (r.clone(), 0));
        self.touched.insert(r.reservation_id);
        self.leases.insert(
            r.reservation_id,
            LeaseFacts {
                tenant_id: Some(r.tenant_id),
                tier: Some(Tier::Reserved),
                gpu_model: Some(r.gpu_model.clone()),
                zone: Some(r.zone.clone()),
                gpus: Some(r.gpus),
                vram_gb_per_gpu: lh_domain::catalog::vram_gb(&r.gpu_model),
                book_version,
                runs: vec![Interval {
                    start: r.starts_at,
                    end: r.ends_at.max(r.starts_at),
                }],
                cause: Some(envelope.clone()),
                ended: true,
                commitment: true,
                ..LeaseFacts::default()
            },
        );
    }

    /// A `reserved` lease starting for the first time takes room in the
    /// first of its tenant's reservations for its model and zone that is in
    /// its term and has room for all its GPUs (oldest first); none has
    /// room: it is billed as basic.
    fn cover(&mut self, lease_id: Uuid, started_at: DateTime<Utc>) {
        let Some(facts) = self.leases.get(&lease_id) else {
            return;
        };
        let (Some(Tier::Reserved), Some(tenant), Some(model), Some(zone), Some(gpus)) = (
            facts.tier,
            facts.tenant_id,
            facts.gpu_model.clone(),
            facts.zone.clone(),
            facts.gpus,
        ) else {
            return;
        };
        let mut fitting: Vec<&mut (ReservationCommitted, u32)> = self
            .reservations
            .values_mut()
            .filter(|(r, used)| {
                r.tenant_id == tenant
                    && r.gpu_model == model
                    && r.zone == zone
                    && r.starts_at <= started_at
                    && started_at < r.ends_at
                    && used.saturating_add(gpus) <= r.gpus
            })
            .collect();
        fitting.sort_by_key(|(r, _)| (r.starts_at, r.reservation_id));
        if let Some((r, used)) = fitting.into_iter().next() {
            *used += gpus;
            let cover = (r.reservation_id, r.ends_at);
            if let Some(facts) = self.leases.get_mut(&lease_id) {
                facts.covered_by = Some(cover);
            }
        }
    }

    /// The reservations not yet wholly charged, oldest first.
    pub fn reservations(&self) -> Vec<ReservationCommitted> {
        let mut all: Vec<_> = self.reservations.values().map(|(r, _)| r.clone()).collect();
        all.sort_by_key(|r| (r.starts_at, r.reservation_id));
        all
    }

    fn price_set(&mut self, p: &lh_events::SpotPriceSet, at: DateTime<Utc>) {
        // The broker keeps its prices between a floor and a ceiling; one
        // outside what it may publish is not billed.
        if !lh_domain::spot::is_market_price(p.price_cny_per_gb_hour) {
            tracing::error!(zone = p.zone, gpu_model = p.gpu_model, price = %p.price_cny_per_gb_hour,
                "a spot price outside what a broker may publish; ignored");
            return;
        }
        let key = market_key(&p.zone, &p.gpu_model);
        let points = self.market.entry(key.clone()).or_default();
        let point = PricePoint {
            at,
            price_cny_per_gb_hour: p.price_cny_per_gb_hour,
        };
        // Kept sorted by `at`; equal instants keep their log order.
        let index = points.partition_point(|q| q.at <= at);
        points.insert(index, point);
        let held = points.len();
        let prune_at = self
            .market_prune_at
            .get(&key)
            .copied()
            .unwrap_or(PRUNE_MARKET_AT_POINTS);
        if held >= prune_at {
            self.prune_market(&key);
            let kept = self.market.get(&key).map_or(0, Vec::len);
            self.market_prune_at
                .insert(key, (kept * 2).max(PRUNE_MARKET_AT_POINTS));
        }
    }

    /// Drops the points of a market before the last one in force at the
    /// earliest instant an open lease on it has not charged yet.
    fn prune_market(&mut self, key: &str) {
        let needed_from = self
            .leases
            .values()
            .filter(|l| {
                l.zone
                    .as_deref()
                    .zip(l.gpu_model.as_deref())
                    .is_some_and(|(z, m)| market_key(z, m) == key)
            })
            .filter_map(|l| {
                l.charged_to
                    .or(l.runs.first().map(|r| r.start))
                    .or(l.started_at)
            })
            .min();
        let Some(points) = self.market.get_mut(key) else {
            return;
        };
        let keep_from = match needed_from {
            Some(at) => points.partition_point(|q| q.at <= at).saturating_sub(1),
            // No open lease reads it: only the price in force now matters.
            None => points.len().saturating_sub(1),
        };
        points.drain(..keep_from);
    }

    /// A charge in the log: the lease is charged up to its `to`.
    fn charge_read(&mut self, sequence: u64, c: &ChargeAccrued) {
        let (Some(age_seconds), Some(priced_gb_seconds)) = (c.age_seconds, c.priced_gb_seconds)
        else {
            // Written before hourly accrual: all of the lease at its end.
            self.mark_charged(c.lease_id);
            return;
        };
        if self.charged.contains(&c.lease_id) {
            return;
        }
        let facts = self.leases.entry(c.lease_id).or_default();
        if facts.charged_to.is_none_or(|to| c.to >= to) {
            facts.accrued = Accrued {
                age_seconds,
                priced_gb_seconds,
            };
            facts.charged_to = Some(c.to);
        }
        facts.last_charge_sequence = facts.last_charge_sequence.max(sequence);
        let to = c.to;
        // Runs wholly charged are in `accrued`: drop them.
        facts.runs.retain(|r| r.end > to);
        if facts.done() {
            self.mark_charged(c.lease_id);
        } else {
            self.touched.insert(c.lease_id);
        }
    }

    /// Whether the history a restatement carries must be folded: it is a
    /// price book's (versions fold once), or a lease's whose request this
    /// fold never read (its history expired before this reader started).
    /// Facts gathered from the events before such a restatement are
    /// dropped, but not how far the lease is charged: the restatement
    /// carries the lease's events, not its charges.
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
                    if let Some(f) = self.leases.get_mut(&r.lease_id) {
                        *f = LeaseFacts {
                            accrued: f.accrued,
                            charged_to: f.charged_to,
                            last_charge_sequence: f.last_charge_sequence,
                            ..LeaseFacts::default()
                        };
                    }
                }
                !known
            }
            _ => false,
        }
    }

    /// The facts of a lease not yet wholly charged.
    fn open(&mut self, lease_id: Uuid) -> Option<&mut LeaseFacts> {
        if self.charged.contains(&lease_id) {
            return None;
        }
        self.touched.insert(lease_id);
        let facts = self.leases.entry(lease_id).or_default();
        // After lease.ended nothing changes what it costs.
        if facts.ended {
            return None;
        }
        Some(facts)
    }

    fn ended(&mut self, e: &lh_events::LeaseEnded, envelope: &Envelope) {
        let Some(facts) = self.open(e.lease_id) else {
            return;
        };
        // Its GPUs no longer count against the reservation.
        let release = facts
            .covered_by
            .map(|(id, _)| (id, facts.gpus.unwrap_or(0)));
        // A lease cancelled while it waits keeps the runs it had; its
        // current run (none, normally) is not billed.
        if e.reason == EndReason::Cancelled {
            facts.started_at = None;
        } else {
            facts.close_run(e.ended_at);
        }
        facts.runs.retain(|r| r.end > r.start);
        facts.ended = true;
        facts.cause = Some(envelope.clone());
        let done = facts.done();
        if let Some((id, gpus)) = release {
            if let Some((_, used)) = self.reservations.get_mut(&id) {
                *used = used.saturating_sub(gpus);
            }
        }
        if done {
            // Cancelled, never started, ended before it started, or every
            // second already charged: nothing (more) to bill.
            self.mark_charged(e.lease_id);
        }
    }

    /// Records that `lease_id` is wholly charged; forgets its facts.
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
        self.touched.remove(&lease_id);
        self.reservations.remove(&lease_id);
    }

    /// Drops a lease that can never be billed.
    pub fn drop_lease(&mut self, lease_id: Uuid) {
        self.mark_charged(lease_id);
    }

    /// Leases to look at now: all open ones when `all`, else those whose
    /// facts changed since they were last looked at.
    pub fn to_look_at(&mut self, all: bool) -> Vec<Uuid> {
        let touched = std::mem::take(&mut self.touched);
        if all {
            let mut ids: Vec<Uuid> = self.leases.keys().copied().collect();
            ids.sort();
            ids
        } else {
            touched.into_iter().collect()
        }
    }

    /// Looks at `lease_id` again at the next pass.
    pub fn touch(&mut self, lease_id: Uuid) {
        if self.leases.contains_key(&lease_id) {
            self.touched.insert(lease_id);
        }
    }

    /// Whether nothing more can come due for `lease_id` once nothing is
    /// due at `horizon`: the lease has ended (a commitment: its term has
    /// passed the horizon).
    pub fn is_over(&self, lease_id: Uuid, horizon: DateTime<Utc>) -> bool {
        self.leases.get(&lease_id).is_some_and(|l| {
            l.ended && (!l.commitment || l.billable_end().is_some_and(|end| end <= horizon))
        })
    }

    /// Open leases (requested, started or ended, not wholly charged).
    pub fn open_leases(&self) -> usize {
        self.leases.len()
    }

    pub fn is_charged(&self, lease_id: Uuid) -> bool {
        self.charged.contains(&lease_id)
    }

    /// The book a lease started at `started_at` is billed with: the newest
    /// version whose `effective_from` is not after the start, else the oldest.
    pub fn book_for(&self, started_at: DateTime<Utc>) -> Option<&PriceBookPublished> {
        book_in_force(&self.books, started_at)
    }

    /// The spot price in force per (zone, GPU model): each market's last.
    pub fn spot_prices(&self) -> HashMap<(String, String), Decimal> {
        self.market
            .iter()
            .filter_map(|(key, points)| {
                let (zone, model) = key.rsplit_once('/')?;
                let last = points.last()?;
                Some((
                    (zone.to_string(), model.to_string()),
                    last.price_cny_per_gb_hour,
                ))
            })
            .collect()
    }

    pub fn has_book(&self) -> bool {
        !self.books.is_empty()
    }

    /// The market a spot lease is priced on, with the tier's headline
    /// price standing for the time before the market's first price.
    fn market_for(&self, facts: &LeaseFacts, headline: Decimal) -> Vec<PricePoint> {
        let mut points = vec![PricePoint {
            at: DateTime::<Utc>::MIN_UTC,
            price_cny_per_gb_hour: headline,
        }];
        if let (Some(zone), Some(model)) = (&facts.zone, &facts.gpu_model) {
            if let Some(known) = self.market.get(&market_key(zone, model)) {
                points.extend(known.iter().copied());
            }
        }
        points
    }

    /// The charges of `lease_id` due at `now`: every UTC hour of its
    /// billable time that ended at least `grace` ago, or, once it has
    /// ended, every hour up to its end.
    pub fn plan(&self, lease_id: Uuid, now: DateTime<Utc>, grace: chrono::Duration) -> Plan {
        self.plan_until(lease_id, rating::hour_start(now - grace))
    }

    /// [`Fold::plan`] with the hours before `horizon` due.
    pub fn plan_until(&self, lease_id: Uuid, horizon: DateTime<Utc>) -> Plan {
        let Some(facts) = self.leases.get(&lease_id) else {
            return Plan::Unbillable("no facts about the lease".into());
        };
        let until = match facts.billable_end() {
            // A commitment is billed as its term passes, not ahead.
            Some(end) if facts.commitment => end.min(horizon),
            Some(end) => end,
            None => horizon,
        };
        let intervals = facts.intervals(until);
        let Some(first_start) = intervals.iter().map(|r| r.start).min() else {
            return Plan::Nothing;
        };
        let from = facts
            .charged_to
            .map_or(first_start, |to| to.max(first_start));
        if from >= until {
            return Plan::Nothing;
        }
        let priced = match self.priced(lease_id, facts, first_start) {
            Ok(priced) => priced,
            Err(plan) => return plan,
        };
        let Priced {
            tenant_id,
            tier,
            gpus,
            vram_gb,
            book,
            model,
            market,
            reservation_id,
        } = priced;
        let Some(cause) = facts.cause.clone() else {
            return match facts.ended {
                true => Plan::Unbillable("no lease.started in the log".into()),
                false => Plan::Nothing,
            };
        };
        let mut charges = Vec::new();
        let mut before = facts.accrued;
        let mut hour = rating::hour_start(from);
        while hour < until {
            let next_hour = hour + chrono::Duration::hours(1);
            let (piece_from, piece_to) = (from.max(hour), until.min(next_hour));
            let after = rating::accrue(
                &model, &market, vram_gb, before, &intervals, piece_from, piece_to,
            );
            let seconds = after.age_seconds - before.age_seconds;
            if seconds > 0 {
                let amount = after.amount_since(&before);
                let exact = after.exact_cny() - before.exact_cny();
                let unit_price = (exact * Decimal::from(3600)
                    / (Decimal::from(vram_gb.max(1)) * Decimal::from(seconds)))
                .round_dp(UNIT_PRICE_SCALE)
                .normalize();
                charges.push(ChargeAccrued {
                    charge_id: rating::hourly_charge_id(lease_id, hour),
                    tenant_id,
                    lease_id,
                    period: rating::period_of(piece_from),
                    tier,
                    gpus,
                    vram_gb,
                    from: piece_from,
                    to: piece_to,
                    billed_seconds: seconds,
                    unit_price_cny_per_gb_hour: unit_price,
                    amount,
                    currency: book.currency.clone(),
                    price_book_version: book.version,
                    age_seconds: Some(after.age_seconds),
                    priced_gb_seconds: Some(after.priced_gb_seconds),
                    reservation_id,
                });
                before = after;
            }
            hour = next_hour;
        }
        if charges.is_empty() {
            return Plan::Nothing;
        }
        Plan::Publish(Box::new(Bill {
            lease_id,
            charges,
            cause,
            after_sequence: facts.last_charge_sequence,
        }))
    }

    /// For each prepaid tenant, what its open leases cost at `now` beyond
    /// their charges in the log (`unbilled`: charges lag by up to an hour
    /// and the accrual grace), and what those running now cost per hour at
    /// the rate they accrue now (`burn_rate_cny_per_hour`). One pass over
    /// the open leases, whatever the number of tenants.
    pub fn running_costs(&self, now: DateTime<Utc>) -> HashMap<Uuid, crate::balances::RunningCost> {
        let mut costs: HashMap<Uuid, crate::balances::RunningCost> = HashMap::new();
        let an_hour_on = now + chrono::Duration::hours(1);
        for (lease_id, facts) in &self.leases {
            let Some(tenant_id) = facts.tenant_id else {
                continue;
            };
            if facts.commitment || self.balances.get(tenant_id).is_none() {
                continue;
            }
            let until = facts.billable_end().unwrap_or(now).min(now);
            let intervals = facts.intervals(until);
            let Some(first_start) = intervals.iter().map(|r| r.start).min() else {
                continue;
            };
            let Ok(priced) = self.priced(*lease_id, facts, first_start) else {
                continue;
            };
            let cost = costs.entry(tenant_id).or_default();
            let from = facts
                .charged_to
                .map_or(first_start, |to| to.max(first_start));
            let at_now = rating::accrue(
                &priced.model,
                &priced.market,
                priced.vram_gb,
                facts.accrued,
                &intervals,
                from,
                until,
            );
            cost.unbilled += at_now.amount_since(&facts.accrued);
            if facts.started_at.is_some() && !facts.ended {
                let next_hour = rating::accrue(
                    &priced.model,
                    &priced.market,
                    priced.vram_gb,
                    at_now,
                    &facts.intervals(an_hour_on),
                    until.max(from),
                    an_hour_on,
                );
                cost.burn_rate_cny_per_hour += next_hour.exact_cny() - at_now.exact_cny();
                cost.running.push(*lease_id);
                if !facts.stop_requested {
                    cost.not_stopping.push(*lease_id);
                }
            }
        }
        for cost in costs.values_mut() {
            cost.running.sort();
            cost.not_stopping.sort();
        }
        costs
    }

    /// What `facts` are priced on: the lease's book, charge model and
    /// market, or the plan when they are not all known.
    fn priced<'a>(
        &'a self,
        lease_id: Uuid,
        facts: &LeaseFacts,
        first_start: DateTime<Utc>,
    ) -> Result<Priced<'a>, Plan> {
        // A running lease's facts may still be on their way; an ended
        // lease's never come.
        let missing = |why: &str| match facts.ended {
            true => Plan::Unbillable(why.into()),
            false => Plan::Nothing,
        };
        let (Some(tenant_id), Some(tier)) = (facts.tenant_id, facts.tier) else {
            return Err(missing("no lease.requested in the log"));
        };
        let (Some(gpus), Some(vram_gb_per_gpu)) = (facts.gpus, facts.vram_gb_per_gpu) else {
            return Err(missing("no lease.placed in the log"));
        };
        let book = match facts.book_version {
            Some(v) => self.books.iter().find(|b| b.version == v),
            None => self.book_for(first_start),
        };
        let Some(book) = book else {
            return Err(Plan::WaitForBook);
        };
        // A commitment at the reserved tier's price; a `reserved` lease
        // its reservation covers is free until the term ends, then (and
        // when none covers it) at the basic tier's.
        let priced_as = match tier {
            Tier::Reserved if facts.commitment => Tier::Reserved,
            Tier::Reserved => Tier::Basic,
            other => other,
        };
        let (model, headline) = tier_pricing(book, priced_as).map_err(Plan::Unbillable)?;
        let (model, market) = match (model, facts.covered_by) {
            (_, Some((_, covered_until))) if !facts.commitment => (
                ChargeModel::Market,
                vec![
                    PricePoint {
                        at: DateTime::<Utc>::MIN_UTC,
                        price_cny_per_gb_hour: Decimal::ZERO,
                    },
                    PricePoint {
                        at: covered_until,
                        price_cny_per_gb_hour: headline,
                    },
                ],
            ),
            (ChargeModel::Market, _) => (ChargeModel::Market, self.market_for(facts, headline)),
            (model, _) => (model, Vec::new()),
        };
        let reservation_id = match facts.commitment {
            true => Some(lease_id),
            false => facts.covered_by.map(|(id, _)| id),
        };
        Ok(Priced {
            tenant_id,
            tier,
            gpus,
            vram_gb: gpus * vram_gb_per_gpu,
            book,
            model,
            market,
            reservation_id,
        })
    }
}

/// The charge model and headline price of `tier` in `book`, or why none.
pub fn tier_pricing(
    book: &PriceBookPublished,
    tier: Tier,
) -> Result<(ChargeModel, Decimal), String> {
    match (
        rating::tier_model(book, tier),
        rating::unit_price(book, tier),
    ) {
        (Some(model), Some(headline)) => Ok((model, headline)),
        _ => Err(format!(
            "price book v{} has no price for tier {}",
            book.version,
            tier.as_str()
        )),
    }
}

/// Of `books` (sorted by version), the newest whose `effective_from` is
/// not after `at`, else the oldest.
pub fn book_in_force(
    books: &[PriceBookPublished],
    at: DateTime<Utc>,
) -> Option<&PriceBookPublished> {
    books
        .iter()
        .rev()
        .find(|b| b.effective_from <= at)
        .or_else(|| books.first())
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

/// The charge events of a bill.
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

/// A lease's charges as decisions: atomic batches of at most
/// [`MAX_BATCH_MESSAGES`], the first message of each expecting
/// `lh.evt.charge.<lease_id>` to end where the fold saw its last charge.
/// The decide loop replaces a later batch's expectation with the sequence
/// the batch before it got, so the chain holds across batches.
pub fn bill_batches(bill: &Bill, now: DateTime<Utc>) -> Vec<Batch> {
    envelopes(bill, now)
        .chunks(MAX_BATCH_MESSAGES)
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let expect = if i == 0 {
                        Expect::LastSubjectSequence(bill.after_sequence)
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
    /// Reservations whose commitment is not yet wholly charged.
    pub reservations: Vec<ReservationCommitted>,
    /// The prepaid tenants' balances at the last pass of the decide loop.
    pub balances: HashMap<Uuid, lh_rpc::balance::Balance>,
    /// The quotes issued, until a day after they expire.
    pub quotes: HashMap<Uuid, lh_events::QuoteIssued>,
    /// The spot price in force per (zone, GPU model).
    pub spot_prices: HashMap<(String, String), Decimal>,
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
    /// How long after an hour ends it is charged.
    grace: chrono::Duration,
    /// The horizon of the last pass that looked at every open lease.
    looked_at_horizon: Option<DateTime<Utc>>,
    shelf: SharedShelf,
    /// A prepaid balance covering less than this at its burn rate is low.
    balance_warn_seconds: u64,
    /// Tenants given their own spend series so far.
    spend_series: std::collections::HashSet<Uuid>,
}

/// Tenants given their own `lh_tenant_charged_fen_total` series; past it,
/// further tenants are summed under `tenant="other"`, so a flood of tenants
/// cannot grow the scrape without bound.
pub const MAX_SPEND_SERIES_TENANTS: usize = 10_000;

impl Charges {
    pub fn new(node_clock_skew: chrono::Duration, grace: chrono::Duration) -> Self {
        Self {
            node_clock_skew,
            grace,
            balance_warn_seconds: crate::balances::DEFAULT_BALANCE_WARN_SECS,
            ..Self::default()
        }
    }

    /// Warns of a prepaid balance that covers less than `seconds`.
    pub fn with_balance_warn_seconds(mut self, seconds: u64) -> Self {
        self.balance_warn_seconds = seconds;
        self
    }

    /// Each prepaid tenant's balance at `now`, for the balance RPC, and the
    /// writes those balances call for.
    fn balance_decisions(&self, now: DateTime<Utc>) -> Vec<Batch> {
        let mut decisions = Vec::new();
        let mut views = HashMap::new();
        let mut costs = self.fold.running_costs(now);
        for tenant_id in self.fold.balances.tenants() {
            let Some(b) = self.fold.balances.get(tenant_id) else {
                continue;
            };
            let cost = costs.remove(&tenant_id).unwrap_or_default();
            views.insert(tenant_id, crate::balances::view(tenant_id, b, &cost));
            decisions.extend(crate::balances::decisions(
                tenant_id,
                b,
                &cost,
                self.balance_warn_seconds,
                now,
            ));
        }
        self.shelf.write().expect("shelf lock").balances = views;
        decisions
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

    /// Keeps what the quote RPC reads: the quotes and the spot prices.
    fn shelve(&self, envelope: &Envelope) {
        match &envelope.data {
            EventData::QuoteIssued(q) => {
                let mut shelf = self.shelf.write().expect("shelf lock");
                shelf
                    .quotes
                    .retain(|_, k| k.expires_at + QUOTE_KEPT_AFTER_EXPIRY > envelope.occurred_at);
                shelf.quotes.insert(q.quote_id, q.clone());
            }
            EventData::SpotPriceSet(p) => {
                self.shelf.write().expect("shelf lock").spot_prices.insert(
                    (p.zone.clone(), p.gpu_model.clone()),
                    p.price_cny_per_gb_hour,
                );
            }
            _ => {}
        }
    }

    fn update_shelf(&self) {
        let mut shelf = self.shelf.write().expect("shelf lock");
        if shelf.sequence != self.fold.book_sequence || shelf.books.len() != self.fold.books.len() {
            shelf.books = self.fold.books.clone();
            shelf.sequence = self.fold.book_sequence;
        }
        if shelf.reservations.len() != self.fold.reservations.len() {
            shelf.reservations = self.fold.reservations();
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
        // A notice is given when it is stored, at the latest.
        EventData::LeasePreemptionNoticed(_) => {
            (envelope.occurred_at, envelope.occurred_at.min(stored_at))
        }
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
        EventData::LeasePreemptionNoticed(_) => held.occurred_at = held_at,
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
        self.shelve(envelope);
        self.update_shelf();
    }

    fn apply_stored(&mut self, sequence: u64, stored_at: DateTime<Utc>, envelope: &Envelope) {
        if matches!(
            envelope.data,
            EventData::PriceBookPublished(_) | EventData::PriceBookRestated(_)
        ) {
            self.fold.book_sequence = self.fold.book_sequence.max(sequence);
        }
        self.apply_stored_event(sequence, stored_at, envelope);
        self.shelve(envelope);
        self.update_shelf();
    }

    fn snapshot(&self) -> Option<Box<serde_json::value::RawValue>> {
        lh_service::decider::snapshot_of(&self.fold)
    }

    fn restore(&mut self, state: &serde_json::value::RawValue) -> bool {
        match lh_service::decider::restored(state) {
            Some(fold) => {
                self.fold = fold;
                let mut shelf = self.shelf.write().expect("shelf lock");
                shelf.quotes = self.fold.quotes.clone();
                shelf.spot_prices = self.fold.spot_prices();
                drop(shelf);
                self.update_shelf();
                true
            }
            None => false,
        }
    }

    fn decide(&mut self, now: DateTime<Utc>) -> Vec<Batch> {
        let horizon = rating::hour_start(now - self.grace);
        // An hour is over: every running lease has one due. Otherwise only
        // the leases the log said something new about.
        let all = self.looked_at_horizon != Some(horizon);
        self.looked_at_horizon = Some(horizon);
        let mut decisions = Vec::new();
        for lease_id in self.fold.to_look_at(all) {
            match self.fold.plan_until(lease_id, horizon) {
                Plan::Nothing if self.fold.is_over(lease_id, horizon) => {
                    self.fold.mark_charged(lease_id)
                }
                Plan::Nothing => {}
                Plan::Publish(bill) => {
                    decisions.extend(bill_batches(&bill, now));
                    // Looked at again next pass: nothing is due once its
                    // charges are in, and a refused batch is tried again.
                    self.fold.touch(lease_id);
                }
                Plan::WaitForBook => {
                    if !self.warned_no_book {
                        tracing::warn!(%lease_id, "no price book in the log yet; charges wait");
                        self.warned_no_book = true;
                    }
                    self.fold.touch(lease_id);
                }
                Plan::Unbillable(why) => {
                    tracing::error!(%lease_id, %why, "lease cannot be billed");
                    self.fold.drop_lease(lease_id);
                }
            }
        }
        metrics::gauge!("lh_pricing_open_leases").set(self.fold.open_leases() as f64);
        decisions.extend(self.balance_decisions(now));
        self.update_shelf();
        decisions
    }

    fn appended(&mut self, batch: &Batch) {
        metrics::counter!("lh_charges_published_total").increment(batch.len() as u64);
        for (envelope, _) in batch {
            if let EventData::ChargeAccrued(c) = &envelope.data {
                // Amounts are whole fen (the rounding rule), so the count is
                // exact; a counter cannot go down, and a charge never does.
                let fen = (c.amount * Decimal::ONE_HUNDRED).round().to_u64();
                metrics::counter!("lh_charged_fen_total", "tier" => c.tier.as_str())
                    .increment(fen.unwrap_or(0));
                let own = self.spend_series.contains(&c.tenant_id)
                    || (self.spend_series.len() < MAX_SPEND_SERIES_TENANTS
                        && self.spend_series.insert(c.tenant_id));
                let tenant = if own {
                    c.tenant_id.to_string()
                } else {
                    "other".to_string()
                };
                metrics::counter!("lh_tenant_charged_fen_total", "tenant" => tenant)
                    .increment(fen.unwrap_or(0));
            }
        }
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

    /// A horizon after every lease of these tests.
    const LATER: DateTime<Utc> = DateTime::<Utc>::MAX_UTC;
    const GRACE: chrono::Duration = chrono::Duration::seconds(300);

    /// The leases with charges due once every hour is over.
    fn due(f: &Fold) -> Vec<Uuid> {
        let mut ids: Vec<Uuid> = f
            .leases
            .keys()
            .copied()
            .filter(|id| matches!(f.plan_until(*id, LATER), Plan::Publish(_)))
            .collect();
        ids.sort();
        ids
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
        assert_eq!(due(&f), vec![lease]);
        let Plan::Publish(bill) = f.plan_until(lease, LATER) else {
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
        assert!(due(&f).is_empty());
        assert!(f.is_charged(lease));
    }

    #[test]
    fn a_node_clock_far_off_moves_the_bill_by_the_skew_at_most() {
        let lease = Uuid::from_u128(1);
        let mut charges = Charges::new(chrono::Duration::seconds(30), GRACE);
        charges.apply_stored(1, t(0, 0, 0), &book(1, t(0, 0, 0), "0.5"));
        // The node says it started an hour before the log stored its
        // report, and ended ten minutes after the log stored that.
        let events = lease_events(lease, t(9, 0, 0), t(10, 11, 30), EndReason::Stopped);
        let stored = [t(10, 0, 0), t(10, 0, 0), t(10, 0, 0), t(10, 1, 30)];
        for (i, (e, at)) in events.iter().zip(stored).enumerate() {
            charges.apply_stored(2 + i as u64, at, e);
        }
        let Plan::Publish(bill) = charges.fold.plan_until(lease, LATER) else {
            panic!("expected a bill")
        };
        // From 09:59:30 (30 s of skew allowed) to 10:01:30 (when stored),
        // in the hours 09:00 and 10:00.
        let seconds: Vec<u64> = bill.charges.iter().map(|c| c.billed_seconds).collect();
        assert_eq!(seconds, vec![30, 90]);
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
        let mut charges = Charges::new(chrono::Duration::seconds(30), GRACE);
        charges.apply_stored(40, t(10, 0, 0), &events[3]);
        charges.apply_stored(50, t(10, 0, 0), &env(book_restated));
        charges.apply_stored(51, t(10, 0, 0), &env(lease_restated.clone()));
        charges.apply_stored(52, t(10, 1, 30), &ended);
        let (Plan::Publish(fresh), Plan::Publish(known)) = (
            charges.fold.plan_until(lease, LATER),
            whole.plan_until(lease, LATER),
        ) else {
            panic!("both bill the lease")
        };
        assert_eq!(fresh.charges, known.charges);
        assert_eq!(fresh.charges[0].billed_seconds, 90);
        // To a fold that knows the lease, its restatement changes nothing.
        let mut again = Charges::new(chrono::Duration::seconds(30), GRACE);
        for (i, e) in events.iter().enumerate() {
            again.apply_stored(1 + i as u64, t(10, 0, 0), e);
        }
        again.apply_stored(51, t(10, 0, 0), &env(lease_restated));
        again.apply_stored(52, t(10, 1, 30), &ended);
        let Plan::Publish(bill) = again.fold.plan_until(lease, LATER) else {
            panic!("billed")
        };
        assert_eq!(bill.charges, known.charges);
    }

    #[test]
    fn a_snapshot_taken_back_bills_the_same() {
        let lease = Uuid::from_u128(1);
        let (events, ended) = book_and_lease_until_its_end(lease);
        let mut before = Charges::new(chrono::Duration::seconds(30), GRACE);
        for (i, e) in events.iter().enumerate() {
            before.apply_stored(1 + i as u64, t(10, 0, 0), e);
        }
        let mut after = Charges::new(chrono::Duration::seconds(30), GRACE);
        let bytes = serde_json::to_vec(&before.snapshot().unwrap()).unwrap();
        assert!(after
            .restore(&serde_json::from_slice::<Box<serde_json::value::RawValue>>(&bytes).unwrap()));
        for c in [&mut before, &mut after] {
            c.apply_stored(9, t(10, 1, 30), &ended);
        }
        let (Plan::Publish(a), Plan::Publish(b)) = (
            before.fold.plan_until(lease, LATER),
            after.fold.plan_until(lease, LATER),
        ) else {
            panic!("both bill")
        };
        assert_eq!(a.charges, b.charges);
        let other = serde_json::json!({"books": 3});
        assert!(!after.restore(&serde_json::value::to_raw_value(&other).unwrap()));
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
            mig_devices: Vec::new(),
        })));
        events.push(ended);
        let f = fold(&events);
        let Plan::Publish(bill) = f.plan_until(lease, LATER) else {
            panic!("expected a bill")
        };
        let runs: Vec<_> = bill
            .charges
            .iter()
            .map(|c| (c.from, c.to, c.billed_seconds))
            .collect();
        // Both runs are in the hour 10:00: one charge, without the 4 s
        // between them.
        assert_eq!(runs, vec![(t(10, 0, 0), t(10, 5, 0), 90 + 206)]);
        // 80 GB x 0.5 CNY/GB-h x 296 s = 3.2888...
        assert_eq!(bill.charges[0].amount.to_string(), "3.29");

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
        let Plan::Publish(bill) = fold(&events).plan_until(lease, LATER) else {
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
        let Plan::Publish(bill) = fold(&events).plan_until(lease, LATER) else {
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
        let Plan::Publish(bill) = fold(&events).plan_until(lease, LATER) else {
            panic!()
        };
        events.extend(envelopes(&bill, Utc::now()));
        assert!(due(&fold(&events)).is_empty());
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
        assert!(due(&fold(&events)).is_empty());
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
        assert!(matches!(f.plan_until(lease, LATER), Plan::WaitForBook));
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
        let Plan::Publish(bill) = fold(&events).plan_until(lease, LATER) else {
            panic!()
        };
        assert_eq!(bill.charges[0].billed_seconds, 3600);
        assert_eq!(bill.charges[0].amount.to_string(), "40.00");
    }

    /// Publishes what is due at `horizon` into the events, as the decide
    /// loop and the log would; returns the charges.
    fn charge_until(
        events: &mut Vec<Envelope>,
        lease: Uuid,
        horizon: DateTime<Utc>,
    ) -> Vec<ChargeAccrued> {
        match fold(events).plan_until(lease, horizon) {
            Plan::Publish(bill) => {
                events.extend(envelopes(&bill, Utc::now()));
                bill.charges
            }
            Plan::Nothing => Vec::new(),
            other => panic!("{other:?}"),
        }
    }

    fn total(charges: &[ChargeAccrued]) -> String {
        charges
            .iter()
            .map(|c| c.amount)
            .sum::<Decimal>()
            .to_string()
    }

    #[test]
    fn a_running_lease_is_charged_each_hour_and_its_end_at_the_end() {
        let lease = Uuid::from_u128(1);
        let mut events = vec![book(1, t(0, 0, 0), "0.5")];
        let mut lifecycle = lease_events(lease, t(10, 20, 0), t(13, 30, 0), EndReason::Stopped);
        let ended = lifecycle.pop().unwrap();
        events.extend(lifecycle);
        // Nothing before the first hour is over.
        assert!(charge_until(&mut events, lease, t(10, 0, 0)).is_empty());
        let first = charge_until(&mut events, lease, t(12, 0, 0));
        let spans: Vec<_> = first
            .iter()
            .map(|c| (c.from, c.to, c.billed_seconds))
            .collect();
        assert_eq!(
            spans,
            vec![
                (t(10, 20, 0), t(11, 0, 0), 2400),
                (t(11, 0, 0), t(12, 0, 0), 3600)
            ]
        );
        assert_eq!(
            first[0].charge_id,
            rating::hourly_charge_id(lease, t(10, 0, 0))
        );
        // Asked again for the same hours (a replay, a second replica):
        // nothing more.
        assert!(charge_until(&mut events, lease, t(12, 0, 0)).is_empty());
        let second = charge_until(&mut events, lease, t(13, 0, 0));
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].age_seconds, Some(2400 + 2 * 3600));
        events.push(ended);
        let last = charge_until(&mut events, lease, t(13, 0, 0));
        assert_eq!((last[0].from, last[0].to), (t(13, 0, 0), t(13, 30, 0)));
        assert!(fold(&events).is_charged(lease));
        // 80 GB x 0.5 CNY/GB-h x 3 h 10 min = 126.666... -> 126.67 in all.
        let all: Vec<_> = [first, second, last].concat();
        assert_eq!(total(&all), "126.67");
        let amounts: Vec<String> = all.iter().map(|c| c.amount.to_string()).collect();
        assert_eq!(amounts, ["26.67", "40.00", "40.00", "20.00"]);
    }

    #[test]
    fn performance_steps_down_with_billable_age_and_skips_gaps() {
        let lease = Uuid::from_u128(1);
        let mut events = vec![env(EventData::PriceBookPublished(
            rating::default_price_book(t(0, 0, 0)),
        ))];
        let mut lifecycle = lease_events(lease, t(1, 0, 0), t(9, 0, 0), EndReason::Stopped);
        if let EventData::LeaseRequested(r) = &mut lifecycle[0].data {
            r.tier = Tier::Performance;
        }
        let ended = lifecycle.pop().unwrap();
        events.extend(lifecycle);
        // Suspended 03:00-04:00: that hour neither billed nor aged.
        events.push(env(EventData::LeaseSuspended(LeaseSuspended {
            lease_id: lease,
            node_id: "n1".into(),
            gpu_indices: vec![0, 1],
            suspended_at: t(3, 0, 0),
            reason: "idle".into(),
        })));
        events.push(env(EventData::LeaseStarted(fixtures::started(
            lease,
            "n1",
            t(4, 0, 0),
        ))));
        let mut charges = charge_until(&mut events, lease, t(6, 0, 0));
        events.push(ended);
        charges.extend(charge_until(&mut events, lease, t(6, 0, 0)));
        // 80 GB; billable age 0-3 h at 2.0 (01-03, 04-05), 3-6 h at 1.6
        // (05-08), 6-7 h at 1.2 (08-09): 80 x (6 + 4.8 + 1.2) = 960.
        let amounts: Vec<String> = charges.iter().map(|c| c.amount.to_string()).collect();
        assert_eq!(
            amounts,
            ["160.00", "160.00", "160.00", "128.00", "128.00", "128.00", "96.00"]
        );
        assert_eq!(total(&charges), "960.00");
        assert!(charges.iter().all(|c| c.tier == Tier::Performance));
    }

    #[test]
    fn the_notice_period_is_not_billed() {
        let lease = Uuid::from_u128(1);
        let mut events = vec![book(1, t(0, 0, 0), "0.5")];
        let mut lifecycle = lease_events(lease, t(10, 0, 0), t(10, 32, 0), EndReason::Preempted);
        let ended = lifecycle.pop().unwrap();
        events.extend(lifecycle);
        let mut notice = env(EventData::LeasePreemptionNoticed(LeasePreemptionNoticed {
            lease_id: lease,
            node_id: "n1".into(),
            preempted_for: Uuid::from_u128(2),
            deadline: t(10, 32, 0),
            reason: lh_events::PreemptionReason::Capacity,
        }));
        notice.occurred_at = t(10, 30, 0);
        events.push(notice);
        events.push(ended);
        let charges = charge_until(&mut events, lease, LATER);
        assert_eq!(charges.len(), 1);
        assert_eq!(
            (charges[0].to, charges[0].billed_seconds),
            (t(10, 30, 0), 1800)
        );
        assert_eq!(charges[0].amount.to_string(), "20.00");
    }

    #[test]
    fn spot_follows_the_market_of_its_zone_and_model() {
        let lease = Uuid::from_u128(1);
        let mut events = vec![env(EventData::PriceBookPublished(
            rating::default_price_book(t(0, 0, 0)),
        ))];
        let price = |at: DateTime<Utc>, zone: &str, p: &str| {
            let mut e = env(EventData::SpotPriceSet(SpotPriceSet {
                zone: zone.into(),
                gpu_model: fixtures::MODEL.into(),
                price_cny_per_gb_hour: p.parse().unwrap(),
                utilisation: Decimal::ZERO,
                gpus_total: 8,
                gpus_used: 0,
            }));
            e.occurred_at = at;
            e
        };
        events.push(price(t(9, 0, 0), "z", "0.1"));
        events.push(price(t(9, 0, 0), "elsewhere", "9"));
        let mut lifecycle = lease_events(lease, t(10, 0, 0), t(11, 30, 0), EndReason::Stopped);
        if let EventData::LeaseRequested(r) = &mut lifecycle[0].data {
            r.tier = Tier::Spot;
        }
        let ended = lifecycle.pop().unwrap();
        events.extend(lifecycle);
        events.push(price(t(10, 30, 0), "z", "0.4"));
        let mut charges = charge_until(&mut events, lease, t(11, 0, 0));
        events.push(price(t(11, 15, 0), "z", "0.2"));
        events.push(ended);
        charges.extend(charge_until(&mut events, lease, t(11, 0, 0)));
        // 80 GB: 30 min at 0.1, 45 min at 0.4, 15 min at 0.2
        // = 80 x (0.05 + 0.3 + 0.05) = 32.00
        let amounts: Vec<String> = charges.iter().map(|c| c.amount.to_string()).collect();
        assert_eq!(amounts, ["20.00", "12.00"]);
        assert_eq!(charges[0].unit_price_cny_per_gb_hour.to_string(), "0.25");
    }

    #[test]
    fn a_book_or_a_spot_price_out_of_bounds_is_not_charged_with() {
        let lease = Uuid::from_u128(1);
        let mut events = vec![env(EventData::PriceBookPublished(
            rating::default_price_book(t(0, 0, 0)),
        ))];
        // A newer book with a ladder of a million steps.
        let mut long = rating::default_price_book(t(1, 0, 0));
        long.version = 2;
        long.tiers[0].model = Some(ChargeModel::Graduated {
            steps: (0..1_000_000)
                .map(|h| PriceStep {
                    from_hour: h,
                    price_cny_per_gb_hour: Decimal::ONE,
                })
                .collect(),
        });
        events.push(env(EventData::PriceBookPublished(long)));
        let price = |at: DateTime<Utc>, p: &str| {
            let mut e = env(EventData::SpotPriceSet(SpotPriceSet {
                zone: "z".into(),
                gpu_model: fixtures::MODEL.into(),
                price_cny_per_gb_hour: p.parse().unwrap(),
                utilisation: Decimal::ZERO,
                gpus_total: 8,
                gpus_used: 0,
            }));
            e.occurred_at = at;
            e
        };
        events.push(price(t(9, 0, 0), "0.1"));
        events.push(price(t(10, 15, 0), "100000000000000000000000000"));
        events.push(price(t(10, 30, 0), "-5"));
        let mut lifecycle = lease_events(lease, t(10, 0, 0), t(11, 0, 0), EndReason::Stopped);
        if let EventData::LeaseRequested(r) = &mut lifecycle[0].data {
            r.tier = Tier::Spot;
        }
        events.extend(lifecycle);
        let f = fold(&events);
        let Plan::Publish(bill) = f.plan_until(lease, LATER) else {
            panic!("expected a bill")
        };
        // An hour of 80 GB at 0.1, on the first book.
        assert_eq!(bill.charges[0].amount.to_string(), "8.00");
        assert_eq!(bill.charges[0].price_book_version, 1);
    }

    #[test]
    fn a_market_keeps_only_the_prices_an_open_lease_still_needs() {
        let mut f = Fold::default();
        for i in 0..(PRUNE_MARKET_AT_POINTS as i64 * 3) {
            f.price_set(
                &SpotPriceSet {
                    zone: "z".into(),
                    gpu_model: "m".into(),
                    price_cny_per_gb_hour: Decimal::ONE,
                    utilisation: Decimal::ZERO,
                    gpus_total: 1,
                    gpus_used: 0,
                },
                t(0, 0, 0) + chrono::Duration::seconds(i),
            );
        }
        assert!(f.market["z/m"].len() < PRUNE_MARKET_AT_POINTS);
    }

    #[test]
    fn a_market_an_old_lease_pins_is_pruned_ever_more_rarely() {
        let lease = Uuid::from_u128(1);
        let mut lifecycle = lease_events(lease, t(0, 0, 0), t(23, 0, 0), EndReason::Stopped);
        lifecycle.pop();
        if let EventData::LeaseRequested(r) = &mut lifecycle[0].data {
            r.tier = Tier::Spot;
        }
        let mut f = fold(&lifecycle);
        let zone = f.leases[&lease].zone.clone().unwrap();
        let model = f.leases[&lease].gpu_model.clone().unwrap();
        let key = market_key(&zone, &model);
        let mut prunes = 0;
        let mut limit = PRUNE_MARKET_AT_POINTS;
        for i in 0..(PRUNE_MARKET_AT_POINTS as i64 * 8) {
            f.price_set(
                &SpotPriceSet {
                    zone: zone.clone(),
                    gpu_model: model.clone(),
                    price_cny_per_gb_hour: Decimal::ONE,
                    utilisation: Decimal::ZERO,
                    gpus_total: 1,
                    gpus_used: 0,
                },
                t(0, 0, 1) + chrono::Duration::seconds(i),
            );
            let now_at = f
                .market_prune_at
                .get(&key)
                .copied()
                .unwrap_or(PRUNE_MARKET_AT_POINTS);
            if now_at != limit {
                limit = now_at;
                prunes += 1;
            }
        }
        // The running lease needs every point since its start: none is
        // dropped, and the open leases were scanned at 1024, 2048, 4096 and
        // 8192 points rather than at each of the 7,169 prices from the
        // 1024th on.
        assert_eq!(f.market[&key].len(), PRUNE_MARKET_AT_POINTS * 8);
        assert_eq!(prunes, 4);
    }

    #[test]
    fn a_reservation_is_billed_each_hour_and_covers_the_reserved_leases_that_fit() {
        let tenant = Uuid::from_u128(7);
        let reservation = Uuid::from_u128(50);
        let mut events = vec![env(EventData::PriceBookPublished(
            rating::default_price_book(t(0, 0, 0)),
        ))];
        events.push(env(EventData::ReservationCommitted(ReservationCommitted {
            reservation_id: reservation,
            tenant_id: tenant,
            gpu_model: fixtures::MODEL.into(),
            zone: "z".into(),
            gpus: 2,
            starts_at: t(10, 0, 0),
            ends_at: t(12, 0, 0),
            requested_by: None,
        })));
        let reserved = |lease: Uuid, start, end| {
            let mut l = lease_events(lease, start, end, EndReason::Stopped);
            if let EventData::LeaseRequested(r) = &mut l[0].data {
                r.tier = Tier::Reserved;
            }
            l
        };
        // Two leases of 2 GPUs at once: the first fits, the second does not.
        let (covered, overflow, after) =
            (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let mut first = reserved(covered, t(11, 0, 0), t(12, 30, 0));
        let first_end = first.pop().unwrap();
        events.extend(first);
        events.extend(reserved(overflow, t(11, 0, 0), t(11, 30, 0)));
        events.push(first_end);
        // Once the first has ended, a third fits again.
        events.extend(reserved(after, t(13, 0, 0), t(13, 30, 0)));

        // The commitment: 2 x 40 GB x 0.35 per hour, whether used or not,
        // only as its term passes.
        assert_eq!(
            charge_until(&mut events, reservation, t(11, 0, 0))
                .iter()
                .map(|c| (c.amount.to_string(), c.reservation_id))
                .collect::<Vec<_>>(),
            vec![("28.00".to_string(), Some(reservation))]
        );
        let rest = charge_until(&mut events, reservation, t(13, 0, 0));
        assert_eq!(total(&rest), "28.00");
        assert!(fold(&events).is_charged(reservation));

        // Covered until the term ends at 12:00, then at basic.
        let charges = charge_until(&mut events, covered, LATER);
        assert!(charges
            .iter()
            .all(|c| c.reservation_id == Some(reservation)));
        assert_eq!(
            charges
                .iter()
                .map(|c| c.amount.to_string())
                .collect::<Vec<_>>(),
            ["0.00", "20.00"]
        );
        let charges = charge_until(&mut events, overflow, LATER);
        assert_eq!(charges[0].reservation_id, None);
        assert_eq!(total(&charges), "20.00");
        // Started after the term: nothing covers it.
        let charges = charge_until(&mut events, after, LATER);
        assert_eq!(
            (charges[0].reservation_id, total(&charges)),
            (None, "20.00".to_string())
        );
    }
}
