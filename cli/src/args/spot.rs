//! The flags of `lh spot ...`.

use clap::{Args, Subcommand};

/// `lh spot ...`
#[derive(Debug, Clone, Subcommand)]
pub enum SpotCommand {
    /// Current spot price of each (zone, GPU model) and its recent history.
    Prices(SpotPrices),
}

/// `lh spot prices`
#[derive(Debug, Clone, Args)]
pub struct SpotPrices {
    /// Only this zone.
    #[arg(long)]
    pub zone: Option<String>,
    /// Only this GPU model.
    #[arg(long, value_name = "MODEL")]
    pub gpu_model: Option<String>,
    /// Past prices to show per market (0 to 60).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=60))]
    pub history: u32,
}
