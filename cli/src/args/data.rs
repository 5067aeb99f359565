//! The flags of `lh data ...`: a tenant's datasets on its own bucket,
//! each a list of immutable versions addressed by content hash.

use std::path::PathBuf;

use clap::{Args, Subcommand};

/// `lh data ...`
#[derive(Debug, Clone, Subcommand)]
pub enum DataCommand {
    /// Upload a directory (or one file) as a new version of a dataset.
    /// Only what the bucket lacks is sent, in 8 MiB chunks: run it again
    /// after an interruption and it goes on where it stopped.
    Put(DataPut),
    /// List the tenant's datasets, or one dataset's versions.
    #[command(visible_alias = "list")]
    Ls(DataList),
    /// Download a version of a dataset into a new directory.
    Get(DataGet),
    /// Remove a dataset, or one version of it. Leases asked for from now
    /// on cannot mount it; running leases keep their copy.
    Rm(DataRemove),
    /// What the tenant's bucket held when last measured, and its storage
    /// quota (the gateway measures each bucket once an interval).
    Usage(DataUsage),
}

/// `lh data put`
#[derive(Debug, Clone, Args)]
pub struct DataPut {
    /// The directory or file to upload.
    pub path: PathBuf,
    /// The dataset's name: 1 to 63 of a-z, 0-9, `-`, `_` and `.`.
    #[arg(long)]
    pub name: String,
}

/// `lh data ls`
#[derive(Debug, Clone, Args)]
pub struct DataList {
    /// One dataset: its versions, newest first.
    pub name: Option<String>,
    /// Whose datasets (operators; a tenant lists its own).
    #[arg(long, value_name = "ID")]
    pub tenant_id: Option<String>,
}

/// `lh data usage`
#[derive(Debug, Clone, Args)]
pub struct DataUsage {
    /// Whose storage (operators; a tenant sees its own).
    #[arg(long, value_name = "ID")]
    pub tenant_id: Option<String>,
}

/// `lh data get`
#[derive(Debug, Clone, Args)]
pub struct DataGet {
    /// NAME or NAME:VERSION (the newest version when none is named).
    #[arg(value_name = "NAME[:VERSION]")]
    pub dataset: String,
    /// A directory to make, which must not exist or be empty.
    pub dest: PathBuf,
}

/// `lh data rm`
#[derive(Debug, Clone, Args)]
pub struct DataRemove {
    /// NAME (every version) or NAME:VERSION (that one).
    #[arg(value_name = "NAME[:VERSION]")]
    pub dataset: String,
}

/// `NAME` or `NAME:VERSION`.
pub fn split_dataset(raw: &str) -> (&str, Option<&str>) {
    match raw.split_once(':') {
        Some((name, version)) => (name, Some(version)),
        None => (raw, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::cli::Command;
    use crate::args::test_parse::parse;

    #[test]
    fn data_commands() {
        let cli = parse(&["data", "put", "./mnist", "--name", "mnist"]).unwrap();
        let Command::Data(DataCommand::Put(put)) = cli.command else {
            panic!("wrong command: {:?}", cli.command)
        };
        assert_eq!(put.name, "mnist");
        assert_eq!(put.path, PathBuf::from("./mnist"));
        let cli = parse(&["data", "get", "mnist:abc", "/tmp/x"]).unwrap();
        let Command::Data(DataCommand::Get(get)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(split_dataset(&get.dataset), ("mnist", Some("abc")));
        assert_eq!(split_dataset("mnist"), ("mnist", None));
        assert!(parse(&["data", "put", "./x"]).is_err(), "a name is needed");
        let cli = parse(&["data", "usage", "--tenant-id", "T1"]).unwrap();
        let Command::Data(DataCommand::Usage(usage)) = cli.command else {
            panic!("wrong command")
        };
        assert_eq!(usage.tenant_id.as_deref(), Some("T1"));
    }
}
