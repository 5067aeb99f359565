//! The `lh` command line at the top: the global options (gateway, key
//! file, `--json`) and one subcommand per command group.

use clap::{Parser, Subcommand};

use super::audit::AuditCommand;
use super::balance::BalanceCommand;
use super::billing::BillingCommand;
use super::data::DataCommand;
use super::invoice::InvoiceCommand;
use super::lease::LeaseCommand;
use super::node::NodeCommand;
use super::price_book::PriceBookCommand;
use super::quote::QuoteCreate;
use super::report::ReportCommand;
use super::reservation::ReservationCommand;
use super::spot::SpotCommand;
use super::ssh_key::SshKeyCommand;
use super::template::TemplateCommand;
use super::tenant::TenantCommand;
use super::workspace::WorkspaceCommand;

/// Gateway used when neither `--gateway-url` nor `LH_GATEWAY_URL` is given.
pub const DEFAULT_GATEWAY_URL: &str = "http://127.0.0.1:8080";

const GLOBAL: &str = "Global options";

/// Command-line client for the Leasehold GPU leasing gateway.
#[derive(Debug, Clone, Parser)]
#[command(name = "lh", version, about, long_about = None)]
pub struct Cli {
    /// Base URL of the Leasehold gateway.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "LH_GATEWAY_URL",
        default_value = DEFAULT_GATEWAY_URL,
        value_name = "URL"
    )]
    pub gateway_url: String,

    /// Refused: a key on the command line shows in `ps` and in shell
    /// history. The key comes from `LH_API_KEY` or `--api-key-file`.
    #[arg(long, global = true, hide = true, value_name = "KEY")]
    pub api_key: Option<String>,

    /// File holding the API key (or admin token), sent as
    /// `Authorization: Bearer <key>`; else the key is read from `LH_API_KEY`.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "LH_API_KEY_FILE",
        value_name = "PATH"
    )]
    pub api_key_file: Option<std::path::PathBuf>,

    /// Print the gateway's JSON, pretty-printed, instead of a table.
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// Top-level command groups.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Manage tenants (admin token required).
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Request, inspect and stop GPU leases.
    #[command(subcommand)]
    Lease(LeaseCommand),
    /// Show invoices.
    #[command(subcommand)]
    Invoice(InvoiceCommand),
    /// The GPUs you can rent now, by model and zone: how many are free,
    /// whole and in shares, and what an hour of one costs on each tier.
    Gpus,
    /// Read the spot market.
    #[command(subcommand)]
    Spot(SpotCommand),
    /// Register, list and remove the SSH keys that enter the tenant's
    /// leases (`ssh -p 2222 <lease-id>@<gateway>`).
    #[command(subcommand)]
    SshKey(SshKeyCommand),
    /// Datasets on the tenant's own storage: upload, list, download and
    /// remove versions (`lh lease create --dataset NAME:/data` mounts one).
    #[command(subcommand)]
    Data(DataCommand),
    /// Workspaces on the tenant's own storage, each a lease's directory
    /// kept between its runs (`lh lease create --workspace NAME:/PATH`):
    /// list them, snapshot one, restore one from a snapshot, remove one.
    #[command(subcommand)]
    Workspace(WorkspaceCommand),
    /// List the workload templates a lease may name.
    #[command(subcommand)]
    Template(TemplateCommand),
    /// Check the audit log.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Take GPU nodes out of placement and back (admin token required).
    #[command(subcommand)]
    Node(NodeCommand),
    /// Reports: spending in a week, a day of the fleet.
    #[command(subcommand)]
    Report(ReportCommand),
    /// Try a price book on a past month (admin token required).
    #[command(subcommand)]
    Billing(BillingCommand),
    /// List the price books, publish a new one (admin token required).
    #[command(subcommand)]
    PriceBook(PriceBookCommand),
    /// Reserve GPUs for a tenant (admin), list reservations.
    #[command(subcommand)]
    Reservation(ReservationCommand),
    /// Read a tenant's prepaid balance, top it up (admin token required).
    #[command(subcommand)]
    Balance(BalanceCommand),
    /// Price a lease for a duration on the current price book; the quote's
    /// id (`lh lease create --quote ID`) bills the lease on that book.
    Quote(QuoteCreate),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::test_parse::parse;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_anywhere() {
        let cli = parse(&[
            "--gateway-url",
            "http://gw:9000",
            "lease",
            "ls",
            "--json",
            "--api-key-file",
            "/run/key",
        ])
        .unwrap();
        assert_eq!(cli.gateway_url, "http://gw:9000");
        assert_eq!(
            cli.api_key_file.as_deref(),
            Some(std::path::Path::new("/run/key"))
        );
        assert!(cli.json);
    }

    #[test]
    fn missing_subcommand_is_an_error() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["lease"]).is_err());
        assert!(parse(&["frobnicate"]).is_err());
    }
}
