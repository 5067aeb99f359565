//! The shelf the pricing RPCs read: what the charges decide loop knows of
//! price books, reservations, balances, quotes and spot prices, copied out
//! under a lock as it changes. It sits apart from the charges fold and the
//! RPC handlers so that each depends on it, and neither on the other.

use std::collections::HashMap;

use lh_events::{PriceBookPublished, ReservationCommitted};
use rust_decimal::Decimal;
use uuid::Uuid;

/// What the charges fold knows that the RPCs answer from: every price
/// book version and the stream sequence of the last event on the price
/// book subject the fold has read (a publish is guarded by it), the
/// reservations, balances, quotes and spot prices.
#[derive(Debug, Clone, Default)]
pub struct PricingShelf {
    /// Every price book version, sorted by version.
    pub books: Vec<PriceBookPublished>,
    /// Stream sequence of the last event on the price book subject read.
    pub sequence: u64,
    /// Reservations whose commitment is not yet wholly charged.
    pub reservations: Vec<ReservationCommitted>,
    /// The prepaid tenants' balances at the last pass of the decide loop,
    /// and the running cost of the postpaid tenants watched then.
    pub balances: HashMap<Uuid, lh_rpc::balance::Balance>,
    /// Postpaid tenants whose balance someone asked for lately, with when
    /// it was last asked: the decide loop reckons the running cost of
    /// theirs and the prepaid tenants' open leases, and no one else's. A
    /// pass over every open lease of a fleet a second would cost more than
    /// all the charging (a month priced into invoices took 23 times as
    /// long with it).
    pub watched_postpaid: HashMap<Uuid, std::time::Instant>,
    /// Woken when a pass of the decide loop has put its balances here.
    pub balances_published: std::sync::Arc<tokio::sync::Notify>,
    /// The quotes issued, until a day after they expire.
    pub quotes: HashMap<Uuid, lh_events::QuoteIssued>,
    /// The spot price in force per (zone, GPU model).
    pub spot_prices: HashMap<(String, String), Decimal>,
}

/// The shelf as the charges decider writes it and the RPC handlers read it.
pub type SharedPricingShelf = std::sync::Arc<std::sync::RwLock<PricingShelf>>;
