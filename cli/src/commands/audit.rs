//! `lh audit ...`: `verify` reads the log itself when a key is pinned (see
//! [`crate::audit`]) and otherwise asks the gateway; both answer "no" with
//! exit code 1 and a reason on stderr. `events`, `replay` and `export` read
//! the records through the gateway (see [`crate::audit_trail`]).

use lh_rpc::audit::VerifyResponse;

use crate::args::AuditCommand;
use crate::client::Gateway;
use crate::error::{EXIT_FAILURE, EXIT_OK};
use crate::output::{emit, Out};
use crate::{audit, audit_trail, render};

/// Runs one `lh audit` command.
pub(crate) async fn run(
    gw: &Gateway,
    command: AuditCommand,
    json: bool,
    out: Out<'_>,
    err: Out<'_>,
) -> anyhow::Result<i32> {
    match command {
        AuditCommand::Verify(v) if audit::reads_the_log(&v)? => {
            let report = audit::verify_stream(&v, err).await?;
            let value = serde_json::to_value(&report)?;
            emit(out, json, &value, render::audit)?;
            if report.ok {
                if let Some(path) = &v.save_state {
                    audit::save_state(path, &report)?;
                }
                Ok(EXIT_OK)
            } else {
                let why = match (&report.first_bad, &report.problem) {
                    (Some(bad), _) => format!(
                        "the checkpoint at stream sequence {} signing sequence {} fails: {}",
                        bad.checkpoint_at,
                        bad.sequence,
                        serde_json::to_value(bad.reason)?
                            .as_str()
                            .unwrap_or_default()
                    ),
                    (None, Some(problem)) => problem.clone(),
                    (None, None) => "not ok".into(),
                };
                let _ = writeln!(err, "error: audit chain verification failed: {why}");
                Ok(EXIT_FAILURE)
            }
        }
        AuditCommand::Verify(_) => {
            let (verdict, report) = gw
                .get_as::<VerifyResponse>(&["v1", "audit", "verify"], &[])
                .await?;
            emit(out, json, &report, render::audit)?;
            if verdict.ok {
                Ok(EXIT_OK)
            } else {
                let _ = writeln!(err, "error: audit chain verification failed");
                Ok(EXIT_FAILURE)
            }
        }
        AuditCommand::Events(e) => audit_trail::events(gw, &e, json, out).await,
        AuditCommand::Replay(r) => audit_trail::replay(gw, &r, out).await,
        AuditCommand::Export(x) => audit_trail::export(gw, &x, out).await,
    }
}
