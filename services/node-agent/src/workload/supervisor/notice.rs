//! A spot preemption told to a running workload: a file in a directory of
//! the lease's own, mounted read-only at `/run/leasehold` in its
//! container, and a signal.

use std::path::{Path, PathBuf};

use uuid::Uuid;

use super::supervised::Supervised;

/// A spot preemption, as its workload is told.
#[derive(Debug, Clone, Copy)]
pub struct Notice {
    pub deadline: chrono::DateTime<chrono::Utc>,
    pub reason: lh_events::PreemptionReason,
}

/// Where the notices of a lease's run here are kept (and mounted from).
pub(super) fn notice_dir(state_dir: &Path, lease_id: Uuid, placement: u64) -> PathBuf {
    state_dir
        .join("notices")
        .join(format!("{lease_id}-{placement}"))
}

/// A fresh, empty directory every user may read (the container's user
/// is another's on the host).
pub(super) fn make_notice_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

/// Writes `notice.json` (whole or not at all), then signals the workload.
pub(super) async fn tell_notice(
    lease_id: Uuid,
    handle: &Supervised,
    dir: Option<&Path>,
    notice: &Notice,
) {
    if let Some(dir) = dir {
        let json = serde_json::json!({
            "event": "preemption",
            "deadline": notice.deadline,
            "reason": notice.reason.as_str(),
        });
        let tmp = dir.join(".notice.json.tmp");
        let written = std::fs::write(&tmp, format!("{json}\n"))
            .and_then(|()| std::fs::rename(&tmp, dir.join("notice.json")));
        if let Err(e) = written {
            tracing::warn!(lease = %lease_id, error = %e, "cannot write the preemption notice");
        }
    }
    let told = handle.notify().await;
    tracing::info!(lease = %lease_id, deadline = %notice.deadline, signalled = told,
        "workload told of its preemption");
    metrics::counter!("lh_node_preemption_notices_total").increment(1);
}
