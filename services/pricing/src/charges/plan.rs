//! Planning and pricing the charges due: from a lease's facts in the
//! [`ChargingState`], which UTC hours are due and what each costs
//! ([`lh_domain::rating`]), and the bill as events ready to append. Kept
//! apart from the fold so that what is owed reads in one place.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use lh_bus::{Expect, MAX_BATCH_MESSAGES};
use lh_domain::rating::{self, PricePoint};
use lh_events::{Actor, ChargeAccrued, ChargeModel, Envelope, EventData, PriceBookPublished, Tier};
use lh_service::decider::Batch;
use rust_decimal::Decimal;
use uuid::Uuid;

use super::fold::{market_key, ChargingState, LeaseFacts};
use crate::SERVICE;

/// How long after an hour ends its charges are written, by default: a
/// node's report of an end is held to within the node clock skew (30 s) of
/// when the log stored it, and a lost node is declared within seconds, so
/// by then the log says whether the lease ran the whole hour.
pub const DEFAULT_ACCRUAL_GRACE_SECS: i64 = 300;
/// Longest accrual grace accepted: a day.
pub const MAX_ACCRUAL_GRACE_SECS: i64 = 24 * 3600;
/// Most hourly charges one lease gets in one decision pass: a month's.
pub const MAX_CHARGES_PER_LEASE_PER_PASS: usize = 31 * 24;
/// Places of a charge's (informational) average unit price.
const UNIT_PRICE_SCALE: u32 = 6;

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

impl ChargingState {
    /// The market a spot lease is priced on, with the tier's headline
    /// price standing for the time before the market's first price.
    fn market_for(
        &self,
        facts: &LeaseFacts,
        headline: Decimal,
        since: DateTime<Utc>,
    ) -> Vec<PricePoint> {
        let mut points = vec![PricePoint {
            at: DateTime::<Utc>::MIN_UTC,
            price_cny_per_gb_hour: headline,
        }];
        if let (Some(zone), Some(model)) = (&facts.zone, &facts.gpu_model) {
            if let Some(known) = self.market.get(&market_key(zone, model)) {
                // From the point in force at `since` on: the ones before it
                // price no second from `since`, and a long spot lease pins
                // hundreds of them, copied and walked at every pass.
                let in_force = known.partition_point(|p| p.at <= since);
                if in_force > 0 {
                    points.clear();
                }
                points.extend_from_slice(&known[in_force.saturating_sub(1)..]);
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

    /// [`ChargingState::plan`] with the hours before `horizon` due.
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
        let priced = match self.priced(lease_id, facts, first_start, from) {
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
            // The rest in the next passes: one lease's bill never holds
            // up the others, nor sets pricing's memory.
            if charges.len() >= MAX_CHARGES_PER_LEASE_PER_PASS {
                break;
            }
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

    /// For each tenant with open leases that `reckoned` names, what they
    /// cost at `now` beyond their charges in the log (`unbilled`: charges
    /// lag by up to an hour and the accrual grace), and what those running
    /// now cost per hour at the rate they accrue now
    /// (`burn_rate_cny_per_hour`). One pass over the open leases, whatever
    /// the number of tenants.
    pub fn running_costs(
        &self,
        now: DateTime<Utc>,
        reckoned: impl Fn(Uuid) -> bool,
    ) -> HashMap<Uuid, crate::balances::RunningCost> {
        let mut costs: HashMap<Uuid, crate::balances::RunningCost> = HashMap::new();
        let an_hour_on = now + chrono::Duration::hours(1);
        for (lease_id, facts) in &self.leases {
            let Some(tenant_id) = facts.tenant_id else {
                continue;
            };
            if facts.commitment || !reckoned(tenant_id) {
                continue;
            }
            let until = facts.billable_end().unwrap_or(now).min(now);
            let intervals = facts.intervals(until);
            let Some(first_start) = intervals.iter().map(|r| r.start).min() else {
                continue;
            };
            let from = facts
                .charged_to
                .map_or(first_start, |to| to.max(first_start));
            let Ok(priced) = self.priced(*lease_id, facts, first_start, from) else {
                continue;
            };
            let cost = costs.entry(tenant_id).or_default();
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

    /// What `facts` are priced on from `since`: the lease's book, charge
    /// model and market, or the plan when they are not all known.
    fn priced<'a>(
        &'a self,
        lease_id: Uuid,
        facts: &LeaseFacts,
        first_start: DateTime<Utc>,
        since: DateTime<Utc>,
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
            (ChargeModel::Market, _) => {
                (ChargeModel::Market, self.market_for(facts, headline, since))
            }
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
