//! The flags of `lh price-book ...`.

use clap::{Args, Subcommand};

/// `lh price-book ...`
#[derive(Debug, Clone, Subcommand)]
pub enum PriceBookCommand {
    /// Every price book version, oldest first.
    Ls,
    /// Publish a new version from a JSON file (see docs/pricing.md).
    Publish(PriceBookPublish),
}

/// `lh price-book publish`
#[derive(Debug, Clone, Args)]
pub struct PriceBookPublish {
    /// JSON body of `POST /v1/price-books`:
    /// `{"version", "effective_from"?, "tiers": [...]}`.
    #[arg(long, value_name = "FILE")]
    pub file: std::path::PathBuf,
}
