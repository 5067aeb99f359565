//! Spot price from utilisation.
//!
//! `price = floor + (ceiling - floor) × u²` CNY per GB·hour, where `u` is the
//! share of a (zone, model)'s GPUs that leases hold. Quadratic so that spot
//! stays cheap while capacity is plentiful and climbs fast near full.

use rust_decimal::Decimal;

/// CNY per GB·hour with an idle fleet.
pub const FLOOR_CNY_PER_GB_HOUR: Decimal = Decimal::from_parts(10, 0, 0, false, 2);
/// CNY per GB·hour with a full fleet (the basic tier's price).
pub const CEILING_CNY_PER_GB_HOUR: Decimal = Decimal::from_parts(50, 0, 0, false, 2);
/// Places a spot price carries.
pub const PRICE_SCALE: u32 = 4;

/// `(utilisation, price)` for `used` of `total` GPUs.
pub fn price(total: u32, used: u32) -> (Decimal, Decimal) {
    if total == 0 {
        return (Decimal::ZERO, CEILING_CNY_PER_GB_HOUR);
    }
    let u = Decimal::from(used.min(total)) / Decimal::from(total);
    let p = FLOOR_CNY_PER_GB_HOUR + (CEILING_CNY_PER_GB_HOUR - FLOOR_CNY_PER_GB_HOUR) * u * u;
    (
        u.round_dp(PRICE_SCALE).normalize(),
        p.round_dp(PRICE_SCALE).normalize(),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn price_rises_with_use() {
        assert_eq!(super::price(8, 0).1.to_string(), "0.1");
        assert_eq!(super::price(8, 4).1.to_string(), "0.2");
        assert_eq!(super::price(8, 2).1.to_string(), "0.125");
        assert_eq!(super::price(8, 8).1.to_string(), "0.5");
    }
}
