//! What a supervisor task watches: a workload the runtime started, or one
//! a restarted agent found and adopted; the same questions of both.

use std::time::Duration;

use lh_events::LeaseFailure;

use super::super::door::DoorTarget;
use super::super::reconcile::Adopted;
use super::super::{Exit, RunningWorkload, RuntimeError};

/// What a supervisor task watches: a workload it started, or one it found.
pub(super) enum Supervised {
    Started(Box<RunningWorkload>),
    Adopted(Adopted),
}

impl Supervised {
    pub(super) async fn wait(&mut self) -> Result<Exit, RuntimeError> {
        match self {
            Supervised::Started(w) => w.wait().await,
            Supervised::Adopted(a) => Ok(a.wait().await),
        }
    }

    pub(super) async fn stop(&mut self, grace: Duration) -> Result<Exit, RuntimeError> {
        match self {
            Supervised::Started(w) => w.stop(grace).await.map(|s| s.exit),
            Supervised::Adopted(a) => Ok(a.stop(grace).await),
        }
    }

    /// Tells it of its preemption; whether it was told.
    pub(super) async fn notify(&self) -> bool {
        match self {
            Supervised::Started(w) => w.notify().await,
            Supervised::Adopted(Adopted::Container { engine, name, .. }) => {
                super::super::container::run_signal_command(
                    engine,
                    name,
                    super::super::NOTICE_SIGNAL,
                )
                .await
            }
            Supervised::Adopted(Adopted::Process { .. }) => false,
        }
    }

    /// Whether it ran (an adopted one did).
    pub(super) fn ran(&self) -> bool {
        match self {
            Supervised::Started(w) => w.ran(),
            Supervised::Adopted(_) => true,
        }
    }

    /// How a session enters it.
    pub(super) fn door(&self) -> Option<DoorTarget> {
        match self {
            Supervised::Started(w) => w.door(),
            Supervised::Adopted(a) => a.door(),
        }
    }

    /// Why it failed, as its runtime saw it.
    pub(super) fn failure(&self) -> Option<LeaseFailure> {
        match self {
            Supervised::Started(w) => w.failure(),
            Supervised::Adopted(a) => a.failure(),
        }
    }
}
