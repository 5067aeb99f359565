//! Spot prices, as the spot-broker answers them on [`RPC_SPOT_PRICES`]: the
//! current price of each (zone, GPU model) and its recent history.
//!
//! The broker folds every `spot.price_set` already to decide the next one,
//! so it answers from memory; the gateway serves the same answer on
//! `GET /v1/spot/prices` over [`call`] and keeps no copy of its own.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::Bus;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use lh_events::subject::RPC_SPOT_PRICES;

/// Most past prices kept and answered per (zone, model), newest last.
pub const MAX_HISTORY_POINTS: usize = 60;
/// Most (zone, model) pairs one answer carries.
pub const MAX_MARKETS: usize = 1_000;
/// Longest zone or model name a filter may carry, in bytes.
pub const MAX_FILTER_LEN: usize = 128;

/// Request on [`RPC_SPOT_PRICES`]; every field narrows the answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SpotPricesRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// Past prices per market, at most [`MAX_HISTORY_POINTS`] (default: all kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<u32>,
}

/// One price the log recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SpotPricePoint {
    /// CNY per GB of VRAM per hour, as a decimal string.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "0.125")]
    pub price_cny_per_gb_hour: Decimal,
    /// Share of the market's GPUs held, 0 to 1, as a decimal string.
    #[serde(with = "rust_decimal::serde::str")]
    #[schema(value_type = String, example = "0.5")]
    pub utilisation: Decimal,
    /// When the price took effect (the event's `occurred_at`).
    pub at: DateTime<Utc>,
}

/// One (zone, GPU model) market: its current price and the ones before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SpotMarketView {
    pub zone: String,
    pub region: String,
    pub gpu_model: String,
    pub current: SpotPricePoint,
    pub gpus_total: u32,
    pub gpus_used: u32,
    /// Earlier prices, oldest first, the current one last.
    pub history: Vec<SpotPricePoint>,
}

/// The answer: markets ordered by (zone, model).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SpotPrices {
    pub markets: Vec<SpotMarketView>,
}

/// Asks the spot-broker for prices.
pub async fn call(
    bus: &Bus,
    request: &SpotPricesRequest,
    timeout: Duration,
) -> lh_bus::Result<SpotPrices> {
    lh_bus::rpc::call(bus, RPC_SPOT_PRICES, request, timeout).await
}
