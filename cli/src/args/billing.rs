//! The flags of `lh billing ...`: a price book tried on a past month.

use clap::{Args, Subcommand};

use super::period::parse_period;

/// `lh billing ...`
#[derive(Debug, Clone, Subcommand)]
pub enum BillingCommand {
    /// A past month's charges priced again on another price book: per
    /// tenant, what was charged, what the book would charge, the difference.
    WhatIf(BillingWhatIf),
}

/// `lh billing what-if`
#[derive(Debug, Clone, Args)]
pub struct BillingWhatIf {
    /// The other book, as `lh price-book publish --file` takes it:
    /// `{"version"?, "tiers": [...]}`; it is not published.
    #[arg(long, value_name = "FILE")]
    pub book: std::path::PathBuf,
    /// The month, `YYYY-MM`.
    #[arg(long, value_name = "YYYY-MM", value_parser = parse_period)]
    pub period: String,
    /// Print CSV instead of a table.
    #[arg(long)]
    pub csv: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::cli::Command;
    use crate::args::test_parse::parse;
    use clap::error::ErrorKind;

    #[test]
    fn billing_what_if_needs_a_book_and_a_month() {
        let cli = parse(&[
            "billing", "what-if", "--book", "b.json", "--period", "2026-11", "--csv",
        ])
        .unwrap();
        let Command::Billing(BillingCommand::WhatIf(w)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(
            (w.book.to_str(), w.period.as_str(), w.csv),
            (Some("b.json"), "2026-11", true)
        );
        assert!(parse(&["billing", "what-if", "--period", "2026-11"]).is_err());
        let e = parse(&[
            "billing", "what-if", "--book", "b.json", "--period", "2026-13",
        ])
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
    }
}
