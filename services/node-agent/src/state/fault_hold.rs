//! How a workload that dies with a GPU fault is told from one that fails by
//! itself: the limits on holding its lease for the scheduler to move, and
//! the verdict on a non-zero exit. Part of the pure state, since the
//! decision turns on it; the GPU flags only set the limits.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lh_events::GpuHealth;

use super::{LocalLease, NodeState};

/// Default of `--gpu-fault-hold-secs`: a GPU's fault event trails the
/// death of what ran on it by a sampling period or so.
pub const DEFAULT_GPU_FAULT_HOLD_SECS: u64 = 5;
/// Default of `--gpu-fault-move-wait-secs`: the scheduler moves a lease off
/// an unhealthy GPU within seconds of the log saying so; this much longer
/// means it is not coming (the health change never reached the log, the
/// scheduler is down).
pub const DEFAULT_GPU_FAULT_MOVE_WAIT_SECS: u64 = 120;

/// How a workload that dies with a GPU fault is told from one that fails by
/// itself. A critical fault (an XID 79, a double-bit ECC error) kills what
/// runs on the GPU, and the driver's event and the process's exit race: the
/// exit is often heard first. Such a lease is the platform's to move, as a
/// running lease on a GPU turned unhealthy is, not the tenant's failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FaultHold {
    /// After a non-zero exit, how long one of the lease's GPUs may still
    /// turn unhealthy for the exit to count as the GPU's doing.
    pub(crate) hold: Duration,
    /// How long a lease held for a GPU fault waits for the scheduler's
    /// `lease.migrated` before it ends `failed` after all.
    pub(crate) move_wait: Duration,
}

impl Default for FaultHold {
    fn default() -> Self {
        Self {
            hold: Duration::from_secs(DEFAULT_GPU_FAULT_HOLD_SECS),
            move_wait: Duration::from_secs(DEFAULT_GPU_FAULT_MOVE_WAIT_SECS),
        }
    }
}

/// What a workload's non-zero exit comes to, given its GPUs' health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FaultVerdict {
    /// Its own failure: the lease ends `failed`.
    Workload,
    /// A GPU of the lease is unhealthy, or may still turn so: the lease is
    /// held, its GPUs with it, for the scheduler to move.
    Hold,
    /// Held for a GPU fault, and no move came in time.
    MoveOverdue,
}

impl NodeState {
    /// Whether the non-zero exit of a lease's workload, heard at
    /// `lease.exited_at`, was a GPU's fault at `now`. A GPU unhealthy in the
    /// tracker or on the log is the platform's fault, even with an
    /// application XID charged too (a GPU falling off the bus fails the
    /// CUDA calls of what runs on it).
    pub(super) fn gpu_fault_verdict(&self, lease: &LocalLease, now: DateTime<Utc>) -> FaultVerdict {
        // Heard when the agent did not note it: as good as long ago.
        let heard = lease.exited_at.unwrap_or(DateTime::<Utc>::MIN_UTC);
        let since = (now - heard).to_std().unwrap_or_default();
        let unhealthy = lease.gpus.iter().any(|g| {
            self.unhealthy_gpus.contains(&g.index)
                || self.gpu_health.get(&g.index) == Some(&GpuHealth::Unhealthy)
        });
        if unhealthy {
            if since < self.fault_hold.move_wait {
                FaultVerdict::Hold
            } else {
                FaultVerdict::MoveOverdue
            }
        } else if !lease.application_fault && since < self.fault_hold.hold {
            FaultVerdict::Hold
        } else {
            FaultVerdict::Workload
        }
    }
}
