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
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Basic => "basic",
            Tier::Spot => "spot",
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

/// The spot-broker chose where a spot request could run on external
/// capacity: the cheapest offer of the clouds it knows that satisfies the
/// request (model, GPUs on one instance, zones, regions, bid), with every
/// offer it weighed and why each other one was passed over. Stored on the
/// chosen `zone`'s spot subject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SpotCapacityChosen {
    pub lease_id: Uuid,
    pub tenant_id: Uuid,
    pub provider: String,
    pub region: String,
    pub zone: String,
    pub gpu_model: String,
    pub gpus: u32,
    /// CNY per GPU-hour, as a decimal string.
    #[schemars(with = "String")]
    pub price_cny_per_gpu_hour: Decimal,
    /// Cheapest first; the chosen one among them.
    pub candidates: Vec<CapacityCandidate>,
}

/// One cloud offer weighed for a spot request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CapacityCandidate {
    pub provider: String,
    pub region: String,
    pub zone: String,
    pub instance_type: String,
    pub gpus_per_instance: u32,
    /// CNY per GPU-hour, as a decimal string.
    #[schemars(with = "String")]
    pub price_cny_per_gpu_hour: Decimal,
    /// Why it was passed over; absent for one that satisfies the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

/// A version of the price book. Every charge names the version it used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PriceBookPublished {
    pub version: u32,
    pub currency: String,
    pub effective_from: DateTime<Utc>,
    pub tiers: Vec<TierPrice>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TierPrice {
    pub tier: Tier,
    #[schemars(with = "String")]
    pub price_cny_per_gb_hour: Decimal,
}

/// What one lease costs within one invoice period (a UTC calendar month).
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
}
