//! The flags of `lh balance ...`: a tenant's prepaid balance.

use clap::{Args, Subcommand};
use rust_decimal::Decimal;

/// `lh balance ...`
#[derive(Debug, Clone, Subcommand)]
pub enum BalanceCommand {
    /// The balance, what the running leases cost per hour, how long it lasts.
    Show(BalanceShow),
    /// Add prepaid money (CNY); the tenant is prepaid from its first top-up.
    TopUp(BalanceTopUp),
}

/// `lh balance show`
#[derive(Debug, Clone, Args)]
pub struct BalanceShow {
    #[arg(value_name = "TENANT_ID")]
    pub tenant: String,
}

/// `lh balance top-up`
#[derive(Debug, Clone, Args)]
pub struct BalanceTopUp {
    #[arg(value_name = "TENANT_ID")]
    pub tenant: String,
    /// CNY, e.g. `500` or `99.50`.
    #[arg(long)]
    pub amount: Decimal,
}
