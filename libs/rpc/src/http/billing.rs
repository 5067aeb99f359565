//! `POST /v1/billing/what-if`: a past month and the price book to price it
//! on again. The report is pricing's answer, [`crate::what_if::WhatIfReport`].

use chrono::{DateTime, Utc};
use lh_events::TierPrice;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A month and the book to price it on.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WhatIf {
    /// `YYYY-MM`.
    #[schema(example = "2026-11")]
    pub period: String,
    pub book: WhatIfBook,
}

/// A price book as `POST /v1/price-books` takes it, but for its version,
/// which is only a label here.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WhatIfBook {
    /// Shown in the report; 0 (a draft, the default) or any version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// `CNY`, the only currency (the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// Ignored: every charge of the month is priced on the book.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effective_from: Option<DateTime<Utc>>,
    /// One entry per tier, as in `POST /v1/price-books`.
    #[schema(value_type = Vec<Object>)]
    pub tiers: Vec<TierPrice>,
    /// Accepted as `POST /v1/price-books` takes it, so that one file
    /// serves both; a what-if prices the month's compute charges only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub storage_cny_per_gb_month: Option<Decimal>,
}
