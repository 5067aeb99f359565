//! The flags of `lh audit ...`: which records to read, and for `verify`
//! where the log is and the key its checkpoints must be signed with.

use clap::{Args, Subcommand, ValueEnum};

/// `lh audit ...`
#[derive(Debug, Clone, Subcommand)]
pub enum AuditCommand {
    /// Verify the audit log's hash chain; exits 1 when it is broken. With
    /// `--nats-url` and a pinned key, reads the log itself and trusts
    /// nothing but the key; without them, asks the gateway.
    Verify(AuditVerify),
    /// One page of the audit records, filtered (operators: any tenant's;
    /// a tenant: its own).
    Events(AuditEvents),
    /// Every record from a sequence or a time on, in log order, one JSON
    /// object a line, page after page until the end.
    Replay(AuditReplay),
    /// Every record of a tenant as JSON lines or CSV; or with `--subject`,
    /// everything the platform holds about a tenant, in one JSON document.
    Export(AuditExport),
}

/// Filters of the audit records.
#[derive(Debug, Clone, Default, Args)]
pub struct AuditFilter {
    /// Only this tenant's records.
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
    /// Only records caused by this principal (`tenant:<id>`,
    /// `admin:<name>`, `auditor:<name>`, `service:<name>`, `node:<id>`).
    #[arg(long, value_name = "PRINCIPAL")]
    pub actor: Option<String>,
    /// Only records of this event type, e.g. `lease.placed`.
    #[arg(long = "type", value_name = "EVENT_TYPE")]
    pub event_type: Option<String>,
    /// Only records that occurred at or after this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// Only records that occurred before this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,
}

/// `lh audit events`
#[derive(Debug, Clone, Args)]
pub struct AuditEvents {
    #[command(flatten)]
    pub filter: AuditFilter,
    /// Only records after this stream sequence (a page's `next`).
    #[arg(long, value_name = "SEQ")]
    pub after: Option<u64>,
    /// Records in the page (1 to 1000; 100 by default).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: Option<u32>,
}

/// `lh audit replay`
#[derive(Debug, Clone, Args)]
pub struct AuditReplay {
    /// Where to start: a stream sequence (that record included) or an RFC
    /// 3339 time.
    #[arg(long, value_name = "SEQ|TIME", default_value = "1")]
    pub from: String,
}

/// Format of `lh audit export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// One JSON record a line.
    Jsonl,
    /// One row a record; cells that could run as formulas are defused.
    Csv,
}

/// `lh audit export`
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("whose").required(true).args(["tenant", "subject"])))]
pub struct AuditExport {
    /// Whose records.
    #[arg(long, value_name = "TENANT_ID")]
    pub tenant: Option<String>,
    #[arg(long, value_enum, default_value_t = ExportFormat::Jsonl)]
    pub format: ExportFormat,
    /// A data subject's access request: everything held about this tenant
    /// (the tenant, its invoices, every record of it) in one JSON document.
    #[arg(long, value_name = "TENANT_ID", conflicts_with = "format")]
    pub subject: Option<String>,
}

/// Stream the log read by `lh audit verify` when none is named.
pub const DEFAULT_AUDIT_STREAM: &str = "LH_EVENTS";

/// `lh audit verify`
#[derive(Debug, Clone, Default, Args)]
pub struct AuditVerify {
    /// NATS server(s) to read the log from, comma-separated. Credentials
    /// come from `LH_NATS_USER` with `LH_NATS_NKEY_SEED_FILE` (the
    /// deployment's `auditor` user), TLS from `LH_NATS_CA_FILE`.
    #[arg(long, env = "LH_NATS_URL", value_name = "URL")]
    pub nats_url: Option<String>,
    /// The audit service's ed25519 public key (64 hex digits), obtained out
    /// of band: every checkpoint must be signed by it.
    #[arg(long, value_name = "HEX", conflicts_with = "public_key_file")]
    pub public_key: Option<String>,
    /// A file holding the pinned public key as hex.
    #[arg(long, value_name = "PATH")]
    pub public_key_file: Option<std::path::PathBuf>,
    /// The JetStream stream holding the log.
    #[arg(long, default_value = DEFAULT_AUDIT_STREAM, value_name = "NAME")]
    pub stream: String,
    /// Start from a checkpoint an earlier run verified: its
    /// `SEQUENCE:EVENTS:HEAD:SIGNATURE`, or a file `--save-state` wrote.
    /// Its signature is checked again with the pinned key.
    #[arg(long, value_name = "TOKEN|PATH")]
    pub resume_from: Option<String>,
    /// When the chain verifies, write its last verified checkpoint here
    /// (JSON), for `--resume-from` next time.
    #[arg(long, value_name = "PATH")]
    pub save_state: Option<std::path::PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::cli::Command;
    use crate::args::test_parse::parse;

    #[test]
    fn audit_verify() {
        let cli = parse(&["audit", "verify"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Audit(AuditCommand::Verify(AuditVerify { nats_url: None, .. }))
        ));
        let cli = parse(&[
            "audit",
            "verify",
            "--nats-url",
            "nats://h:4222",
            "--public-key",
            "ab",
            "--stream",
            "COPY",
        ])
        .unwrap();
        let Command::Audit(AuditCommand::Verify(v)) = cli.command else {
            panic!("audit verify")
        };
        assert_eq!(v.nats_url.as_deref(), Some("nats://h:4222"));
        assert_eq!(v.stream, "COPY");
        assert!(parse(&[
            "audit",
            "verify",
            "--public-key",
            "ab",
            "--public-key-file",
            "k"
        ])
        .is_err());
    }

    #[test]
    fn audit_queries() {
        let cli = parse(&["audit", "events", "--type", "lease.placed", "--limit", "5"]).unwrap();
        let Command::Audit(AuditCommand::Events(e)) = cli.command else {
            panic!("not audit events");
        };
        assert_eq!(e.filter.event_type.as_deref(), Some("lease.placed"));
        assert_eq!(e.limit, Some(5));
        assert!(parse(&["audit", "events", "--limit", "1001"]).is_err());
        let cli = parse(&["audit", "export", "--tenant", "t", "--format", "csv"]).unwrap();
        let Command::Audit(AuditCommand::Export(x)) = cli.command else {
            panic!("not audit export");
        };
        assert_eq!(x.format, ExportFormat::Csv);
        assert!(parse(&["audit", "export"]).is_err(), "whose records?");
        assert!(parse(&["audit", "export", "--subject", "t", "--format", "csv"]).is_err());
    }
}
