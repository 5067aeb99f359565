//! The flags of `lh workspace ...`: a tenant's workspaces on its own
//! bucket, each the directory its leases read and write, with a snapshot a
//! day.

use clap::{Args, Subcommand};

/// `lh workspace ...`
#[derive(Debug, Clone, Subcommand)]
pub enum WorkspaceCommand {
    /// List the tenant's workspaces: size, last sync, the lease that holds
    /// it, and its snapshots.
    #[command(visible_alias = "list")]
    Ls(WorkspaceList),
    /// Take today's snapshot of a workspace now, as the daily one is taken:
    /// one to come back to before a risky run.
    Snapshot(WorkspaceName),
    /// Set a workspace back to one of its snapshots; the next lease that
    /// mounts it starts from there. Refused while a lease holds it.
    Restore(WorkspaceRestore),
    /// Remove a workspace and its snapshots. Refused while a lease holds it.
    Rm(WorkspaceName),
}

/// `lh workspace ls`
#[derive(Debug, Clone, Args)]
pub struct WorkspaceList {
    /// Whose workspaces (operators; a tenant lists its own).
    #[arg(long, value_name = "ID")]
    pub tenant_id: Option<String>,
}

/// `lh workspace snapshot|rm NAME`
#[derive(Debug, Clone, Args)]
pub struct WorkspaceName {
    /// The workspace, as leases name it (`--workspace NAME:/PATH`).
    pub name: String,
}

/// `lh workspace restore`
#[derive(Debug, Clone, Args)]
pub struct WorkspaceRestore {
    pub name: String,
    /// The snapshot's day, YYYY-MM-DD (`lh workspace ls` shows them).
    #[arg(long, value_name = "YYYY-MM-DD")]
    pub snapshot: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::cli::Command;
    use crate::args::test_parse::parse;

    #[test]
    fn workspace_commands() {
        let cli = parse(&["workspace", "restore", "ckpt", "--snapshot", "2026-12-07"]).unwrap();
        let Command::Workspace(WorkspaceCommand::Restore(restore)) = cli.command else {
            panic!("wrong command: {:?}", cli.command)
        };
        assert_eq!(
            (restore.name.as_str(), restore.snapshot.as_str()),
            ("ckpt", "2026-12-07")
        );
        assert!(
            parse(&["workspace", "restore", "ckpt"]).is_err(),
            "a snapshot is needed"
        );
        let cli = parse(&["workspace", "list"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Workspace(WorkspaceCommand::Ls(_))
        ));
        let cli = parse(&["workspace", "rm", "ckpt"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Workspace(WorkspaceCommand::Rm(_))
        ));
    }
}
