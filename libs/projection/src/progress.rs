//! What a running projection tells the rest of its service: how far its
//! tables reach, whether they caught up with the log, whether it is stalled
//! on the database. Handlers wait on it for read-your-writes.

use std::time::Duration;

use tokio::sync::watch;

/// Where a running projection stands; cheap to clone and share with handlers.
#[derive(Clone)]
pub struct Progress {
    applied: watch::Receiver<u64>,
    caught_up: watch::Receiver<bool>,
    stalled: watch::Receiver<bool>,
}

impl Progress {
    /// The view of a runner that publishes through these three channels.
    pub(crate) fn new(
        applied: watch::Receiver<u64>,
        caught_up: watch::Receiver<bool>,
        stalled: watch::Receiver<bool>,
    ) -> Self {
        Self {
            applied,
            caught_up,
            stalled,
        }
    }

    /// True while the projection cannot write to the database (it retries).
    pub fn stalled(&self) -> bool {
        *self.stalled.borrow()
    }

    /// Waits until [`Progress::stalled`] changes; false once the
    /// projection has ended.
    pub async fn stalled_changed(&mut self) -> bool {
        self.stalled.changed().await.is_ok()
    }

    /// Highest stream sequence reflected in the tables.
    pub fn applied(&self) -> u64 {
        *self.applied.borrow()
    }

    /// True once the projection has replayed the log up to its head.
    pub fn caught_up(&self) -> bool {
        *self.caught_up.borrow()
    }

    /// Waits until the tables reflect `sequence` (read-your-writes for an
    /// API that just appended an event). False on timeout.
    pub async fn wait_for(&self, sequence: u64, timeout: Duration) -> bool {
        let mut rx = self.applied.clone();
        tokio::time::timeout(timeout, rx.wait_for(|s| *s >= sequence))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    /// Waits until the projection first reaches the head of the log.
    pub async fn wait_caught_up(&self, timeout: Duration) -> bool {
        let mut rx = self.caught_up.clone();
        tokio::time::timeout(timeout, rx.wait_for(|c| *c))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }
}
