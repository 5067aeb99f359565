//! What a lease costs. Pure: the lease's started/ended timestamps (the
//! node-agent's own) and the price book come in as arguments.
//!
//! Rounding rule (one place, here):
//! * Billed time is whole seconds counted from `started_at`, the last
//!   partial second rounded up: `ceil((ended_at - started_at) / 1 s)`.
//! * A lease that spans UTC calendar months is split at the month boundary;
//!   each second goes to the month it starts in, so the parts add up to the
//!   whole exactly.
//! * `amount = vram_gb × unit price (CNY per GB·hour) × billed seconds / 3600`,
//!   computed exactly in `rust_decimal`, then rounded once per invoice line to
//!   2 places (fen) with half away from zero. An invoice total is the sum of
//!   its rounded lines.

use chrono::{DateTime, Datelike, TimeZone, Utc};
use lh_events::{derived_id, ChargeAccrued, PriceBookPublished, Tier, TierPrice};
use rust_decimal::{Decimal, RoundingStrategy};
use uuid::Uuid;

pub const CURRENCY: &str = "CNY";

/// How far a node's clock may be from the log server's before its
/// timestamps are not believed, by default.
pub const DEFAULT_NODE_CLOCK_SKEW_SECS: i64 = 30;

/// A node's own timestamp of something it reports, held to what the log
/// server saw: not later than the server stored the report, nor earlier
/// than `skew` before that. A node whose clock runs wrong (or lies) moves
/// its bill by at most `skew`.
pub fn clamp_node_time(
    claimed: DateTime<Utc>,
    stored_at: DateTime<Utc>,
    skew: chrono::Duration,
) -> DateTime<Utc> {
    claimed.clamp(stored_at - skew.abs(), stored_at)
}
/// Decimal places of a billed amount (fen).
pub const AMOUNT_SCALE: u32 = 2;
const MICROS_PER_SECOND: i64 = 1_000_000;

/// The book pricing publishes when the log holds none.
pub fn default_price_book(effective_from: DateTime<Utc>) -> PriceBookPublished {
    PriceBookPublished {
        version: 1,
        currency: CURRENCY.to_string(),
        effective_from,
        tiers: vec![
            TierPrice {
                tier: Tier::Basic,
                price_cny_per_gb_hour: Decimal::new(5, 1),
            },
            TierPrice {
                tier: Tier::Spot,
                price_cny_per_gb_hour: Decimal::new(2, 1),
            },
        ],
    }
}

pub fn unit_price(book: &PriceBookPublished, tier: Tier) -> Option<Decimal> {
    book.tiers
        .iter()
        .find(|t| t.tier == tier)
        .map(|t| t.price_cny_per_gb_hour)
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
    let micros = (to - from).num_microseconds().unwrap_or(i64::MAX).max(0);
    ((micros + MICROS_PER_SECOND - 1) / MICROS_PER_SECOND) as u64
}

/// `YYYY-MM` of an instant.
pub fn period_of(at: DateTime<Utc>) -> String {
    format!("{:04}-{:02}", at.year(), at.month())
}

fn next_month_start(at: DateTime<Utc>) -> DateTime<Utc> {
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

/// The charges of a finished segment, one per UTC month it touches.
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
        });
        billed_so_far = upto;
        piece_start = boundary;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_time_is_held_to_the_stored_time_within_the_skew() {
        let stored = Utc.with_ymd_and_hms(2026, 12, 3, 10, 0, 0).unwrap();
        let skew = chrono::Duration::seconds(30);
        let ago = |s: i64| stored - chrono::Duration::seconds(s);
        assert_eq!(
            clamp_node_time(ago(10), stored, skew),
            ago(10),
            "within the skew"
        );
        assert_eq!(
            clamp_node_time(ago(3600), stored, skew),
            ago(30),
            "a clock far behind"
        );
        assert_eq!(
            clamp_node_time(ago(-600), stored, skew),
            stored,
            "a clock ahead"
        );
    }
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
}
