//! The spot market's pure rules: the price from utilisation, what a bid
//! covers, and how often a preempted lease is recovered.
//!
//! `price = floor + (ceiling - floor) × u²` CNY per GB·hour, where `u` is the
//! share of a (zone, model)'s GPUs that leases hold. Quadratic so that spot
//! stays cheap while capacity is plentiful and climbs fast near full. The
//! floor and ceiling are the operator's ([`SpotBounds`]); the price never
//! leaves them.
//!
//! A tenant bids per GPU-hour, the unit a tenant thinks in; the market
//! prices per GB of VRAM per hour, the unit everything is billed in. A bid
//! covers a price when the price times the VRAM the lease holds on each GPU
//! (a whole GPU's VRAM, a share's GB, a MIG instance's memory) is at or under
//! the bid.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// Default CNY per GB·hour with an idle fleet.
pub const FLOOR_CNY_PER_GB_HOUR: Decimal = Decimal::from_parts(10, 0, 0, false, 2);
/// Default CNY per GB·hour with a full fleet (the basic tier's price).
pub const CEILING_CNY_PER_GB_HOUR: Decimal = Decimal::from_parts(50, 0, 0, false, 2);
/// Highest ceiling an operator may set, CNY per GB·hour: a typo must not
/// price a GPU-hour in the thousands.
pub const MAX_CEILING_CNY_PER_GB_HOUR: Decimal = Decimal::from_parts(100, 0, 0, false, 0);
/// Places a spot price carries.
pub const PRICE_SCALE: u32 = 4;
/// Highest bid a request may carry, CNY per GPU-hour.
pub const MAX_BID_CNY_PER_GPU_HOUR: Decimal = Decimal::from_parts(100_000, 0, 0, false, 0);
/// Places a bid may carry.
pub const BID_SCALE: u32 = 4;
/// Most times one preempted spot lease is recovered.
pub const MAX_RECOVERY_RETRIES: u32 = 10;

/// Whether `price` (CNY per GB·hour, from `spot.price_set`) is one a
/// broker can publish: within `0..=`[`MAX_CEILING_CNY_PER_GB_HOUR`]. Readers
/// of the log ignore any other rather than bill or preempt by it.
pub fn is_market_price(price: Decimal) -> bool {
    (Decimal::ZERO..=MAX_CEILING_CNY_PER_GB_HOUR).contains(&price)
}

/// The band a spot price moves in, CNY per GB·hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpotBounds {
    pub floor_cny_per_gb_hour: Decimal,
    pub ceiling_cny_per_gb_hour: Decimal,
}

impl Default for SpotBounds {
    fn default() -> Self {
        Self {
            floor_cny_per_gb_hour: FLOOR_CNY_PER_GB_HOUR,
            ceiling_cny_per_gb_hour: CEILING_CNY_PER_GB_HOUR,
        }
    }
}

impl SpotBounds {
    /// A band with `0 <= floor <= ceiling <= MAX_CEILING_CNY_PER_GB_HOUR`.
    pub fn new(floor: Decimal, ceiling: Decimal) -> Result<Self, String> {
        if floor.is_sign_negative() {
            return Err(format!("the spot floor {floor} is below zero"));
        }
        if ceiling < floor {
            return Err(format!(
                "the spot ceiling {ceiling} is below the floor {floor}"
            ));
        }
        if ceiling > MAX_CEILING_CNY_PER_GB_HOUR {
            return Err(format!(
                "the spot ceiling {ceiling} is above {MAX_CEILING_CNY_PER_GB_HOUR} CNY per GB-hour"
            ));
        }
        Ok(Self {
            floor_cny_per_gb_hour: floor,
            ceiling_cny_per_gb_hour: ceiling,
        })
    }

    /// `(utilisation, price)` for `used` of `total` GPUs. A (zone, model)
    /// without GPUs is priced at the ceiling: nothing there is cheap.
    pub fn price(&self, total: u32, used: u32) -> (Decimal, Decimal) {
        let (floor, ceiling) = (self.floor_cny_per_gb_hour, self.ceiling_cny_per_gb_hour);
        if total == 0 {
            return (Decimal::ZERO, ceiling.round_dp(PRICE_SCALE).normalize());
        }
        let u = Decimal::from(used.min(total)) / Decimal::from(total);
        let p = floor + (ceiling - floor) * u * u;
        // Rounding must not step outside the band.
        let p = p.round_dp(PRICE_SCALE).clamp(floor, ceiling);
        (u.round_dp(PRICE_SCALE).normalize(), p.normalize())
    }
}

/// `(utilisation, price)` under the default band.
pub fn price(total: u32, used: u32) -> (Decimal, Decimal) {
    SpotBounds::default().price(total, used)
}

/// CNY per GPU-hour of a lease holding `vram_gb_per_gpu` on each GPU, at
/// `price_cny_per_gb_hour`.
pub fn price_per_gpu_hour(price_cny_per_gb_hour: Decimal, vram_gb_per_gpu: u32) -> Decimal {
    price_cny_per_gb_hour * Decimal::from(vram_gb_per_gpu)
}

/// Whether a bid of `bid_cny_per_gpu_hour` covers `price_cny_per_gb_hour`
/// for a lease holding `vram_gb_per_gpu` on each GPU: at or under the bid.
pub fn bid_covers(
    bid_cny_per_gpu_hour: Decimal,
    price_cny_per_gb_hour: Decimal,
    vram_gb_per_gpu: u32,
) -> bool {
    price_per_gpu_hour(price_cny_per_gb_hour, vram_gb_per_gpu) <= bid_cny_per_gpu_hour
}

/// Checks a bid as a request states it: positive, at most
/// [`MAX_BID_CNY_PER_GPU_HOUR`], at most [`BID_SCALE`] places.
pub fn check_bid(bid: Decimal) -> Result<Decimal, String> {
    if bid <= Decimal::ZERO || bid > MAX_BID_CNY_PER_GPU_HOUR {
        return Err(format!(
            "the bid must be above 0 and at most {MAX_BID_CNY_PER_GPU_HOUR} CNY per GPU-hour"
        ));
    }
    if bid.normalize().scale() > BID_SCALE {
        return Err(format!("the bid has more than {BID_SCALE} decimal places"));
    }
    Ok(bid.normalize())
}

/// Whether a lease preempted after `attempt` recoveries (0: the lease the
/// tenant asked for) is recovered once more under a limit of `max_retries`.
pub fn recovers(attempt: u32, max_retries: u32) -> bool {
    attempt < max_retries.min(MAX_RECOVERY_RETRIES)
}

/// The region of a zone: what precedes its last dot (`cn-north.1` is in
/// `cn-north`); a zone without a dot is its own region.
pub fn region_of(zone: &str) -> &str {
    zone.rsplit_once('.').map_or(zone, |(region, _)| region)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    #[test]
    fn price_rises_with_use() {
        assert_eq!(price(8, 0).1.to_string(), "0.1");
        assert_eq!(price(8, 4).1.to_string(), "0.2");
        assert_eq!(price(8, 2).1.to_string(), "0.125");
        assert_eq!(price(8, 8).1.to_string(), "0.5");
    }

    #[test]
    fn the_price_stays_within_the_operators_band() {
        let band = SpotBounds::new(d("0.07"), d("0.33")).unwrap();
        for total in 0..=20u32 {
            let mut last = Decimal::ZERO;
            for used in 0..=total + 3 {
                let (u, p) = band.price(total, used);
                assert!(u >= Decimal::ZERO && u <= Decimal::ONE, "{total} {used}");
                assert!(p >= d("0.07") && p <= d("0.33"), "{total} {used}: {p}");
                assert!(p >= last, "never falls as use rises");
                last = p;
            }
        }
        assert_eq!(band.price(4, 4).1, d("0.33"));
        assert_eq!(band.price(4, 0).1, d("0.07"));
        // No GPUs: the ceiling.
        assert_eq!(band.price(0, 0).1, d("0.33"));
    }

    #[test]
    fn a_band_upside_down_or_too_high_is_refused() {
        assert!(SpotBounds::new(d("0.5"), d("0.1")).is_err());
        assert!(SpotBounds::new(d("-0.1"), d("0.1")).is_err());
        assert!(SpotBounds::new(d("0.1"), d("101")).is_err());
        assert!(SpotBounds::new(d("0.2"), d("0.2")).is_ok());
    }

    #[test]
    fn a_bid_covers_a_price_at_or_under_it_per_gpu_hour() {
        // 0.1 CNY per GB-hour on a 40 GB GPU is 4 CNY per GPU-hour.
        assert!(bid_covers(d("4"), d("0.1"), 40));
        assert!(!bid_covers(d("3.99"), d("0.1"), 40));
        // A 10 GB share of the same GPU costs a quarter.
        assert!(bid_covers(d("1"), d("0.1"), 10));
        assert_eq!(price_per_gpu_hour(d("0.125"), 80), d("10"));
    }

    #[test]
    fn a_bid_must_be_positive_bounded_and_not_too_fine() {
        assert!(check_bid(d("0")).is_err());
        assert!(check_bid(d("-1")).is_err());
        assert!(check_bid(d("100001")).is_err());
        assert!(check_bid(d("1.00001")).is_err());
        assert_eq!(check_bid(d("2.50")).unwrap().to_string(), "2.5");
    }

    #[test]
    fn recovery_stops_at_the_limit_and_the_hard_cap() {
        assert!(recovers(0, 2));
        assert!(recovers(1, 2));
        assert!(!recovers(2, 2));
        assert!(!recovers(0, 0));
        assert!(!recovers(MAX_RECOVERY_RETRIES, u32::MAX));
        assert!(recovers(MAX_RECOVERY_RETRIES - 1, u32::MAX));
    }

    #[test]
    fn a_region_is_the_zone_before_its_last_dot() {
        assert_eq!(region_of("cn-north.1"), "cn-north");
        assert_eq!(region_of("z1"), "z1");
        assert_eq!(region_of("ap.east.2"), "ap.east");
    }
}
