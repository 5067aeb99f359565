//! The flags of `lh reservation ...`: GPUs committed to a tenant.

use clap::{Args, Subcommand};
use uuid::Uuid;

/// `lh reservation ...`
#[derive(Debug, Clone, Subcommand)]
pub enum ReservationCommand {
    /// The reservations not yet over (a tenant sees its own).
    Ls(ReservationList),
    /// Commit a tenant to GPUs of a model in a zone for a term.
    Create(ReservationCreate),
}

/// `lh reservation ls`
#[derive(Debug, Clone, Args)]
pub struct ReservationList {
    /// Admin only: one tenant's reservations.
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
}

/// `lh reservation create`
#[derive(Debug, Clone, Args)]
pub struct ReservationCreate {
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Uuid,
    /// GPU model, e.g. `A100-40GB`.
    #[arg(long, value_name = "MODEL")]
    pub gpu_model: String,
    #[arg(long)]
    pub zone: String,
    #[arg(long)]
    pub gpus: u32,
    /// Days (30 by default).
    #[arg(long, value_name = "DAYS")]
    pub term_days: Option<u32>,
}
