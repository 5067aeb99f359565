//! Quotes, as pricing issues them on [`RPC_PRICING_QUOTE`] and answers them
//! on [`RPC_PRICING_QUOTE_GET`]. Pricing is the one writer of
//! `quote.issued`: it prices the request on the book in force.

use std::time::Duration;

use lh_bus::Bus;
use lh_events::{GpuFraction, QuoteIssued, Tier};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use lh_events::subject::{RPC_PRICING_QUOTE, RPC_PRICING_QUOTE_GET};

/// How long a quote is valid when the configuration does not say: 15 minutes.
pub const DEFAULT_QUOTE_VALID_SECS: u64 = 15 * 60;
/// Longest validity a configuration may give: 7 days.
pub const MAX_QUOTE_VALID_SECS: u64 = 7 * 24 * 3600;
/// Longest duration a quote prices: 366 days.
pub const MAX_QUOTE_DURATION_SECS: u64 = 366 * 24 * 3600;

/// Request on [`RPC_PRICING_QUOTE`]: the spec fields of a lease and a duration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuoteRequest {
    pub tenant_id: Uuid,
    pub gpus: Option<u32>,
    pub fraction: Option<GpuFraction>,
    pub mig_profile: Option<String>,
    pub gpu_model: String,
    pub tier: Tier,
    pub duration_seconds: u64,
}

/// What became of a [`QuoteRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum QuoteReply {
    Issued { quote: QuoteIssued },
    Refused { field: String, detail: String },
}

/// Request on [`RPC_PRICING_QUOTE_GET`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetRequest {
    pub quote_id: Uuid,
}

/// Asks pricing to price a request and issue a quote.
pub async fn issue(
    bus: &Bus,
    request: &QuoteRequest,
    timeout: Duration,
) -> lh_bus::Result<QuoteReply> {
    lh_bus::rpc::call(bus, RPC_PRICING_QUOTE, request, timeout).await
}

/// A quote pricing issued and has not forgotten (it forgets a day after
/// the quote expires); `None` when it knows none by that id.
pub async fn get(
    bus: &Bus,
    request: &GetRequest,
    timeout: Duration,
) -> lh_bus::Result<Option<QuoteIssued>> {
    lh_bus::rpc::call(bus, RPC_PRICING_QUOTE_GET, request, timeout).await
}
