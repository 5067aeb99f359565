//! `POST /v1/price-books`: a new price book version. The list of books and
//! the answer to a publication are pricing's, in [`crate::price_book`].

use chrono::{DateTime, Utc};
use lh_events::TierPrice;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A new price book version.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewPriceBook {
    /// Greater than every version published before.
    pub version: u32,
    /// `CNY`, the only currency (the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// When it applies to leases that start from then on; now by default,
    /// never in the past.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effective_from: Option<DateTime<Utc>>,
    /// One entry per tier: `{"tier": "performance", "price_cny_per_gb_hour":
    /// "2.0", "model": {"kind": "graduated", "steps": [{"from_hour": 0,
    /// "price_cny_per_gb_hour": "2.0"}, ...]}}`. Models: `flat`,
    /// `graduated`, `volume`, `package`, `market` (spot only); see
    /// docs/pricing.md.
    #[schema(value_type = Vec<Object>)]
    pub tiers: Vec<TierPrice>,
    /// Object storage: CNY per GB (10^9 bytes) held for a month of 730
    /// hours, e.g. `"0.12"`; storage is free on a book without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "0.12")]
    pub storage_cny_per_gb_month: Option<Decimal>,
}
