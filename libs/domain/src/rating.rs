//! What a lease costs. Pure: the lease's billable intervals (the
//! node-agent's own timestamps), the price book and the market's prices come
//! in as arguments.
//!
//! # The rounding rule (documented here and only here)
//!
//! * **Seconds.** A billable interval `[start, end)` is billed in whole
//!   seconds counted from `start`, the last partial second rounded up:
//!   `ceil((end - start) / 1 s)` ([`billed_seconds`]). Second `k` of the
//!   interval starts at `start + k s`; it belongs to the UTC hour (and so
//!   the month) it starts in, and a market price applies to it when it is
//!   in force at that instant.
//! * **Cumulative cost.** `C(t)` is the exact cost of a lease's billable
//!   seconds that start before `t`: a [`ChargeModel`] applied to the lease's
//!   VRAM and its billable age (or, for `market`, to each second's price).
//!   It is carried exactly as [`Accrued::priced_gb_seconds`] (price per
//!   GB-hour x GB x seconds, sums and products only), and
//!   `C = priced_gb_seconds / 3600`.
//! * **Rounding.** [`round_amount`]: 2 places (fen), half away from zero,
//!   applied to `C(t)` only, never to a piece of it.
//! * **Charges.** A charge over `from..to` is `round(C(to)) - round(C(from))`
//!   ([`Accrued::amount_since`]). However a lease's time is split, its
//!   charges add up to exactly `round(C(end))`, and each is within one fen
//!   of the exact cost of its piece. A charge can be negative where a
//!   price falls with age (`volume`).
//! * An invoice total is the sum of its charges.

use chrono::{DateTime, Datelike, TimeZone, Utc};
use lh_events::{
    derived_id, ChargeAccrued, ChargeModel, PriceBookPublished, PriceStep, Tier, TierPrice,
};
use rust_decimal::{Decimal, RoundingStrategy};
use uuid::Uuid;

pub const CURRENCY: &str = "CNY";

/// Decimal places of a billed amount (fen).
pub const AMOUNT_SCALE: u32 = 2;
const MICROS_PER_SECOND: i64 = 1_000_000;

/// The version the default book publishes.
pub const DEFAULT_BOOK_VERSION: u32 = 1;
/// Basic: CNY per GB of VRAM per hour.
pub const BASIC_CNY_PER_GB_HOUR: Decimal = Decimal::from_parts(5, 0, 0, false, 1);
/// Spot while the market has published no price for a (zone, model).
pub const SPOT_FALLBACK_CNY_PER_GB_HOUR: Decimal = Decimal::from_parts(2, 0, 0, false, 1);
/// Reserved: the commitment's price, 30 % under basic (a month's
/// commitment is paid whether used or not, so it is sold cheaper than the
/// same hours on demand; 30 % is within what clouds give for a
/// one-month-to-one-year commitment).
pub const RESERVED_CNY_PER_GB_HOUR: Decimal = Decimal::from_parts(35, 0, 0, false, 2);

/// The performance ladder: 2.0 for the first 3 h of billable age, 1.6 up
/// to 6 h, 1.2 from then on.
pub fn performance_ladder() -> Vec<PriceStep> {
    [(0, 20), (3, 16), (6, 12)]
        .into_iter()
        .map(|(from_hour, tenths)| PriceStep {
            from_hour,
            price_cny_per_gb_hour: Decimal::new(tenths, 1),
        })
        .collect()
}

/// The default book's storage price: 0.12 CNY per GB-month, the list price
/// of standard object storage at China's large clouds.
pub const DEFAULT_STORAGE_CNY_PER_GB_MONTH: rust_decimal::Decimal =
    rust_decimal::Decimal::from_parts(12, 0, 0, false, 2);

/// The book pricing publishes when the log holds none.
pub fn default_price_book(effective_from: DateTime<Utc>) -> PriceBookPublished {
    let flat = |price| {
        Some(ChargeModel::Flat {
            price_cny_per_gb_hour: price,
        })
    };
    PriceBookPublished {
        version: DEFAULT_BOOK_VERSION,
        currency: CURRENCY.to_string(),
        effective_from,
        tiers: vec![
            TierPrice {
                tier: Tier::Basic,
                price_cny_per_gb_hour: BASIC_CNY_PER_GB_HOUR,
                model: flat(BASIC_CNY_PER_GB_HOUR),
            },
            TierPrice {
                tier: Tier::Performance,
                price_cny_per_gb_hour: Decimal::new(20, 1),
                model: Some(ChargeModel::Graduated {
                    steps: performance_ladder(),
                }),
            },
            TierPrice {
                tier: Tier::Spot,
                price_cny_per_gb_hour: SPOT_FALLBACK_CNY_PER_GB_HOUR,
                model: Some(ChargeModel::Market),
            },
            TierPrice {
                tier: Tier::Reserved,
                price_cny_per_gb_hour: RESERVED_CNY_PER_GB_HOUR,
                model: flat(RESERVED_CNY_PER_GB_HOUR),
            },
        ],
        storage_cny_per_gb_month: Some(DEFAULT_STORAGE_CNY_PER_GB_MONTH),
        requested_by: None,
    }
}

/// Most tiers a book may price, and most steps of one ladder.
pub const MAX_BOOK_TIERS: usize = Tier::ALL.len();
pub const MAX_LADDER_STEPS: usize = 32;
/// Highest price a book may set, CNY per GB-hour (or per GB-package): a
/// typo of several orders of magnitude is refused, not billed.
pub const MAX_PRICE_CNY: Decimal = Decimal::from_parts(10_000, 0, 0, false, 0);
/// Longest package, in hours (a year).
pub const MAX_HOURS_PER_PACKAGE: u32 = 366 * 24;
/// Most decimal places of a price.
pub const MAX_PRICE_SCALE: u32 = 6;

/// Why a price book is refused: the field (a JSON path into the book) and
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {detail}")]
pub struct BookError {
    pub field: String,
    pub detail: String,
}

impl BookError {
    pub fn new(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            detail: detail.into(),
        }
    }
}

/// Whether `price` (CNY per GB-hour or per GB-package) is one a book may
/// set and pricing may multiply without overflow: 0 to [`MAX_PRICE_CNY`],
/// at most [`MAX_PRICE_SCALE`] places.
pub fn check_price(field: &str, price: Decimal) -> Result<(), BookError> {
    if price < Decimal::ZERO {
        return Err(BookError::new(field, "a price must not be negative"));
    }
    if price > MAX_PRICE_CNY {
        return Err(BookError::new(
            field,
            format!("a price must be at most {MAX_PRICE_CNY}"),
        ));
    }
    if price.normalize().scale() > MAX_PRICE_SCALE {
        return Err(BookError::new(
            field,
            format!("a price has at most {MAX_PRICE_SCALE} decimal places"),
        ));
    }
    Ok(())
}

fn check_steps(field: &str, steps: &[PriceStep]) -> Result<(), BookError> {
    if steps.is_empty() || steps.len() > MAX_LADDER_STEPS {
        return Err(BookError::new(
            field,
            format!("a ladder has 1 to {MAX_LADDER_STEPS} steps"),
        ));
    }
    for (i, step) in steps.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if i == 0 && step.from_hour != 0 {
            return Err(BookError::new(
                format!("{at}.from_hour"),
                "the first step starts at hour 0",
            ));
        }
        if i > 0 && step.from_hour <= steps[i - 1].from_hour {
            return Err(BookError::new(
                format!("{at}.from_hour"),
                "steps must start at rising hours",
            ));
        }
        check_price(
            &format!("{at}.price_cny_per_gb_hour"),
            step.price_cny_per_gb_hour,
        )?;
    }
    Ok(())
}

/// Whether a book is one pricing can charge with: a currency of
/// [`CURRENCY`], each tier priced once, ladders starting at hour 0 and
/// rising, prices (storage's too) from 0 to [`MAX_PRICE_CNY`], `market`
/// for spot only.
/// Versions are checked against the log by whoever publishes.
pub fn validate_book(book: &PriceBookPublished) -> Result<(), BookError> {
    if book.version == 0 {
        return Err(BookError::new("version", "versions start at 1"));
    }
    if book.currency != CURRENCY {
        return Err(BookError::new(
            "currency",
            format!("the currency is {CURRENCY}"),
        ));
    }
    if book.tiers.is_empty() || book.tiers.len() > MAX_BOOK_TIERS {
        return Err(BookError::new(
            "tiers",
            format!("a book prices 1 to {MAX_BOOK_TIERS} tiers"),
        ));
    }
    if let Some(price) = book.storage_cny_per_gb_month {
        check_price("storage_cny_per_gb_month", price)?;
    }
    for (i, price) in book.tiers.iter().enumerate() {
        let at = format!("tiers[{i}]");
        if book.tiers[..i].iter().any(|t| t.tier == price.tier) {
            return Err(BookError::new(
                format!("{at}.tier"),
                format!("tier {} is priced twice", price.tier.as_str()),
            ));
        }
        check_price(
            &format!("{at}.price_cny_per_gb_hour"),
            price.price_cny_per_gb_hour,
        )?;
        let model_at = format!("{at}.model");
        match &price.model {
            None => {}
            Some(ChargeModel::Market) if price.tier != Tier::Spot => {
                return Err(BookError::new(
                    format!("{model_at}.kind"),
                    "only the spot tier follows the market",
                ))
            }
            Some(ChargeModel::Market) => {}
            Some(ChargeModel::Flat {
                price_cny_per_gb_hour,
            }) => check_price(
                &format!("{model_at}.price_cny_per_gb_hour"),
                *price_cny_per_gb_hour,
            )?,
            Some(ChargeModel::Graduated { steps }) | Some(ChargeModel::Volume { steps }) => {
                check_steps(&format!("{model_at}.steps"), steps)?
            }
            Some(ChargeModel::Package {
                hours_per_package,
                price_cny_per_gb_package,
            }) => {
                if !(1..=MAX_HOURS_PER_PACKAGE).contains(hours_per_package) {
                    return Err(BookError::new(
                        format!("{model_at}.hours_per_package"),
                        format!("a package is 1 to {MAX_HOURS_PER_PACKAGE} hours"),
                    ));
                }
                check_price(
                    &format!("{model_at}.price_cny_per_gb_package"),
                    *price_cny_per_gb_package,
                )?
            }
        }
    }
    Ok(())
}

/// The headline price of `tier` in `book` (see [`TierPrice`]).
pub fn unit_price(book: &PriceBookPublished, tier: Tier) -> Option<Decimal> {
    book.tiers
        .iter()
        .find(|t| t.tier == tier)
        .map(|t| t.price_cny_per_gb_hour)
}

/// How `tier` is charged in `book`: its model, or flat at its headline
/// price in a book written before charge models.
pub fn tier_model(book: &PriceBookPublished, tier: Tier) -> Option<ChargeModel> {
    let price = book.tiers.iter().find(|t| t.tier == tier)?;
    Some(price.model.clone().unwrap_or(ChargeModel::Flat {
        price_cny_per_gb_hour: price.price_cny_per_gb_hour,
    }))
}

/// A stretch of a lease's time that is billed: from a `lease.started` to
/// its end, a notice, a suspension or a node failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Interval {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// A market price, in force from `at` until the next point. Seconds before
/// the first point are priced at the first point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PricePoint {
    pub at: DateTime<Utc>,
    pub price_cny_per_gb_hour: Decimal,
}

/// A lease's cumulative cost up to some instant: its billable age and its
/// exact cost times 3600.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Accrued {
    pub age_seconds: u64,
    pub priced_gb_seconds: Decimal,
}

impl Accrued {
    /// `C(t)`, exact.
    pub fn exact_cny(&self) -> Decimal {
        self.priced_gb_seconds / Decimal::from(SECONDS_PER_HOUR)
    }

    /// `round(C(t))`.
    pub fn rounded_cny(&self) -> Decimal {
        round_amount(self.exact_cny())
    }

    /// The charge from `before` to here: `round(C(to)) - round(C(from))`.
    pub fn amount_since(&self, before: &Accrued) -> Decimal {
        let mut amount = self.rounded_cny() - before.rounded_cny();
        amount.rescale(AMOUNT_SCALE);
        amount
    }
}

const SECONDS_PER_HOUR: u64 = 3600;

/// Seconds `[k0, k1)` of `run` (second `k` starts at `run.start + k s`)
/// whose start lies in `[from, to)`.
fn seconds_within(run: &Interval, from: DateTime<Utc>, to: DateTime<Utc>) -> (u64, u64) {
    let total = billed_seconds(run.start, run.end);
    let k0 = billed_seconds(run.start, from).min(total);
    let k1 = billed_seconds(run.start, to).min(total);
    (k0, k1.max(k0))
}

/// The cost of a billable age under an age-based model, times 3600.
fn priced_by_age(model: &ChargeModel, vram_gb: u32, age_seconds: u64) -> Decimal {
    let gb = Decimal::from(vram_gb);
    let age = Decimal::from(age_seconds);
    match model {
        ChargeModel::Flat {
            price_cny_per_gb_hour,
        } => *price_cny_per_gb_hour * gb * age,
        ChargeModel::Graduated { steps } => {
            let mut priced = Decimal::ZERO;
            for (i, step) in steps.iter().enumerate() {
                let from = u64::from(step.from_hour) * SECONDS_PER_HOUR;
                let until = steps.get(i + 1).map_or(u64::MAX, |next| {
                    u64::from(next.from_hour) * SECONDS_PER_HOUR
                });
                let within = age_seconds.min(until).saturating_sub(from);
                priced += step.price_cny_per_gb_hour * gb * Decimal::from(within);
            }
            priced
        }
        ChargeModel::Volume { steps } => {
            let reached = steps
                .iter()
                .rev()
                .find(|s| u64::from(s.from_hour) * SECONDS_PER_HOUR <= age_seconds)
                .or(steps.first());
            reached.map_or(Decimal::ZERO, |s| s.price_cny_per_gb_hour * gb * age)
        }
        ChargeModel::Package {
            hours_per_package,
            price_cny_per_gb_package,
        } => {
            let package_seconds = u64::from((*hours_per_package).max(1)) * SECONDS_PER_HOUR;
            let packages = age_seconds.div_ceil(package_seconds);
            *price_cny_per_gb_package
                * gb
                * Decimal::from(packages)
                * Decimal::from(SECONDS_PER_HOUR)
        }
        ChargeModel::Market => Decimal::ZERO,
    }
}

/// Market seconds `[k0, k1)` of a run starting at `start`, each at the
/// price in force when it starts, times 3600.
fn priced_by_market(
    points: &[PricePoint],
    vram_gb: u32,
    start: DateTime<Utc>,
    (k0, k1): (u64, u64),
) -> Decimal {
    let gb = Decimal::from(vram_gb);
    let mut priced = Decimal::ZERO;
    for (i, point) in points.iter().enumerate() {
        // The seconds whose start lies in this point's time.
        let first = if i == 0 {
            0
        } else {
            billed_seconds(start, point.at)
        };
        let until = points
            .get(i + 1)
            .map_or(u64::MAX, |next| billed_seconds(start, next.at));
        let seconds = k1.min(until).saturating_sub(k0.max(first));
        priced += point.price_cny_per_gb_hour * gb * Decimal::from(seconds);
    }
    priced
}

/// The lease's cost accrued from `before` (its state at `from`) to `to`:
/// the seconds of `runs` that start in `[from, to)` added to it. `market`
/// (sorted by `at`) prices a `market` model and is not read otherwise.
pub fn accrue(
    model: &ChargeModel,
    market: &[PricePoint],
    vram_gb: u32,
    before: Accrued,
    runs: &[Interval],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Accrued {
    let mut age_seconds = before.age_seconds;
    let mut market_priced = Decimal::ZERO;
    for run in runs {
        let (k0, k1) = seconds_within(run, from, to);
        age_seconds += k1 - k0;
        if matches!(model, ChargeModel::Market) {
            market_priced += priced_by_market(market, vram_gb, run.start, (k0, k1));
        }
    }
    let priced_gb_seconds = match model {
        ChargeModel::Market => before.priced_gb_seconds + market_priced,
        by_age => priced_by_age(by_age, vram_gb, age_seconds),
    };
    Accrued {
        age_seconds,
        priced_gb_seconds,
    }
}

/// `C(t)` of a lease from its first second: [`accrue`] from nothing.
pub fn cumulative_cost(
    model: &ChargeModel,
    market: &[PricePoint],
    vram_gb: u32,
    runs: &[Interval],
    t: DateTime<Utc>,
) -> Accrued {
    accrue(
        model,
        market,
        vram_gb,
        Accrued::default(),
        runs,
        DateTime::<Utc>::MIN_UTC,
        t,
    )
}

/// The id of a lease's charge for the UTC hour starting at `hour`: a
/// replay or a second replica derives the same one.
pub fn hourly_charge_id(lease_id: Uuid, hour: DateTime<Utc>) -> Uuid {
    derived_id(&["charge", &lease_id.to_string(), &hour.to_rfc3339()])
}

/// The start of the UTC hour `at` lies in.
pub fn hour_start(at: DateTime<Utc>) -> DateTime<Utc> {
    let secs = at.timestamp().div_euclid(SECONDS_PER_HOUR as i64) * SECONDS_PER_HOUR as i64;
    DateTime::from_timestamp(secs, 0).expect("an hour start is in range")
}

/// Rounds an exact amount to fen, half away from zero.
pub fn round_amount(exact: Decimal) -> Decimal {
    let mut rounded =
        exact.round_dp_with_strategy(AMOUNT_SCALE, RoundingStrategy::MidpointAwayFromZero);
    // Always print two places ("1.00", not "1.0").
    rounded.rescale(AMOUNT_SCALE);
    rounded
}

/// `ceil(duration / 1 s)`, never negative.
pub fn billed_seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    if to <= from {
        return 0;
    }
    // Too long to count in microseconds: longer than any lease.
    let micros = (to - from)
        .num_microseconds()
        .unwrap_or(i64::MAX - MICROS_PER_SECOND);
    ((micros + MICROS_PER_SECOND - 1) / MICROS_PER_SECOND) as u64
}

/// `YYYY-MM` of an instant.
pub fn period_of(at: DateTime<Utc>) -> String {
    format!("{:04}-{:02}", at.year(), at.month())
}

pub(crate) fn next_month_start(at: DateTime<Utc>) -> DateTime<Utc> {
    let (y, m) = if at.month() == 12 {
        (at.year() + 1, 1)
    } else {
        (at.year(), at.month() + 1)
    };
    Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0)
        .single()
        .expect("first of a month exists")
}

/// One run of a lease on its GPUs. A lease moved to another node (its node
/// was lost) has one segment per run, numbered from 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub lease_id: Uuid,
    pub index: u32,
    pub tenant_id: Uuid,
    pub tier: Tier,
    pub gpus: u32,
    pub vram_gb_per_gpu: u32,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
}

/// The charges of a finished segment at its tier's headline price, one per
/// UTC month it touches: the shape pricing wrote before hourly accrual
/// (without `age_seconds`), which its fold still reads as "this lease is
/// wholly charged". Kept to write such logs (the replay-memory load
/// test); pricing charges with [`accrue`].
pub fn charges(book: &PriceBookPublished, segment: &Segment) -> Vec<ChargeAccrued> {
    let Some(price) = unit_price(book, segment.tier) else {
        return Vec::new();
    };
    let total = billed_seconds(segment.started_at, segment.ended_at);
    let vram_gb = segment.gpus * segment.vram_gb_per_gpu;
    let mut out = Vec::new();
    let mut billed_so_far = 0u64;
    let mut piece_start = segment.started_at;
    while billed_so_far < total {
        let boundary = next_month_start(piece_start);
        // Seconds whose start lies before the boundary.
        let until_boundary = billed_seconds(segment.started_at, boundary);
        let upto = until_boundary.min(total);
        let seconds = upto - billed_so_far;
        let piece_end = boundary.min(segment.ended_at);
        let exact = Decimal::from(vram_gb) * price * Decimal::from(seconds) / Decimal::from(3600);
        let period = period_of(piece_start);
        out.push(ChargeAccrued {
            // The first run keeps the id it always had.
            charge_id: match segment.index {
                0 => derived_id(&["charge", &segment.lease_id.to_string(), &period]),
                i => derived_id(&[
                    "charge",
                    &segment.lease_id.to_string(),
                    &i.to_string(),
                    &period,
                ]),
            },
            tenant_id: segment.tenant_id,
            lease_id: segment.lease_id,
            period,
            tier: segment.tier,
            gpus: segment.gpus,
            vram_gb,
            from: piece_start,
            to: piece_end,
            billed_seconds: seconds,
            unit_price_cny_per_gb_hour: price,
            amount: round_amount(exact),
            currency: book.currency.clone(),
            price_book_version: book.version,
            age_seconds: None,
            priced_gb_seconds: None,
            reservation_id: None,
        });
        billed_so_far = upto;
        piece_start = boundary;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use chrono::Duration;

    fn seg(start: DateTime<Utc>, end: DateTime<Utc>) -> Segment {
        Segment {
            lease_id: Uuid::nil(),
            index: 0,
            tenant_id: Uuid::nil(),
            tier: Tier::Basic,
            gpus: 2,
            vram_gb_per_gpu: 40,
            started_at: start,
            ended_at: end,
        }
    }

    #[test]
    fn two_40gb_gpus_for_90_seconds_cost_one_yuan() {
        let t0 = Utc.with_ymd_and_hms(2026, 12, 2, 10, 0, 0).unwrap();
        let c = charges(
            &default_price_book(t0),
            &seg(t0, t0 + Duration::seconds(90)),
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].billed_seconds, 90);
        assert_eq!(c[0].amount.to_string(), "1.00");
        assert_eq!(c[0].period, "2026-12");
    }

    #[test]
    fn partial_seconds_round_up_and_amounts_round_half_away() {
        let t0 = Utc.with_ymd_and_hms(2026, 12, 2, 10, 0, 0).unwrap();
        let end = t0 + Duration::microseconds(1_000_001);
        assert_eq!(billed_seconds(t0, end), 2);
        // 80 GB × 0.5 × 2 s / 3600 = 0.0222… → 0.02
        assert_eq!(
            charges(&default_price_book(t0), &seg(t0, end))[0]
                .amount
                .to_string(),
            "0.02"
        );
        assert_eq!(round_amount(Decimal::new(125, 3)).to_string(), "0.13");
    }

    #[test]
    fn month_boundary_splits_without_gap_or_overlap() {
        let start =
            Utc.with_ymd_and_hms(2026, 11, 30, 23, 59, 0).unwrap() + Duration::milliseconds(500);
        let end = Utc.with_ymd_and_hms(2026, 12, 1, 0, 1, 0).unwrap();
        let c = charges(&default_price_book(start), &seg(start, end));
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].period, "2026-11");
        assert_eq!(c[1].period, "2026-12");
        assert_eq!(
            c[0].billed_seconds + c[1].billed_seconds,
            billed_seconds(start, end)
        );
        assert_eq!(c[0].billed_seconds, 60);
        assert_ne!(c[0].charge_id, c[1].charge_id);
    }

    fn at(h: i64, s: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 2, 0, 0, 0).unwrap()
            + Duration::hours(h)
            + Duration::seconds(s)
    }

    fn run(from: DateTime<Utc>, to: DateTime<Utc>) -> Interval {
        Interval {
            start: from,
            end: to,
        }
    }

    fn ladder() -> Vec<PriceStep> {
        performance_ladder()
    }

    /// `C` after `age` billable seconds of one run from 00:00, in CNY.
    fn cost_at_age(model: &ChargeModel, vram_gb: u32, age: i64) -> Decimal {
        let runs = [run(at(0, 0), at(0, age))];
        cumulative_cost(model, &[], vram_gb, &runs, at(0, age)).exact_cny()
    }

    fn dec(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    #[test]
    fn flat_is_price_times_gb_times_hours() {
        let basic = tier_model(&default_price_book(at(0, 0)), Tier::Basic).unwrap();
        // 80 GB x 0.5 CNY/GB-h x 90 s = 1.00
        assert_eq!(cost_at_age(&basic, 80, 90), dec("1"));
        assert_eq!(cost_at_age(&basic, 80, 3600), dec("40"));
    }

    #[test]
    fn graduated_prices_each_second_at_its_own_step() {
        let model = ChargeModel::Graduated { steps: ladder() };
        let h = 3600;
        // 1 GB: 2.0 per hour for hours 0-3, 1.6 for 3-6, 1.2 after.
        assert_eq!(
            cost_at_age(&model, 1, 3 * h - 1),
            dec("6") - dec("2") / dec("3600")
        );
        assert_eq!(cost_at_age(&model, 1, 3 * h), dec("6"));
        assert_eq!(
            cost_at_age(&model, 1, 3 * h + 1),
            dec("6") + dec("1.6") / dec("3600")
        );
        assert_eq!(cost_at_age(&model, 1, 6 * h), dec("10.8"));
        assert_eq!(cost_at_age(&model, 1, 7 * h), dec("12.0"));
        // Age counts billable time only: a gap between runs is not age.
        let runs = [run(at(0, 0), at(2, 0)), run(at(5, 0), at(7, 0))];
        let c = cumulative_cost(&model, &[], 1, &runs, at(7, 0));
        assert_eq!(c.age_seconds, 4 * 3600);
        assert_eq!(c.exact_cny(), dec("7.6"));
    }

    #[test]
    fn volume_prices_the_whole_age_at_the_step_it_reached() {
        let model = ChargeModel::Volume { steps: ladder() };
        let h = 3600;
        assert_eq!(
            cost_at_age(&model, 1, 3 * h - 1),
            dec("2") * Decimal::from(3 * h - 1) / dec("3600")
        );
        assert_eq!(cost_at_age(&model, 1, 3 * h), dec("4.8"));
        assert_eq!(
            cost_at_age(&model, 1, 6 * h - 1),
            dec("1.6") * Decimal::from(6 * h - 1) / dec("3600")
        );
        assert_eq!(cost_at_age(&model, 1, 6 * h), dec("7.2"));
        // Reaching a cheaper step makes the next charge negative.
        let runs = [run(at(0, 0), at(4, 0))];
        let before = cumulative_cost(&model, &[], 1, &runs, at(3, 0) - Duration::seconds(1));
        let after = cumulative_cost(&model, &[], 1, &runs, at(3, 0) + Duration::seconds(1));
        assert!(after.amount_since(&before) < Decimal::ZERO);
    }

    #[test]
    fn package_bills_whole_packages_rounded_up() {
        let model = ChargeModel::Package {
            hours_per_package: 4,
            price_cny_per_gb_package: dec("1.5"),
        };
        assert_eq!(cost_at_age(&model, 2, 0), dec("0"));
        assert_eq!(cost_at_age(&model, 2, 1), dec("3"));
        assert_eq!(cost_at_age(&model, 2, 4 * 3600), dec("3"));
        assert_eq!(cost_at_age(&model, 2, 4 * 3600 + 1), dec("6"));
    }

    #[test]
    fn market_prices_each_second_at_the_price_in_force_when_it_starts() {
        let points = [
            PricePoint {
                at: at(0, 0),
                price_cny_per_gb_hour: dec("0.36"),
            },
            PricePoint {
                at: at(0, 10) + Duration::milliseconds(500),
                price_cny_per_gb_hour: dec("0.72"),
            },
        ];
        // A run from 00:00:05.5 to 00:00:15.2: 10 seconds billed, starting
        // at :05.5 .. :14.5; the price changed at :10.5, so the seconds
        // starting at :05.5 .. :09.5 are at 0.36 and :10.5 .. :14.5 at 0.72.
        let start = at(0, 5) + Duration::milliseconds(500);
        let runs = [run(start, at(0, 15) + Duration::milliseconds(200))];
        let c = cumulative_cost(&ChargeModel::Market, &points, 10, &runs, at(1, 0));
        assert_eq!(c.age_seconds, 10);
        assert_eq!(
            c.priced_gb_seconds,
            dec("0.36") * dec("50") + dec("0.72") * dec("50")
        );
        // Before the first point, the first point's price.
        let early = [run(at(0, 0) - Duration::seconds(4), at(0, 0))];
        let c = cumulative_cost(&ChargeModel::Market, &points, 10, &early, at(1, 0));
        assert_eq!(c.priced_gb_seconds, dec("0.36") * dec("40"));
    }

    #[test]
    fn a_charge_is_the_difference_of_the_rounded_cumulative_costs() {
        let basic = tier_model(&default_price_book(at(0, 0)), Tier::Basic).unwrap();
        let runs = [run(at(0, 0), at(0, 3))];
        // 10 GB x 0.5 / 3600 per second = 0.001388... per second
        let c = |s| cumulative_cost(&basic, &[], 10, &runs, at(0, s));
        assert_eq!(c(1).rounded_cny().to_string(), "0.00");
        assert_eq!(c(2).amount_since(&c(1)).to_string(), "0.00");
        assert_eq!(c(3).amount_since(&c(2)).to_string(), "0.00");
        assert_eq!(c(3).rounded_cny().to_string(), "0.00");
        let long = [run(at(0, 0), at(0, 9))];
        let c = |s| cumulative_cost(&basic, &[], 10, &long, at(0, s));
        // 0.0125 rounds to 0.01, 0.0041666 to 0.00: the pieces never drift.
        assert_eq!(c(9).rounded_cny().to_string(), "0.01");
        assert_eq!(c(9).amount_since(&c(3)).to_string(), "0.01");
    }

    #[test]
    fn hours_and_ids() {
        let t = at(5, 17 * 60 + 3) + Duration::milliseconds(9);
        assert_eq!(hour_start(t), at(5, 0));
        assert_eq!(hour_start(at(5, 0)), at(5, 0));
        let lease = Uuid::from_u128(1);
        assert_eq!(
            hourly_charge_id(lease, at(5, 0)),
            hourly_charge_id(lease, at(5, 0))
        );
        assert_ne!(
            hourly_charge_id(lease, at(5, 0)),
            hourly_charge_id(lease, at(6, 0))
        );
    }

    #[test]
    fn a_book_is_refused_naming_the_field_at_fault() {
        let good = default_price_book(at(0, 0));
        assert_eq!(validate_book(&good), Ok(()));
        let refused = |edit: &dyn Fn(&mut PriceBookPublished)| {
            let mut book = good.clone();
            edit(&mut book);
            validate_book(&book).unwrap_err().field
        };
        let ladder = |steps: Vec<(u32, &'static str)>| {
            move |b: &mut PriceBookPublished| {
                b.tiers[1].model = Some(ChargeModel::Graduated {
                    steps: steps
                        .iter()
                        .map(|(h, p)| PriceStep {
                            from_hour: *h,
                            price_cny_per_gb_hour: dec(p),
                        })
                        .collect(),
                })
            }
        };
        assert_eq!(
            refused(&ladder(vec![(1, "2")])),
            "tiers[1].model.steps[0].from_hour"
        );
        assert_eq!(
            refused(&ladder(vec![(0, "2"), (3, "1"), (3, "1")])),
            "tiers[1].model.steps[2].from_hour"
        );
        assert_eq!(
            refused(&ladder(vec![(0, "2"), (3, "-1")])),
            "tiers[1].model.steps[1].price_cny_per_gb_hour"
        );
        assert_eq!(refused(&ladder(vec![])), "tiers[1].model.steps");
        assert_eq!(
            refused(&|b| b.tiers[0].price_cny_per_gb_hour = dec("-0.1")),
            "tiers[0].price_cny_per_gb_hour"
        );
        assert_eq!(
            refused(&|b| b.tiers[0].price_cny_per_gb_hour = dec("0.0000001")),
            "tiers[0].price_cny_per_gb_hour"
        );
        assert_eq!(refused(&|b| b.tiers[3].tier = Tier::Basic), "tiers[3].tier");
        assert_eq!(
            refused(&|b| b.tiers[0].model = Some(ChargeModel::Market)),
            "tiers[0].model.kind"
        );
        assert_eq!(
            refused(&|b| b.tiers[0].model = Some(ChargeModel::Package {
                hours_per_package: 0,
                price_cny_per_gb_package: dec("1")
            })),
            "tiers[0].model.hours_per_package"
        );
        assert_eq!(refused(&|b| b.currency = "USD".into()), "currency");
        assert_eq!(refused(&|b| b.version = 0), "version");
        assert_eq!(refused(&|b| b.tiers.clear()), "tiers");
        // Free is a price.
        let mut free = good.clone();
        free.tiers[0].price_cny_per_gb_hour = Decimal::ZERO;
        assert_eq!(validate_book(&free), Ok(()));
    }

    mod splits {
        use super::*;
        use proptest::prelude::*;

        fn models() -> impl Strategy<Value = ChargeModel> {
            prop_oneof![
                (1i64..=5000).prop_map(|p| ChargeModel::Flat {
                    price_cny_per_gb_hour: Decimal::new(p, 3)
                }),
                Just(ChargeModel::Graduated {
                    steps: performance_ladder()
                }),
                Just(ChargeModel::Volume {
                    steps: performance_ladder()
                }),
                (1u32..=5, 1i64..=900).prop_map(|(n, p)| ChargeModel::Package {
                    hours_per_package: n,
                    price_cny_per_gb_package: Decimal::new(p, 2)
                }),
                Just(ChargeModel::Market),
            ]
        }

        /// Runs from 00:00 with gaps, in milliseconds: (gap before, length).
        fn runs_from(spec: &[(i64, i64)]) -> Vec<Interval> {
            let mut t = at(0, 0);
            spec.iter()
                .map(|&(gap, len)| {
                    let start = t + Duration::milliseconds(gap);
                    t = start + Duration::milliseconds(len);
                    run(start, t)
                })
                .collect()
        }

        fn market(spec: &[(i64, i64)]) -> Vec<PricePoint> {
            let mut t = at(0, 0);
            spec.iter()
                .map(|&(after, price)| {
                    t += Duration::milliseconds(after);
                    PricePoint {
                        at: t,
                        price_cny_per_gb_hour: Decimal::new(price, 4),
                    }
                })
                .collect()
        }

        proptest! {
            #[test]
            fn any_split_gives_the_same_total_and_each_piece_is_within_a_fen(
                model in models(),
                vram_gb in 1u32..=640,
                spec in prop::collection::vec((0i64..4_000_000, 1i64..9_000_000), 1..5),
                points in prop::collection::vec((1i64..3_000_000, 1000i64..9000), 1..8),
                cuts in prop::collection::vec(0i64..40_000_000, 0..12),
            ) {
                let runs = runs_from(&spec);
                let market = market(&points);
                let end = runs.last().unwrap().end + Duration::seconds(1);
                let mut cuts: Vec<DateTime<Utc>> =
                    cuts.iter().map(|ms| at(0, 0) + Duration::milliseconds(*ms)).filter(|c| *c < end).collect();
                cuts.sort();
                cuts.push(end);
                let whole = cumulative_cost(&model, &market, vram_gb, &runs, end);
                let mut state = Accrued::default();
                let mut from = DateTime::<Utc>::MIN_UTC;
                let mut total = Decimal::ZERO;
                for cut in cuts {
                    let next = accrue(&model, &market, vram_gb, state, &runs, from, cut);
                    let amount = next.amount_since(&state);
                    // The same state as from scratch: nothing is lost at a cut.
                    prop_assert_eq!(next, cumulative_cost(&model, &market, vram_gb, &runs, cut));
                    if matches!(model, ChargeModel::Flat { .. } | ChargeModel::Graduated { .. }) {
                        let exact = next.exact_cny() - state.exact_cny();
                        prop_assert!((amount - exact).abs() <= Decimal::new(1, AMOUNT_SCALE),
                            "{amount} vs {exact}");
                    }
                    total += amount;
                    state = next;
                    from = cut;
                }
                prop_assert_eq!(total, whole.rounded_cny());
            }
        }
    }
}
