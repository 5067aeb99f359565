//! Waiting out a database that does not answer: a projection backs off and
//! tries again rather than end, and counts each retry for the operator.

use tokio::sync::watch;

use crate::database::{is_unavailable, RETRY_MAX, RETRY_MIN};
use crate::{ProjectionError, Result};

/// Runs `attempt` until it succeeds or `shutdown` resolves (`None`),
/// backing off between failures and telling `stalled` meanwhile. A
/// projection must never end for an outage: PostgreSQL restarts, and the
/// tables catch up when it is back.
pub(crate) async fn until_done<T, F, Fut>(
    projection: &'static str,
    what: &'static str,
    shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    stalled: &watch::Sender<bool>,
    mut attempt: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut wait = RETRY_MIN;
    loop {
        match attempt().await {
            Ok(value) => {
                if stalled.send_replace(false) {
                    tracing::info!(projection, "the database answers again");
                }
                return Some(value);
            }
            Err(e) => {
                stalled.send_replace(true);
                let outage = matches!(&e, ProjectionError::Database(db) if is_unavailable(db));
                if outage {
                    tracing::warn!(projection, error = %e, retry_in_ms = wait.as_millis() as u64, "cannot {what}: database unavailable");
                } else {
                    tracing::error!(projection, error = %e, retry_in_ms = wait.as_millis() as u64, "cannot {what}");
                }
                metrics::counter!("lh_projection_retries_total", "projection" => projection)
                    .increment(1);
                tokio::select! {
                    _ = shutdown.as_mut() => return None,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(RETRY_MAX);
            }
        }
    }
}
