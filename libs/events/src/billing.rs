//! What is charged: service tiers, price books (`lh.evt.price_book.*`),
//! spot prices (`lh.evt.spot.<zone>.<model>`) and charges
//! (`lh.evt.charge.<lease id>`).

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Service tier of a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Basic,
    Spot,
    /// A price ladder by the lease's billable age.
    Performance,
    /// Covered by a tenant's commitment; what does not fit is billed as basic.
    Reserved,
}

impl Tier {
    pub const ALL: [Tier; 4] = [Tier::Basic, Tier::Performance, Tier::Spot, Tier::Reserved];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Basic => "basic",
            Tier::Spot => "spot",
            Tier::Performance => "performance",
            Tier::Reserved => "reserved",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SpotPriceSet {
    pub zone: String,
    pub gpu_model: String,
    /// CNY per GB of VRAM per hour, as a decimal string.
    #[schemars(with = "String")]
    pub price_cny_per_gb_hour: Decimal,
    /// Share of this (zone, model)'s GPUs held by leases, 0..=1, as a decimal string.
    #[schemars(with = "String")]
    pub utilisation: Decimal,
    pub gpus_total: u32,
    pub gpus_used: u32,
}

/// A version of the price book. Every charge names the version it used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PriceBookPublished {
    pub version: u32,
    pub currency: String,
    pub effective_from: DateTime<Utc>,
    pub tiers: Vec<TierPrice>,
    /// Who asked pricing to publish this version (an admin through the
    /// gateway); absent for the default book.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<crate::Actor>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TierPrice {
    pub tier: Tier,
    /// The tier's headline price: the flat price, a ladder's first step, a
    /// package's price per hour, or for `market` the price charged while
    /// the market has published none. Readers that know `model` use it.
    #[schemars(with = "String")]
    pub price_cny_per_gb_hour: Decimal,
    /// How the tier is charged; absent (books published before charge
    /// models): flat at `price_cny_per_gb_hour`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ChargeModel>,
}

/// How a tier turns GB of VRAM and billable time into money. Prices are CNY
/// per GB of VRAM; the arithmetic is `lh_domain::rating`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ChargeModel {
    /// One price per GB-hour, per second.
    Flat {
        #[schemars(with = "String")]
        price_cny_per_gb_hour: Decimal,
    },
    /// Each second at the price of the step the lease's billable age is in.
    Graduated { steps: Vec<PriceStep> },
    /// All of the lease's billable time at the price of the step its total
    /// age has reached (the price can fall as it runs: a charge may be
    /// negative).
    Volume { steps: Vec<PriceStep> },
    /// Whole packages of `hours_per_package` hours, the last one rounded up.
    Package {
        hours_per_package: u32,
        #[schemars(with = "String")]
        price_cny_per_gb_package: Decimal,
    },
    /// The clearing price `spot.price_set` publishes for the lease's
    /// (zone, GPU model), each second at the price in force when it starts.
    Market,
}

/// One step of a ladder: its price from `from_hour` hours of billable age
/// on, until the next step's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PriceStep {
    pub from_hour: u32,
    #[schemars(with = "String")]
    pub price_cny_per_gb_hour: Decimal,
}

/// What one lease costs over `from..to`, all within one UTC hour (so
/// within one invoice period, a UTC calendar month). A lease's charges add
/// up to its rounded cumulative cost (see `lh_domain::rating`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChargeAccrued {
    pub charge_id: Uuid,
    pub tenant_id: Uuid,
    pub lease_id: Uuid,
    /// `YYYY-MM`.
    pub period: String,
    pub tier: Tier,
    pub gpus: u32,
    pub vram_gb: u32,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub billed_seconds: u64,
    #[schemars(with = "String")]
    pub unit_price_cny_per_gb_hour: Decimal,
    #[schemars(with = "String")]
    pub amount: Decimal,
    pub currency: String,
    pub price_book_version: u32,
    /// The lease's billable seconds from its start up to `to`. Absent on
    /// charges written before hourly accrual.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<u64>,
    /// The lease's exact cumulative cost up to `to`, times 3600 (the sum of
    /// price per GB-hour x GB x seconds): where the next charge continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub priced_gb_seconds: Option<Decimal>,
    /// The reservation whose commitment covered this time (the amount is
    /// then zero), or whose commitment this charge bills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<Uuid>,
}

/// A tenant commits to `gpus` GPUs of `gpu_model` in `zone` from
/// `starts_at` to `ends_at`: billed each hour at the reserved tier's price
/// whether used or not, and its leases of tier `reserved` that fit in it
/// are not billed again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReservationCommitted {
    pub reservation_id: Uuid,
    pub tenant_id: Uuid,
    pub gpu_model: String,
    pub zone: String,
    pub gpus: u32,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    /// Who asked for it (an admin through the gateway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<crate::Actor>,
}
