//! `POST /v1/reservations`: GPUs of a model in a zone committed to a
//! tenant for a term. The reservation made and the list are pricing's
//! answers ([`lh_events::ReservationCommitted`],
//! [`crate::reservation::Reservations`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// A new reservation.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewReservation {
    pub tenant_id: Uuid,
    /// A model of the catalog, e.g. `A100-40GB`.
    pub gpu_model: String,
    pub zone: String,
    /// 1 to 1024.
    pub gpus: u32,
    /// 1 to 180 days; 30 (a month) by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub term_days: Option<u32>,
    /// Now by default; never in the past.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<DateTime<Utc>>,
}
