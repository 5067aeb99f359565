//! The flags of `lh tenant ...` and `lh tenant key ...`: a tenant's
//! record, quota and idle policy, and its API keys.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use lh_events::IdleAction;

/// `lh tenant ...`
#[derive(Debug, Clone, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its API key (shown only once).
    Create(TenantCreate),
    /// List the tenants, oldest first, a page at a time (operators).
    #[command(visible_alias = "list")]
    Ls(TenantList),
    /// Show a tenant: its name, e-mail, quota, weight and whether it is
    /// suspended or erased.
    Get(TenantId),
    /// Issue, list and revoke a tenant's API keys (admin or the tenant).
    #[command(subcommand)]
    Key(KeyCommand),
    /// Suspend a tenant: it may read but change nothing (admin).
    Suspend(TenantSuspend),
    /// Let a suspended tenant act again (admin).
    Resume(TenantId),
    /// Change a tenant's quota and fair-share weight (admin).
    SetQuota(TenantSetQuota),
    /// Erase a tenant: destroy its data key, so its name and e-mail read as
    /// `[erased]` for good; refused while a lease of it has not ended (admin).
    Erase(TenantId),
}

/// A tenant named by its id.
#[derive(Debug, Clone, Args)]
pub struct TenantId {
    /// Tenant id.
    pub id: String,
}

/// `lh tenant ls`
#[derive(Debug, Clone, Args)]
pub struct TenantList {
    /// Tenants in the page, 1 to 500 (the gateway's default: 100).
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,
    /// Start after this tenant (the `next_after` of an earlier page).
    #[arg(long, value_name = "ID")]
    pub after: Option<String>,
}

/// `lh tenant suspend`
#[derive(Debug, Clone, Args)]
pub struct TenantSuspend {
    /// Tenant id.
    pub id: String,
    /// Why; logged sealed with the tenant's key, unreadable once it is erased.
    #[arg(long)]
    pub reason: Option<String>,
    /// Also stop every lease of the tenant; otherwise running leases run
    /// on and waiting ones wait.
    #[arg(long)]
    pub stop_leases: bool,
}

/// `lh tenant set-quota`
#[derive(Debug, Clone, Args)]
pub struct TenantSetQuota {
    /// Tenant id.
    pub id: String,
    /// Most GPUs the tenant may hold at once.
    #[arg(long, value_name = "N")]
    pub max_gpus: u32,
    /// Most VRAM the tenant may hold at once, in GB; unlimited when absent.
    #[arg(long, value_name = "GB")]
    pub max_vram_gb: Option<u32>,
    /// Most object storage the tenant may hold, in GB (10^9 bytes);
    /// unlimited when absent, none at 0.
    #[arg(long, value_name = "GB")]
    pub max_storage_gb: Option<u32>,
    /// Weight in fair sharing, 1 to 1000; unchanged when absent.
    #[arg(long)]
    pub weight: Option<u32>,
}

/// `lh tenant key ...`
#[derive(Debug, Clone, Subcommand)]
pub enum KeyCommand {
    /// Issue another key and print it (shown only once).
    Create(KeyCreate),
    /// List the tenant's keys (ids, prefixes, states; never the secrets).
    #[command(visible_alias = "list")]
    Ls(TenantId),
    /// Revoke a key: it is refused from the moment this returns.
    Revoke(KeyRevoke),
}

/// `lh tenant key create`
#[derive(Debug, Clone, Args)]
pub struct KeyCreate {
    /// Tenant id.
    pub id: String,
    /// When the key stops working (RFC 3339, e.g. 2027-06-30T00:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub expires_at: Option<DateTime<Utc>>,
}

/// `lh tenant key revoke`
#[derive(Debug, Clone, Args)]
pub struct KeyRevoke {
    /// Tenant id.
    pub id: String,
    /// The key's id, as `lh tenant key ls` shows it.
    pub key_id: u32,
}

/// `lh tenant create`
#[derive(Debug, Clone, Args)]
pub struct TenantCreate {
    /// Display name of the tenant.
    #[arg(long)]
    pub name: String,
    /// Contact e-mail address.
    #[arg(long)]
    pub email: String,
    /// Most GPUs the tenant may hold at once.
    #[arg(long, value_name = "N")]
    pub max_gpus: u32,
    /// Most object storage the tenant may hold, in GB (10^9 bytes);
    /// unlimited when absent, none at 0.
    #[arg(long, value_name = "GB")]
    pub max_storage_gb: Option<u32>,
    /// Seconds of zero GPU use after which a lease is idle (with --idle-action).
    #[arg(long, value_name = "SECS", requires = "idle_action")]
    pub idle_window_secs: Option<u64>,
    /// What happens to an idle lease (the node-agents' default otherwise).
    #[arg(long, value_enum, requires = "idle_window_secs")]
    pub idle_action: Option<IdleAction>,
    /// Vouch for the tenant: its leases may also run on nodes that do not
    /// isolate workloads (process runtime).
    #[arg(long)]
    pub trusted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::cli::Command;
    use crate::args::test_parse::parse;
    use clap::error::ErrorKind;

    #[test]
    fn tenant_create() {
        let cli = parse(&[
            "tenant",
            "create",
            "--name",
            "acme",
            "--email",
            "ops@acme.test",
            "--max-gpus",
            "8",
        ])
        .unwrap();
        let Command::Tenant(TenantCommand::Create(t)) = cli.command else {
            panic!("wrong command: {:?}", cli.command)
        };
        assert_eq!(t.name, "acme");
        assert_eq!(t.email, "ops@acme.test");
        assert_eq!(t.max_gpus, 8);
        assert_eq!(t.max_storage_gb, None, "no storage limit unless said");
        assert!(!t.trusted, "not trusted unless said");
        let cli = parse(&[
            "tenant",
            "create",
            "--name",
            "a",
            "--email",
            "e",
            "--max-gpus",
            "1",
            "--trusted",
            "--max-storage-gb",
            "0",
        ])
        .unwrap();
        let Command::Tenant(TenantCommand::Create(t)) = cli.command else {
            panic!("wrong command: {:?}", cli.command)
        };
        assert!(t.trusted);
        assert_eq!(t.max_storage_gb, Some(0));
    }

    #[test]
    fn tenant_ls_takes_a_page_size_and_where_to_start() {
        let cli = parse(&["tenant", "ls"]).unwrap();
        let Command::Tenant(TenantCommand::Ls(l)) = cli.command else {
            panic!("wrong command: {:?}", cli.command)
        };
        assert_eq!((l.limit, l.after), (None, None));
        let cli = parse(&["tenant", "ls", "--limit", "2", "--after", "t1"]).unwrap();
        let Command::Tenant(TenantCommand::Ls(l)) = cli.command else {
            panic!("wrong command: {:?}", cli.command)
        };
        assert_eq!((l.limit, l.after.as_deref()), (Some(2), Some("t1")));
    }

    #[test]
    fn tenant_create_needs_all_fields() {
        let e = parse(&["tenant", "create", "--name", "acme"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
        let e = parse(&[
            "tenant",
            "create",
            "--name",
            "a",
            "--email",
            "e",
            "--max-gpus",
            "-3",
        ])
        .unwrap_err();
        assert_ne!(e.kind(), ErrorKind::DisplayHelp);
    }
}
