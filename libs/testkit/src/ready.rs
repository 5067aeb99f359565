use std::time::{Duration, Instant};

use lh_service::Running;

/// How often readiness is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Waits until the service `name` started as `running` reports ready (what
/// its `/readyz` answers). Panics when it stops first or is not ready
/// within `timeout`.
pub async fn wait_ready(name: &str, running: &Running, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !running.readiness.is_ready() {
        assert!(!running.is_finished(), "{name} stopped while starting");
        assert!(
            Instant::now() < deadline,
            "{name} was not ready within {timeout:?}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
