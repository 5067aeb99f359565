//! `POST /v1/quotes`: what a lease would cost for a duration. The quote
//! itself is pricing's answer, the event it records
//! ([`lh_events::QuoteIssued`]).

use lh_events::Tier;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::leases::FractionBody;

/// What to price: the GPU fields of a lease and a duration.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewQuote {
    /// Whole GPUs; exactly one of `gpus`, `gpu_fraction` and `mig_profile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_fraction: Option<FractionBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// A model from the catalog, e.g. `A100-40GB`.
    pub gpu_model: String,
    #[serde(default = "default_tier")]
    #[schema(value_type = String, example = "basic")]
    pub tier: Tier,
    /// How long the lease would run, 1 s to 366 days.
    pub duration_seconds: u64,
}

fn default_tier() -> Tier {
    Tier::Basic
}
