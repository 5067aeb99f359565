//! `lh lease get --wait STATE`: polls the lease until it reaches the state
//! (or passed it between two polls), ends or is rejected, or time runs out.
//! Progress goes to stderr, one line per change, so that stdout holds only
//! the last lease view.

use std::time::Duration;

use lh_domain::lease::LeaseState;
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

fn wait_step(state: &str, target: LeaseState) -> WaitStep {
    match LeaseState::try_from(state.to_string()) {
        Ok(now) if now == target || has_passed(now, target) => WaitStep::Reached,
        Ok(now) if now.is_final() => WaitStep::Finished,
        _ => WaitStep::Pending,
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
fn progress_line(id: &str, lease: &Value, target: LeaseState) -> String {
    let state = lease.get("state").and_then(Value::as_str).unwrap_or("?");
    let mut notes = Vec::new();
    if let Some(pos) = lease.get("queue_position").filter(|v| !v.is_null()) {
        notes.push(format!("#{pos}"));
    }
    for key in ["queued_reason", "rejected_reason", "end_reason", "failure"] {
        if let Some(reason) = lease.get(key).and_then(Value::as_str) {
            notes.push(reason.to_string());
        }
    }
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
        let lease = gw.get(&["v1", "leases", id], &[]).await?;
        let state = lease
            .get("state")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let line = progress_line(id, &lease, target);
        if line != last_line {
            let _ = writeln!(err, "{line}");
            last_line = line;
        }
        match wait_step(&state, target) {
            WaitStep::Reached => return Ok((lease, EXIT_OK)),
            WaitStep::Finished => {
                let _ = writeln!(
                    err,
                    "error: lease {id} is {state} and will not become {target}"
                );
                return Ok((lease, EXIT_FAILURE));
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
            return Ok((lease, EXIT_FAILURE));
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
        assert_eq!(wait_step("running", Running), WaitStep::Reached);
        assert_eq!(wait_step("running", Placed), WaitStep::Reached);
        assert_eq!(wait_step("queued", Running), WaitStep::Pending);
        assert_eq!(wait_step("requested", Queued), WaitStep::Pending);
        assert_eq!(wait_step("ended", Running), WaitStep::Finished);
        assert_eq!(wait_step("rejected", Running), WaitStep::Finished);
        assert_eq!(wait_step("ended", Ended), WaitStep::Reached);
        assert_eq!(wait_step("rejected", Rejected), WaitStep::Reached);
        assert_eq!(wait_step("ended", Rejected), WaitStep::Finished);
        assert_eq!(wait_step("hibernating", Running), WaitStep::Pending);
        assert_eq!(wait_step("", Running), WaitStep::Pending);
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

    #[test]
    fn progress_lines() {
        let lease = json!({"state": "queued", "queue_position": 2, "queued_reason": "no capacity"});
        assert_eq!(
            progress_line("L1", &lease, LeaseState::Running),
            "waiting for lease L1 to be running: queued (#2, no capacity)"
        );
        let lease = json!({"state": "placed", "queue_position": null});
        assert_eq!(
            progress_line("L1", &lease, LeaseState::Running),
            "waiting for lease L1 to be running: placed"
        );
    }
}
