//! Reservations, as pricing lists them on [`RPC_PRICING_RESERVATIONS`] and
//! commits them on [`RPC_PRICING_COMMIT_RESERVATION`].
//!
//! Pricing is the one writer of `reservation.committed`: it bills the
//! commitment and decides which leases it covers, from its own fold.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_bus::Bus;
use lh_events::{Actor, ReservationCommitted};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

pub use lh_events::subject::{RPC_PRICING_COMMIT_RESERVATION, RPC_PRICING_RESERVATIONS};

/// The term of a reservation when none is asked for: 30 days.
pub const DEFAULT_TERM_DAYS: u32 = 30;
/// The longest term: well inside the log's retention, so a reservation's
/// event outlives it.
pub const MAX_TERM_DAYS: u32 = 180;
/// Furthest ahead a reservation may start, in days: with the longest term
/// it still ends inside the log's retention of a year.
pub const MAX_LEAD_DAYS: u32 = 180;
/// Most GPUs one reservation commits to.
pub const MAX_RESERVED_GPUS: u32 = 1024;

/// Request on [`RPC_PRICING_RESERVATIONS`]: every reservation, or one
/// tenant's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListRequest {
    pub tenant_id: Option<Uuid>,
}

/// The reservations pricing knows, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Reservations {
    /// `reservation.committed` payloads.
    #[schema(value_type = Vec<Object>)]
    pub reservations: Vec<ReservationCommitted>,
}

/// Request on [`RPC_PRICING_COMMIT_RESERVATION`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CommitRequest {
    pub tenant_id: Uuid,
    /// A model of the catalog, e.g. `A100-40GB`.
    pub gpu_model: String,
    pub zone: String,
    pub gpus: u32,
    /// Days, 1 to 180; 30 by default.
    pub term_days: Option<u32>,
    /// Now by default; never in the past.
    pub starts_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub requested_by: Option<Actor>,
}

/// What became of a [`CommitRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum CommitReply {
    Committed { reservation: ReservationCommitted },
    Refused { field: String, detail: String },
}

/// Asks pricing for the reservations (of one tenant).
pub async fn list(
    bus: &Bus,
    request: &ListRequest,
    timeout: Duration,
) -> lh_bus::Result<Reservations> {
    lh_bus::rpc::call(bus, RPC_PRICING_RESERVATIONS, request, timeout).await
}

/// Asks pricing to commit a reservation.
pub async fn commit(
    bus: &Bus,
    request: &CommitRequest,
    timeout: Duration,
) -> lh_bus::Result<CommitReply> {
    lh_bus::rpc::call(bus, RPC_PRICING_COMMIT_RESERVATION, request, timeout).await
}
