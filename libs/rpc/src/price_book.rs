//! Price books, as pricing lists them on [`RPC_PRICING_PRICE_BOOKS`] and
//! publishes them on [`RPC_PRICING_PUBLISH_PRICE_BOOK`].
//!
//! Pricing is the one writer of `price_book.published`: it holds every
//! version in its fold, so it alone can say whether a new version is newer
//! than the log's, and publish it guarded by the sequence it checked.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::Bus;
use lh_events::PriceBookPublished;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use lh_events::subject::{RPC_PRICING_PRICE_BOOKS, RPC_PRICING_PUBLISH_PRICE_BOOK};

/// Request on [`RPC_PRICING_PRICE_BOOKS`]: an empty JSON object, `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ListRequest {}

/// Every price book version in the log, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PriceBooks {
    /// `price_book.published` payloads (see its JSON Schema in
    /// `schemas/price_book.published.v1.json`).
    #[schema(value_type = Vec<Object>)]
    pub books: Vec<PriceBookPublished>,
}

/// Request on [`RPC_PRICING_PUBLISH_PRICE_BOOK`]: a new version, with
/// `requested_by` naming who asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishRequest {
    pub book: PriceBookPublished,
}

/// What became of a [`PublishRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PublishReply {
    Published {
        version: u32,
        /// Stream sequence of the `price_book.published` event.
        sequence: u64,
    },
    /// The book is not valid, or its version is not newer than the log's.
    Refused { field: String, detail: String },
}

/// What the gateway answers to a publish: the version and when it applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Published {
    pub version: u32,
    pub effective_from: DateTime<Utc>,
}

/// Asks pricing for every price book.
pub async fn list(bus: &Bus, timeout: Duration) -> lh_bus::Result<PriceBooks> {
    lh_bus::rpc::call(bus, RPC_PRICING_PRICE_BOOKS, &ListRequest {}, timeout).await
}

/// Asks pricing to publish `request.book`.
pub async fn publish(
    bus: &Bus,
    request: &PublishRequest,
    timeout: Duration,
) -> lh_bus::Result<PublishReply> {
    lh_bus::rpc::call(bus, RPC_PRICING_PUBLISH_PRICE_BOOK, request, timeout).await
}
