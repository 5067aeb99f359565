//! What-if billing: a past month's charges priced again on another price
//! book, per tenant, with the same engine as real billing
//! (`lh_domain::rating`).
//!
//! It re-rates the month's `charge.accrued` events, not the leases: a
//! charge is a fact on the log that already says what the engine needs.
//! Its `age_seconds` (the lease's billable age at `to`) and
//! `billed_seconds` give the billable age it covers, `age_seconds -
//! billed_seconds .. age_seconds`, so a ladder (`graduated`), a `volume`
//! or a `package` price is applied at the age the lease really had, even
//! for a lease that started in an earlier month; and its amount under the
//! other book is `round(C'(to)) - round(C'(from))`, the telescoping rule
//! of real billing, so a lease's re-rated charges add up to exactly what
//! the other book would have charged it in the month. Billing the month's
//! charges keeps the work bounded by the month (one pass, memory by
//! tenant, not by lease), where replaying the leases would need their
//! whole history.
//!
//! What the book does not decide is left as billed:
//! * a spot charge when the other book prices spot by the `market`: the
//!   clearing prices the market published are the same whatever the book
//!   (a book that prices spot by age re-rates it like any other tier);
//! * a `reserved` lease's hours covered by a reservation: the reservation's
//!   commitment (a charge whose `reservation_id` is its own `lease_id`) is
//!   what is billed for them, and it is re-rated at the other book's
//!   reserved tier. A `reserved` lease no reservation covers is re-rated at
//!   the basic tier, as billing prices it.
//!
//! Pricing feeds it the month's rows of its `invoice_lines` projection
//! (`projection::what_if`), each rebuilt into the `charge.accrued` it came
//! from; a row projected without its age gets the lease's billed seconds
//! so far, over every month, which is that age: a lease ages only by the
//! seconds it is billed.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use lh_domain::rating::{self, BookError, Interval};
use lh_events::{ChargeAccrued, ChargeModel, PriceBookPublished, Tier};
use rust_decimal::Decimal;
use uuid::Uuid;

pub use lh_rpc::what_if::{
    TenantDifference, WhatIfReport, MAX_WHAT_IF_CHARGES, MAX_WHAT_IF_TENANTS,
};

/// Why a what-if cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhatIfError {
    #[error("book: {0}")]
    Book(#[from] BookError),
    #[error("period: {0:?} is not a month (YYYY-MM)")]
    Period(String),
    #[error("book: it has no price for tier {0}")]
    NoPrice(&'static str),
    #[error("the month has more than {0} tenants or charges; narrow it")]
    TooLarge(u64),
}

impl WhatIfError {
    /// The field of the request at fault (a path into
    /// `lh_rpc::what_if::WhatIfRequest`) and why.
    pub fn refusal(&self) -> (String, String) {
        match self {
            WhatIfError::Book(e) => (format!("book.{}", e.field), e.detail.clone()),
            WhatIfError::NoPrice(_) => ("book.tiers".to_string(), self.to_string()),
            WhatIfError::Period(_) | WhatIfError::TooLarge(_) => {
                ("period".to_string(), self.to_string())
            }
        }
    }
}

/// A what-if in progress: add the month's charges, then read the report.
#[derive(Debug)]
pub struct WhatIf {
    book: PriceBookPublished,
    period: String,
    charges_read: u64,
    tenants: BTreeMap<Uuid, TenantDifference>,
}

/// Where the synthetic run a charge's ages are laid on starts: only
/// billable age matters to the models re-rated here.
fn age_origin() -> DateTime<Utc> {
    DateTime::<Utc>::UNIX_EPOCH
}

/// `round(C(age))` of a lease of `vram_gb` under `model`, by billable age.
fn rounded_cost_at_age(
    model: &ChargeModel,
    vram_gb: u32,
    age_seconds: u64,
    to_age: u64,
) -> Decimal {
    let origin = age_origin();
    let run = [Interval {
        start: origin,
        end: origin + Duration::seconds(to_age as i64),
    }];
    rating::cumulative_cost(
        model,
        &[],
        vram_gb,
        &run,
        origin + Duration::seconds(age_seconds as i64),
    )
    .rounded_cny()
}

impl WhatIf {
    /// A what-if of `period` (`YYYY-MM`) on `book`, which must be a valid
    /// book (`lh_domain::rating::validate_book`), or a valid draft with no
    /// version (`lh_rpc::what_if::check_book`).
    pub fn new(book: PriceBookPublished, period: &str) -> Result<Self, WhatIfError> {
        lh_rpc::what_if::check_book(&book)?;
        if crate::ledger::month_bounds(period).is_none() {
            return Err(WhatIfError::Period(period.to_string()));
        }
        Ok(Self {
            book,
            period: period.to_string(),
            charges_read: 0,
            tenants: BTreeMap::new(),
        })
    }

    /// What `charge` would have cost on the other book.
    pub fn rerated(&self, charge: &ChargeAccrued) -> Result<Decimal, WhatIfError> {
        let priced_as = match (charge.tier, charge.reservation_id) {
            (Tier::Reserved, Some(r)) if r == charge.lease_id => Tier::Reserved,
            // Covered: the commitment pays for it.
            (Tier::Reserved, Some(_)) => return Ok(charge.amount),
            (Tier::Reserved, None) => Tier::Basic,
            (other, _) => other,
        };
        let model = rating::tier_model(&self.book, priced_as)
            .ok_or(WhatIfError::NoPrice(priced_as.as_str()))?;
        if matches!(model, ChargeModel::Market) {
            return Ok(charge.amount);
        }
        // A charge written before hourly accrual covers its lease from
        // its first second.
        let age_to = charge.age_seconds.unwrap_or(charge.billed_seconds);
        let age_from = age_to.saturating_sub(charge.billed_seconds);
        let mut amount = rounded_cost_at_age(&model, charge.vram_gb, age_to, age_to)
            - rounded_cost_at_age(&model, charge.vram_gb, age_from, age_to);
        amount.rescale(2);
        Ok(amount)
    }

    /// Adds one charge of the log; charges of other months are skipped.
    pub fn add(&mut self, charge: &ChargeAccrued) -> Result<(), WhatIfError> {
        if charge.period != self.period {
            return Ok(());
        }
        self.charges_read += 1;
        if self.charges_read > MAX_WHAT_IF_CHARGES {
            return Err(WhatIfError::TooLarge(MAX_WHAT_IF_CHARGES));
        }
        let what_if = self.rerated(charge)?;
        if !self.tenants.contains_key(&charge.tenant_id)
            && self.tenants.len() >= MAX_WHAT_IF_TENANTS
        {
            return Err(WhatIfError::TooLarge(MAX_WHAT_IF_TENANTS as u64));
        }
        let row = self
            .tenants
            .entry(charge.tenant_id)
            .or_insert_with(|| TenantDifference::new(charge.tenant_id));
        row.charges += 1;
        row.current_cny += charge.amount;
        row.what_if_cny += what_if;
        row.difference_cny = row.what_if_cny - row.current_cny;
        Ok(())
    }

    /// Every tenant charged in the month, by tenant id, and the totals.
    pub fn report(self) -> WhatIfReport {
        WhatIfReport::new(
            self.period,
            self.book.version,
            self.tenants.into_values().collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use lh_events::PriceStep;
    use rust_decimal_macros::dec;

    fn at(day: u32, hour: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, day, hour, 0, 0).unwrap()
    }

    /// An hourly charge of a 40 GB lease whose billable age reaches
    /// `age_hours` at its end.
    fn charge(tier: Tier, age_hours: u64, amount: Decimal) -> ChargeAccrued {
        let to = at(10, age_hours as u32);
        ChargeAccrued {
            charge_id: Uuid::new_v4(),
            tenant_id: Uuid::from_u128(1),
            lease_id: Uuid::from_u128(2),
            period: "2026-11".into(),
            tier,
            gpus: 1,
            vram_gb: 40,
            from: to - Duration::hours(1),
            to,
            billed_seconds: 3600,
            unit_price_cny_per_gb_hour: dec!(0.5),
            amount,
            currency: "CNY".into(),
            price_book_version: 1,
            age_seconds: Some(age_hours * 3600),
            priced_gb_seconds: None,
            reservation_id: None,
        }
    }

    /// The default book with basic at 0.6, spot flat at 0.3 when `spot_flat`.
    fn other_book(spot_flat: bool) -> PriceBookPublished {
        let mut book = rating::default_price_book(at(1, 0));
        book.version = 9;
        for t in &mut book.tiers {
            let flat = |p| {
                Some(ChargeModel::Flat {
                    price_cny_per_gb_hour: p,
                })
            };
            match t.tier {
                Tier::Basic => (t.price_cny_per_gb_hour, t.model) = (dec!(0.6), flat(dec!(0.6))),
                Tier::Spot if spot_flat => {
                    (t.price_cny_per_gb_hour, t.model) = (dec!(0.3), flat(dec!(0.3)))
                }
                Tier::Reserved => (t.price_cny_per_gb_hour, t.model) = (dec!(0.4), flat(dec!(0.4))),
                _ => {}
            }
        }
        book
    }

    #[test]
    fn a_flat_tier_is_priced_at_the_other_books_price() {
        let w = WhatIf::new(other_book(false), "2026-11").unwrap();
        // 40 GB x 1 h x 0.6.
        assert_eq!(
            w.rerated(&charge(Tier::Basic, 1, dec!(20.00))).unwrap(),
            dec!(24.00)
        );
        // Reserved with no reservation is billed as basic.
        assert_eq!(
            w.rerated(&charge(Tier::Reserved, 5, dec!(20.00))).unwrap(),
            dec!(24.00)
        );
    }

    #[test]
    fn a_ladder_is_applied_at_the_age_the_lease_had() {
        let mut book = other_book(false);
        let ladder = vec![
            PriceStep {
                from_hour: 0,
                price_cny_per_gb_hour: dec!(3.0),
            },
            PriceStep {
                from_hour: 2,
                price_cny_per_gb_hour: dec!(1.0),
            },
        ];
        book.tiers[1].model = Some(ChargeModel::Graduated { steps: ladder });
        book.tiers[1].price_cny_per_gb_hour = dec!(3.0);
        let w = WhatIf::new(book, "2026-11").unwrap();
        // Hours 1, 2 at 3.0 (120 each), hours 3..5 at 1.0 (40 each): the
        // age comes from the charge, not from where it lies in the month.
        let amounts: Vec<Decimal> = (1..=5)
            .map(|h| w.rerated(&charge(Tier::Performance, h, dec!(80))).unwrap())
            .collect();
        assert_eq!(
            amounts,
            vec![dec!(120), dec!(120), dec!(40), dec!(40), dec!(40)]
        );
        // A charge covering hours 2..4 at once (an hour suspended in between
        // does not age the lease): 120 + 40.
        let mut two = charge(Tier::Performance, 3, dec!(0));
        two.billed_seconds = 7200;
        assert_eq!(w.rerated(&two).unwrap(), dec!(160.00));
    }

    #[test]
    fn a_split_never_changes_a_leases_total() {
        // A volume price on an odd size: hourly pieces telescope to the
        // cost of the whole.
        let mut book = other_book(false);
        let steps = vec![
            PriceStep {
                from_hour: 0,
                price_cny_per_gb_hour: dec!(0.333333),
            },
            PriceStep {
                from_hour: 3,
                price_cny_per_gb_hour: dec!(0.111111),
            },
        ];
        book.tiers[1].model = Some(ChargeModel::Volume { steps });
        let w = WhatIf::new(book.clone(), "2026-11").unwrap();
        let mut pieces = Decimal::ZERO;
        for h in 1..=7 {
            let mut c = charge(Tier::Performance, h, dec!(0));
            c.vram_gb = 7;
            pieces += w.rerated(&c).unwrap();
        }
        let model = rating::tier_model(&book, Tier::Performance).unwrap();
        assert_eq!(pieces, rounded_cost_at_age(&model, 7, 7 * 3600, 7 * 3600));
    }

    #[test]
    fn spot_keeps_the_markets_price_unless_the_book_prices_it() {
        let spot = charge(Tier::Spot, 1, dec!(9.99));
        let market = WhatIf::new(other_book(false), "2026-11").unwrap();
        assert_eq!(market.rerated(&spot).unwrap(), dec!(9.99));
        let flat = WhatIf::new(other_book(true), "2026-11").unwrap();
        assert_eq!(flat.rerated(&spot).unwrap(), dec!(12.00));
    }

    #[test]
    fn a_reservation_bills_its_commitment_not_its_covered_leases() {
        let w = WhatIf::new(other_book(false), "2026-11").unwrap();
        let mut commitment = charge(Tier::Reserved, 1, dec!(14.00));
        commitment.reservation_id = Some(commitment.lease_id);
        assert_eq!(w.rerated(&commitment).unwrap(), dec!(16.00));
        let mut covered = charge(Tier::Reserved, 1, dec!(0.00));
        covered.reservation_id = Some(Uuid::from_u128(99));
        assert_eq!(w.rerated(&covered).unwrap(), dec!(0.00));
    }

    #[test]
    fn the_report_sums_each_tenant_and_skips_other_months() {
        let mut w = WhatIf::new(other_book(false), "2026-11").unwrap();
        w.add(&charge(Tier::Basic, 1, dec!(20.00))).unwrap();
        w.add(&charge(Tier::Basic, 2, dec!(20.00))).unwrap();
        let mut other_tenant = charge(Tier::Spot, 1, dec!(3.00));
        other_tenant.tenant_id = Uuid::from_u128(5);
        w.add(&other_tenant).unwrap();
        let mut october = charge(Tier::Basic, 1, dec!(20.00));
        october.period = "2026-10".into();
        w.add(&october).unwrap();
        let report = w.report();
        assert_eq!(
            (report.period.as_str(), report.book_version),
            ("2026-11", 9)
        );
        let tenants = &report.tenants;
        assert_eq!(tenants.len(), 2);
        assert_eq!(tenants[0].charges, 2);
        assert_eq!(tenants[0].current_cny, dec!(40.00));
        assert_eq!(tenants[0].what_if_cny, dec!(48.00));
        assert_eq!(tenants[0].difference_cny, dec!(8.00));
        assert_eq!(tenants[1].difference_cny, dec!(0.00));
        assert_eq!(report.charges, 3);
        assert_eq!(report.difference_cny, dec!(8.00));
    }

    #[test]
    fn a_bad_book_or_period_is_refused_naming_the_field() {
        let mut book = other_book(false);
        book.currency = "USD".into();
        assert!(matches!(
            WhatIf::new(book, "2026-11"),
            Err(WhatIfError::Book(e)) if e.field == "currency"
        ));
        let mut steps = other_book(false);
        steps.tiers[1].model = Some(ChargeModel::Graduated { steps: vec![] });
        let refused = WhatIf::new(steps, "2026-11").unwrap_err().refusal();
        assert_eq!(refused.0, "book.tiers[1].model.steps");
        let refused = WhatIf::new(other_book(false), "2026-13").unwrap_err();
        assert!(matches!(refused, WhatIfError::Period(_)));
        assert_eq!(refused.refusal().0, "period");
        // A draft, never published, has no version.
        let mut draft = other_book(false);
        draft.version = 0;
        assert_eq!(
            WhatIf::new(draft, "2026-11").unwrap().report().book_version,
            0
        );
    }
}
