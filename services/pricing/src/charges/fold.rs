//! The charging state folded from stored events: price books, spot
//! markets, the billing facts of each open lease and how far each is
//! charged. It does no I/O and decides nothing, so the decide loop, a
//! snapshot restore and the tests all build it the same way.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use chrono::{DateTime, Utc};
use lh_domain::rating::{self, Accrued, Interval, PricePoint};
use lh_events::{
    ChargeAccrued, EndReason, Envelope, EventData, PriceBookPublished, ReservationCommitted, Tier,
};
use rust_decimal::Decimal;
use uuid::Uuid;

/// Most spot price points kept per (zone, GPU model) before the ones no
/// open lease needs are dropped.
pub(super) const PRUNE_MARKET_AT_POINTS: usize = 1024;
/// How long after it expires a quote is remembered: far longer than a
/// request made with it takes to reach the log.
pub const QUOTE_KEPT_AFTER_EXPIRY: chrono::Duration = chrono::Duration::days(1);

/// What the log says about one open lease, as far as billing cares.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct LeaseFacts {
    pub(super) tenant_id: Option<Uuid>,
    pub(super) tier: Option<Tier>,
    pub(super) gpu_model: Option<String>,
    pub(super) zone: Option<String>,
    pub(super) gpus: Option<u32>,
    pub(super) vram_gb_per_gpu: Option<u32>,
    /// The book the lease is billed on, chosen at its first start.
    pub(super) book_version: Option<u32>,
    /// The node-agent's `lease.started.started_at` of the current run.
    pub(super) started_at: Option<DateTime<Utc>>,
    /// Closed runs with time not yet charged: ended at a notice, a
    /// suspension, a lost node or the lease's end.
    pub(super) runs: Vec<Interval>,
    /// The event the next charges are caused by: the last `lease.started`,
    /// then `lease.ended`.
    pub(super) cause: Option<Envelope>,
    /// Whether `lease.ended` was read: no run opens any more.
    pub(super) ended: bool,
    /// The cumulative cost up to `charged_to`, as the last charge says.
    pub(super) accrued: Accrued,
    /// The `to` of the lease's last charge.
    pub(super) charged_to: Option<DateTime<Utc>>,
    /// Stream sequence of the lease's last charge (0: none yet).
    pub(super) last_charge_sequence: u64,
    /// Not a lease but a reservation's commitment, billed whether used or
    /// not, hour by hour as its term passes.
    #[serde(default)]
    pub(super) commitment: bool,
    /// The reservation covering this `reserved` lease, until when.
    #[serde(default)]
    pub(super) covered_by: Option<(Uuid, DateTime<Utc>)>,
    /// Someone asked for the lease to stop: an exhausted balance need not.
    #[serde(default)]
    pub(super) stop_requested: bool,
    /// The version the lease's quote names: its book, chosen at request.
    #[serde(default)]
    pub(super) quoted_version: Option<u32>,
    /// A gang's members that have not started their part yet: its run
    /// starts when the last one does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) members_to_start: Vec<String>,
}

impl LeaseFacts {
    /// Every billable interval not yet wholly charged; the open run counts
    /// up to `now`.
    pub(super) fn intervals(&self, now: DateTime<Utc>) -> Vec<Interval> {
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
    pub(super) fn billable_end(&self) -> Option<DateTime<Utc>> {
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

/// Most charged leases the fold remembers (see `ChargingState::charged`).
pub const MAX_REMEMBERED_CHARGED_LEASES: usize = 100_000;

/// Rating state folded from the log.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ChargingState {
    /// Every price book version seen, sorted by version.
    pub(super) books: Vec<PriceBookPublished>,
    /// Open leases: requested and not yet wholly charged.
    pub(super) leases: HashMap<Uuid, LeaseFacts>,
    /// Spot prices per `(zone, gpu_model)`, by `at`; the points before what
    /// an open lease still needs are dropped.
    pub(super) market: HashMap<String, Vec<PricePoint>>,
    /// Per market, how many points it may hold before the next prune. A
    /// long spot lease pins its market's old points; were the prune tried
    /// at every new price it would scan every open lease each time, so
    /// after a prune the market may grow to twice what it kept first.
    #[serde(skip)]
    pub(super) market_prune_at: HashMap<String, usize>,
    /// Leases wholly charged (or never billable), the newest
    /// [`MAX_REMEMBERED_CHARGED_LEASES`] of them: an event that comes for
    /// a lease after its charges is a late repeat, and a year of leases
    /// must not stay in memory.
    pub(super) charged: HashSet<Uuid>,
    /// `charged` in the order its leases were charged, oldest first.
    pub(super) charged_order: VecDeque<Uuid>,
    /// Leases whose facts changed since the last full look at them.
    touched: BTreeSet<Uuid>,
    /// Reservations whose commitment is not yet wholly charged, with the
    /// GPUs of the leases they cover now.
    #[serde(default)]
    pub(super) reservations: HashMap<Uuid, (ReservationCommitted, u32)>,
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
    pub(super) quotes: HashMap<Uuid, lh_events::QuoteIssued>,
    /// Each tenant's object storage, by tenant: its measurements not yet
    /// wholly charged and where its storage charges stand.
    #[serde(default)]
    pub(super) storage: HashMap<Uuid, super::storage_facts::StorageFacts>,
    /// Tenants whose storage facts changed since they were last looked at.
    #[serde(default)]
    pub(super) storage_touched: BTreeSet<Uuid>,
}

pub(super) fn market_key(zone: &str, gpu_model: &str) -> String {
    format!("{zone}/{gpu_model}")
}

impl ChargingState {
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
                    l.gpus = Some(e.gpu_count() as u32);
                    l.members_to_start = e.members.iter().map(|m| m.node_id.clone()).collect();
                    // A fractional lease is billed by its share's VRAM.
                    let share = e.gpus.first().and_then(|g| g.vram_gb);
                    l.vram_gb_per_gpu = Some(share.unwrap_or(e.vram_gb_per_gpu));
                    l.zone = Some(e.zone.clone());
                }
            }
            EventData::LeaseStarted(e) => {
                // A gang runs, and is billed, once every member does.
                if let Some(l) = self.open(e.lease_id) {
                    if !l.members_to_start.is_empty() {
                        l.members_to_start.retain(|n| *n != e.node_id);
                        if !l.members_to_start.is_empty() {
                            return;
                        }
                    }
                }
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
            EventData::StorageMeasured(m) => self.storage_measured(m, envelope),
            EventData::StorageErased(e) => self.storage_erased(e, envelope),
            EventData::StorageChargeAccrued(c) => {
                self.balances.apply(sequence, &envelope.data);
                self.storage_charge_read(sequence, c)
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

    pub(super) fn price_set(&mut self, p: &lh_events::SpotPriceSet, at: DateTime<Utc>) {
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
