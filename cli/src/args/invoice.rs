//! The flags of `lh invoice ...`: a document named by its id or its month.

use clap::{Args, Subcommand};

use super::period::parse_period;

/// `lh invoice ...`
#[derive(Debug, Clone, Subcommand)]
pub enum InvoiceCommand {
    /// List invoices and notes, newest month first.
    Ls(InvoiceLs),
    /// Show one invoice or note: by id, or your invoice of a month.
    Show(InvoiceShow),
    /// Print one invoice or note as CSV.
    Export(InvoiceShow),
}

/// `lh invoice ls`
#[derive(Debug, Clone, Args)]
pub struct InvoiceLs {
    /// Only this month, `YYYY-MM`.
    #[arg(long, value_name = "YYYY-MM", value_parser = parse_period)]
    pub period: Option<String>,
    /// Only `draft` or `issued` ones.
    #[arg(long, value_parser = ["draft", "issued"])]
    pub status: Option<String>,
    /// Whose (admin token only; default: your own, or every tenant's for the admin).
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
    /// At most this many (1 to 500).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub limit: Option<u32>,
}

/// `lh invoice show` and `lh invoice export`
#[derive(Debug, Clone, Args)]
pub struct InvoiceShow {
    /// Invoice or note id.
    #[arg(
        value_name = "ID",
        required_unless_present = "period",
        conflicts_with = "period"
    )]
    pub id: Option<String>,
    /// Instead of an id: the invoice of this month, `YYYY-MM` (a draft until issued).
    #[arg(long, value_name = "YYYY-MM", value_parser = parse_period)]
    pub period: Option<String>,
    /// Tenant whose invoice of `--period` (admin token only; default: your own).
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
}

impl InvoiceShow {
    /// The path segment naming the document: its id or its month.
    pub fn target(&self) -> &str {
        self.id
            .as_deref()
            .or(self.period.as_deref())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::cli::Command;
    use crate::args::test_parse::parse;
    use clap::error::ErrorKind;

    #[test]
    fn invoice_show_checks_period() {
        let cli = parse(&["invoice", "show", "--period", "2026-12", "--tenant", "T"]).unwrap();
        let Command::Invoice(InvoiceCommand::Show(i)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(i.period.as_deref(), Some("2026-12"));
        assert_eq!(i.tenant.as_deref(), Some("T"));
        assert_eq!(i.target(), "2026-12");
        let cli = parse(&["invoice", "export", "0193b7e2-0000-7000-8000-0000000000ff"]).unwrap();
        let Command::Invoice(InvoiceCommand::Export(e)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(e.target(), "0193b7e2-0000-7000-8000-0000000000ff");
        // One of the two, not both, not neither.
        assert!(parse(&["invoice", "show"]).is_err());
        assert!(parse(&["invoice", "show", "X", "--period", "2026-12"]).is_err());
        let cli = parse(&["invoice", "ls", "--status", "issued", "--period", "2026-11"]).unwrap();
        let Command::Invoice(InvoiceCommand::Ls(l)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(
            (l.status.as_deref(), l.period.as_deref()),
            (Some("issued"), Some("2026-11"))
        );
        assert!(parse(&["invoice", "ls", "--status", "paid"]).is_err());

        for bad in [
            "2026-13",
            "2026-00",
            "26-12",
            "2026/12",
            "2026-1",
            "２０２６-12",
            "",
        ] {
            let e = parse(&["invoice", "show", "--period", bad]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{bad}");
        }
    }
}
