//! `lh lease get --wait STATE`: polls the lease until it reaches the state
//! (or passed it between two polls), ends or is rejected, or time runs out.
//! Progress goes to stderr, one line per change, so that stdout holds only
//! the last lease view.

use std::time::Duration;

use lh_domain::lease::LeaseState;
use lh_rpc::http::leases::LeaseView;
use serde_json::Value;
use tokio::time::Instant;

use crate::client::Gateway;
use crate::error::{EXIT_FAILURE, EXIT_OK};
use crate::output::Out;

/// How often `lease get --wait` polls.
pub const WAIT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// What a poll of `lease get --wait` found.
#[derive(Debug, PartialEq, Eq)]
enum WaitStep {
    /// The lease is in the state waited for, or has passed it.
    Reached,
    /// The lease ended or was rejected and will never get there.
    Finished,
    /// Not yet.
    Pending,
}

fn wait_step(now: LeaseState, target: LeaseState) -> WaitStep {
    if now == target || has_passed(now, target) {
        WaitStep::Reached
    } else if now.is_final() {
        WaitStep::Finished
    } else {
        WaitStep::Pending
    }
}

/// Position along requested → queued → placed → running → ended.
/// `rejected` and `suspended` are off that path and have no rank.
fn rank(state: LeaseState) -> Option<u8> {
    match state {
        LeaseState::Requested => Some(0),
        LeaseState::Queued => Some(1),
        LeaseState::Placed => Some(2),
        LeaseState::Running => Some(3),
        LeaseState::Ended => Some(4),
        // Off the path: a resume sends it back to requested.
        LeaseState::Suspended | LeaseState::Rejected => None,
    }
}

/// Whether a lease now in `now` has passed `target` on its way forward
/// without being finished (e.g. `running` has passed `placed`), so that a
/// wait for `target` that missed the moment between two polls succeeds.
fn has_passed(now: LeaseState, target: LeaseState) -> bool {
    if now.is_final() {
        return false;
    }
    match (rank(now), rank(target)) {
        (Some(now), Some(want)) => now > want,
        _ => false,
    }
}

/// One line of progress: `lease L: queued (#3, no capacity)`.
fn progress_line(id: &str, lease: &LeaseView, target: LeaseState) -> String {
    let state = lease.state;
    let mut notes = Vec::new();
    if let Some(pos) = lease.queue_position {
        notes.push(format!("#{pos}"));
    }
    let reasons = [
        &lease.queued_reason,
        &lease.rejected_reason,
        &lease.end_reason,
        &lease.failure,
    ];
    notes.extend(reasons.into_iter().flatten().cloned());
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    format!("waiting for lease {id} to be {target}: {state}{notes}")
}

/// Polls the lease every [`WAIT_POLL_INTERVAL`] until it reaches `target`,
/// finishes, or `timeout` passes; reports each state change on `err`.
/// Returns the last lease view and the exit code.
pub(super) async fn wait_for(
    gw: &Gateway,
    id: &str,
    target: LeaseState,
    timeout: Duration,
    err: Out<'_>,
) -> anyhow::Result<(Value, i32)> {
    let deadline = Instant::now() + timeout;
    let mut last_line = String::new();
    loop {
        let (lease, answer) = gw.get_as::<LeaseView>(&["v1", "leases", id], &[]).await?;
        let state = lease.state;
        let line = progress_line(id, &lease, target);
        if line != last_line {
            let _ = writeln!(err, "{line}");
            last_line = line;
        }
        match wait_step(state, target) {
            WaitStep::Reached => return Ok((answer, EXIT_OK)),
            WaitStep::Finished => {
                let _ = writeln!(
                    err,
                    "error: lease {id} is {state} and will not become {target}"
                );
                return Ok((answer, EXIT_FAILURE));
            }
            WaitStep::Pending => {}
        }
        let now = Instant::now();
        if now >= deadline {
            let _ = writeln!(
                err,
                "error: timed out after {}s waiting for lease {id} to become {target} (state: {state})",
                timeout.as_secs()
            );
            return Ok((answer, EXIT_FAILURE));
        }
        tokio::time::sleep(WAIT_POLL_INTERVAL.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wait_steps() {
        use LeaseState::*;
        assert_eq!(wait_step(Running, Running), WaitStep::Reached);
        assert_eq!(wait_step(Running, Placed), WaitStep::Reached);
        assert_eq!(wait_step(Queued, Running), WaitStep::Pending);
        assert_eq!(wait_step(Requested, Queued), WaitStep::Pending);
        assert_eq!(wait_step(Suspended, Running), WaitStep::Pending);
        assert_eq!(wait_step(Ended, Running), WaitStep::Finished);
        assert_eq!(wait_step(Rejected, Running), WaitStep::Finished);
        assert_eq!(wait_step(Ended, Ended), WaitStep::Reached);
        assert_eq!(wait_step(Rejected, Rejected), WaitStep::Reached);
        assert_eq!(wait_step(Ended, Rejected), WaitStep::Finished);
    }

    #[test]
    fn state_progress() {
        use LeaseState::*;
        assert!(has_passed(Running, Placed));
        assert!(has_passed(Placed, Queued));
        assert!(!has_passed(Queued, Placed));
        assert!(!has_passed(Running, Running));
        assert!(!has_passed(Ended, Running));
        assert!(!has_passed(Rejected, Queued));
        assert!(!has_passed(Running, Rejected));
    }

    fn lease(state: &str, queue_position: Option<i32>, queued_reason: Option<&str>) -> LeaseView {
        serde_json::from_value(json!({
            "id": "0193b7e2-0000-7000-8000-000000000001",
            "tenant_id": "0193b7e2-0000-7000-8000-0000000000aa",
            "state": state, "gpus": 1, "gpu_model": "H100", "tier": "basic", "priority": 0,
            "node_id": null, "zone": null, "gpu_uuids": [], "gpu_indices": [],
            "queued_reason": queued_reason, "queue_position": queue_position,
            "rejected_reason": null, "stop_requested": false, "preemption_deadline": null,
            "end_reason": null, "migrations": 0, "last_migration_reason": null,
            "idle_since": null, "suspended_at": null, "created_at": "2026-12-01T10:00:00Z",
            "placed_at": null, "started_at": null, "ended_at": null
        }))
        .expect("a lease view")
    }

    #[test]
    fn progress_lines() {
        let queued = lease("queued", Some(2), Some("no capacity"));
        assert_eq!(
            progress_line("L1", &queued, LeaseState::Running),
            "waiting for lease L1 to be running: queued (#2, no capacity)"
        );
        let placed = lease("placed", None, None);
        assert_eq!(
            progress_line("L1", &placed, LeaseState::Running),
            "waiting for lease L1 to be running: placed"
        );
    }
}
