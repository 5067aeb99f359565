//! The flags of `lh ssh-key ...`: the SSH public keys with which a
//! tenant's people enter its leases (`ssh -p 2222 <lease-id>@<gateway>`).

use std::path::PathBuf;

use clap::{Args, Subcommand};

/// `lh ssh-key ...`
#[derive(Debug, Clone, Subcommand)]
pub enum SshKeyCommand {
    /// Register an SSH public key of this tenant (with the tenant's API key).
    Add(SshKeyAdd),
    /// List the tenant's SSH keys: ids, names, fingerprints.
    #[command(visible_alias = "list")]
    Ls(SshKeyList),
    /// Remove an SSH key: it lets nobody in from the moment this returns.
    Rm(SshKeyRemove),
}

/// `lh ssh-key add`
#[derive(Debug, Clone, Args)]
pub struct SshKeyAdd {
    /// The public key's file (`.pub`); by default the first of
    /// ~/.ssh/id_ed25519.pub, ~/.ssh/id_ecdsa.pub and ~/.ssh/id_rsa.pub
    /// that exists.
    pub file: Option<PathBuf>,
    /// What to call the key (1 to 64 characters; it is kept on the log in
    /// clear); by default the file's name, never the key's comment.
    #[arg(long)]
    pub name: Option<String>,
}

/// `lh ssh-key ls`
#[derive(Debug, Clone, Args)]
pub struct SshKeyList {
    /// Whose keys (operators; a tenant lists its own).
    #[arg(long, value_name = "ID")]
    pub tenant_id: Option<String>,
}

/// `lh ssh-key rm`
#[derive(Debug, Clone, Args)]
pub struct SshKeyRemove {
    /// The key's id, as `lh ssh-key ls` shows it.
    pub id: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::cli::Command;
    use crate::args::test_parse::parse;

    #[test]
    fn ssh_key_commands() {
        let cli = parse(&["ssh-key", "add", "--name", "laptop", "/tmp/k.pub"]).unwrap();
        let Command::SshKey(SshKeyCommand::Add(add)) = cli.command else {
            panic!("wrong command: {:?}", cli.command)
        };
        assert_eq!(add.name.as_deref(), Some("laptop"));
        assert_eq!(add.file, Some(PathBuf::from("/tmp/k.pub")));
        let cli = parse(&["ssh-key", "add"]).unwrap();
        let Command::SshKey(SshKeyCommand::Add(add)) = cli.command else {
            panic!("wrong command: {:?}", cli.command)
        };
        assert_eq!((add.name, add.file), (None, None));
        let cli = parse(&["ssh-key", "list", "--json"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::SshKey(SshKeyCommand::Ls(SshKeyList { tenant_id: None }))
        ));
        let cli = parse(&["ssh-key", "rm", "0190d1c4-7f3a-7000-8000-000000000001"]).unwrap();
        let Command::SshKey(SshKeyCommand::Rm(rm)) = cli.command else {
            panic!("wrong command: {:?}", cli.command)
        };
        assert_eq!(rm.id, "0190d1c4-7f3a-7000-8000-000000000001");
        assert!(parse(&["ssh-key", "rm"]).is_err());
    }
}
