//! Charging on the decide loop: [`Charges`] applies stored events to the
//! [`ChargingState`] (node times held to the log's clock by the loop), plans
//! the charges due once caught up, and keeps the shelf the price book,
//! quote, reservation and balance RPCs read.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::{Bus, BusError, Expect};
use lh_domain::rating;
use lh_events::{subject, Actor, Envelope, EventData};
use lh_service::decider::{Batch, Decider, Pace};
use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;
use uuid::Uuid;

use super::fold::{ChargingState, QUOTE_KEPT_AFTER_EXPIRY};
use super::plan::{bill_batches, Plan};
use super::storage::{storage_batches, StoragePlan};
use crate::shelf::SharedPricingShelf;
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
    subject::STORAGE_ALL,
];
/// A feed silent this long has delivered everything there is.
const QUIET: Duration = Duration::from_millis(300);
/// Wait before retrying a publish that failed for a reason other than a conflict.
const RETRY_AFTER: Duration = Duration::from_secs(1);

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

/// Charging on the decide loop: folds the log and, once caught up, charges
/// every lease that ended and has no charges yet.
#[derive(Default)]
pub struct Charges {
    pub fold: ChargingState,
    warned_no_book: bool,
    /// How far a node's timestamps may be from the log server's clock.
    node_clock_skew: chrono::Duration,
    /// How long after an hour ends it is charged.
    grace: chrono::Duration,
    /// The horizon of the last pass that looked at every open lease.
    looked_at_horizon: Option<DateTime<Utc>>,
    shelf: SharedPricingShelf,
    /// A prepaid balance covering less than this at its burn rate is low.
    balance_warn_secs: u64,
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
            balance_warn_secs: crate::balances::DEFAULT_BALANCE_WARN_SECS,
            ..Self::default()
        }
    }

    /// Warns of a prepaid balance that covers less than `seconds`.
    pub fn with_balance_warn_secs(mut self, seconds: u64) -> Self {
        self.balance_warn_secs = seconds;
        self
    }

    /// Each prepaid tenant's balance at `now`, and the running cost of each
    /// postpaid one the balance RPC was asked about lately, for that RPC;
    /// and the writes the prepaid balances call for.
    fn balance_decisions(&self, now: DateTime<Utc>) -> Vec<Batch> {
        let mut decisions = Vec::new();
        let mut views = HashMap::new();
        let watched: std::collections::HashSet<Uuid> = self
            .shelf
            .read()
            .expect("shelf lock")
            .watched_postpaid
            .keys()
            .copied()
            .collect();
        let balances = &self.fold.balances;
        let mut costs = self.fold.running_costs(now, |tenant| {
            balances.get(tenant).is_some() || watched.contains(&tenant)
        });
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
                self.balance_warn_secs,
                now,
            ));
        }
        // Postpaid tenants with open leases: no balance to run out, but
        // what they spend is theirs to see all the same.
        for (tenant_id, cost) in costs {
            views.insert(
                tenant_id,
                crate::balances::postpaid_running(tenant_id, &cost),
            );
        }
        let published = {
            let mut shelf = self.shelf.write().expect("shelf lock");
            shelf.balances = views;
            shelf.balances_published.clone()
        };
        published.notify_waiters();
        decisions
    }

    /// The books this fold keeps up to date for others to read.
    pub fn shelf(&self) -> SharedPricingShelf {
        self.shelf.clone()
    }

    /// Folds a stored event, a restatement as the events it carries (each
    /// held to the log when it was stored, as the loop holds them).
    fn apply_stored_event(&mut self, sequence: u64, envelope: &Envelope) {
        if let Some(history) = envelope.data.restated_history() {
            if self.fold.needs_history(&envelope.data) {
                for e in history {
                    self.apply_stored(e.sequence, e.stored_at, &e.envelope);
                }
            }
            self.fold.sequence = self.fold.sequence.max(sequence);
            return;
        }
        self.fold.apply(sequence, envelope);
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

    fn node_clock_skew(&self) -> Option<chrono::Duration> {
        Some(self.node_clock_skew)
    }

    fn apply_stored(&mut self, sequence: u64, _stored_at: DateTime<Utc>, envelope: &Envelope) {
        if matches!(
            envelope.data,
            EventData::PriceBookPublished(_) | EventData::PriceBookRestated(_)
        ) {
            self.fold.book_sequence = self.fold.book_sequence.max(sequence);
        }
        self.apply_stored_event(sequence, envelope);
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
        for tenant_id in self.fold.storage_to_look_at() {
            match self.fold.plan_storage(tenant_id) {
                StoragePlan::Nothing => {}
                StoragePlan::Publish(bill) => {
                    decisions.extend(storage_batches(&bill, now));
                    self.fold.touch_storage(tenant_id);
                }
                StoragePlan::WaitForBook => {
                    if !self.warned_no_book {
                        tracing::warn!(%tenant_id, "no price book in the log yet; storage charges wait");
                        self.warned_no_book = true;
                    }
                    self.fold.touch_storage(tenant_id);
                }
                // Looked at again with the next measurement.
                StoragePlan::Unbillable(why) => {
                    tracing::error!(%tenant_id, %why, "a tenant's storage cannot be billed");
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
            let (tenant_id, tier, amount) = match &envelope.data {
                EventData::ChargeAccrued(c) => (c.tenant_id, c.tier.as_str(), c.amount),
                EventData::StorageChargeAccrued(c) => (c.tenant_id, "storage", c.amount),
                _ => continue,
            };
            // Amounts are whole fen (the rounding rule), so the count is
            // exact; a counter cannot go down, and a charge never does.
            let fen = (amount * Decimal::ONE_HUNDRED).round().to_u64();
            metrics::counter!("lh_charged_fen_total", "tier" => tier).increment(fen.unwrap_or(0));
            let own = self.spend_series.contains(&tenant_id)
                || (self.spend_series.len() < MAX_SPEND_SERIES_TENANTS
                    && self.spend_series.insert(tenant_id));
            let tenant = if own {
                tenant_id.to_string()
            } else {
                "other".to_string()
            };
            metrics::counter!("lh_tenant_charged_fen_total", "tenant" => tenant)
                .increment(fen.unwrap_or(0));
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
