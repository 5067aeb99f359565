//! The flags of `lh quote`: a lease request priced for a duration.

use clap::Args;
use lh_events::Tier;

use super::lease::GpuAskArgs;

/// `lh quote`
#[derive(Debug, Clone, Args)]
pub struct QuoteCreate {
    #[command(flatten)]
    pub ask: GpuAskArgs,
    /// GPU model, e.g. `A100-40GB`.
    #[arg(long, value_name = "MODEL")]
    pub gpu_model: String,
    #[arg(long, value_enum, default_value_t = Tier::Basic)]
    pub tier: Tier,
    /// How long the lease would run, in hours (fractions allowed, e.g. 1.5).
    #[arg(long, value_name = "HOURS")]
    pub hours: f64,
}
