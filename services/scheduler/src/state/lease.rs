//! A lease as the scheduler tracks it, and its tenant.

use chrono::{DateTime, Utc};
use lh_events::{GpuFraction, Quota, Tier};
use uuid::Uuid;

use super::*;
use crate::planner::Ask;

#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    Requested,
    Queued {
        reason: String,
        position: u32,
    },
    /// Placed or running: holds GPUs until it ends.
    Holding,
    /// Idle and suspended by its node: holds nothing, waits for a resume.
    Suspended,
}

#[derive(Debug, Clone)]
pub struct Lease {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub gpus: u32,
    /// A share of one GPU instead of whole GPUs.
    pub fraction: Option<GpuFraction>,
    /// A MIG instance of this profile instead of whole GPUs.
    pub mig_profile: Option<String>,
    pub gpu_model: String,
    pub tier: Tier,
    pub priority: i32,
    pub status: Status,
    pub stop_requested: bool,
    /// When it joined the queue: its request, or its resume.
    pub requested_at: DateTime<Utc>,
    /// It was placed at least once (a quota breach then queues it, never
    /// rejects it).
    pub placed_before: bool,
    /// Sequence of `lease.requested`: first come, first served.
    pub requested_sequence: u64,
    /// Last stream sequence on this lease's subject.
    pub subject_sequence: u64,
    pub correlation_id: Uuid,
    pub request_event_id: Uuid,
    /// Where it runs, once placed.
    pub node_id: Option<String>,
    pub vram_gb: u32,
    pub started_at: Option<DateTime<Utc>>,
    /// Set once this spot lease has been told it will be preempted.
    pub preemption_deadline: Option<DateTime<Utc>>,
}

impl Lease {
    pub(super) fn milli(&self) -> u64 {
        match (self.fraction, &self.mig_profile) {
            (Some(f), _) => u64::from(f.milli),
            (None, Some(p)) => mig_size(&self.gpu_model, p).map_or(0, |s| u64::from(s.0)),
            (None, None) => u64::from(self.gpus) * MILLI_PER_GPU,
        }
    }

    /// Whole GPUs: the only leases that preempt or hold GPUs back.
    pub fn is_whole(&self) -> bool {
        self.fraction.is_none() && self.mig_profile.is_none()
    }

    /// The request field a quota breach names.
    pub(super) fn size_field(&self) -> &'static str {
        match (self.fraction, &self.mig_profile) {
            (Some(_), _) => "gpu_fraction",
            (None, Some(_)) => "mig_profile",
            (None, None) => "gpus",
        }
    }

    pub fn ask(&self) -> Ask {
        match (self.fraction, &self.mig_profile) {
            (Some(f), _) => Ask::Fraction {
                milli: f.milli,
                vram_gb: f.vram_gb,
            },
            (None, Some(p)) => Ask::Mig {
                profile: lh_placement::mig::profiles(&self.gpu_model)
                    .iter()
                    .find(|x| x.name == p)
                    .map_or("", |x| x.name),
            },
            (None, None) => Ask::Whole(self.gpus),
        }
    }
}

/// `(milli, VRAM GB)` an instance of `profile` of `model` takes.
pub(super) fn mig_size(model: &str, profile: &str) -> Option<(u16, u32)> {
    let g = lh_placement::mig::geometry(model)?;
    g.profile(profile).map(|p| lh_placement::mig::size(p, g))
}

#[derive(Debug, Clone, Copy)]
pub struct Tenant {
    pub quota: Quota,
    pub weight: u32,
}
