//! A lease as the scheduler tracks it, and its tenant.

use chrono::{DateTime, Utc};
use lh_domain::catalog;
use lh_events::{GpuAsk, GpuFraction, Quota, Tier};
use uuid::Uuid;

use crate::planner::Ask;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Lease {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub gpus: u32,
    /// Whole GPUs, a share of one GPU or a MIG instance.
    pub ask: GpuAsk,
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
    /// Compute it takes, in milli-GPU, and VRAM, in GB: its ask's footprint
    /// in the catalogue, looked up once (quota sums read them every pass).
    pub compute_milli: u64,
    pub vram_gb: u32,
    pub started_at: Option<DateTime<Utc>>,
    /// Set once this spot lease has been told it will be preempted.
    pub preemption_deadline: Option<DateTime<Utc>>,
}

impl Lease {
    pub(super) fn milli(&self) -> u64 {
        self.compute_milli
    }

    /// Whole GPUs: the only leases that preempt or hold GPUs back.
    pub fn is_whole(&self) -> bool {
        matches!(self.ask, GpuAsk::Whole(_))
    }

    /// The share of one GPU it asks for, if it asks for one.
    pub fn fraction(&self) -> Option<GpuFraction> {
        match self.ask {
            GpuAsk::Fraction(f) => Some(f),
            GpuAsk::Whole(_) | GpuAsk::Mig(_) => None,
        }
    }

    /// The request field a quota breach names.
    pub(super) fn size_field(&self) -> &'static str {
        self.ask.field()
    }

    pub fn ask(&self) -> Ask {
        match &self.ask {
            GpuAsk::Fraction(f) => Ask::Fraction {
                milli: f.milli,
                vram_gb: f.vram_gb,
            },
            GpuAsk::Mig(p) => Ask::Mig {
                profile: catalog::profiles(&self.gpu_model)
                    .iter()
                    .find(|x| x.name == p)
                    .map_or("", |x| x.name),
            },
            GpuAsk::Whole(n) => Ask::Whole(*n),
        }
    }
}

#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Tenant {
    pub quota: Quota,
    pub weight: u32,
    /// Its waiting leases wait until it is resumed.
    #[serde(default)]
    pub suspended: bool,
    /// Its leases may run on nodes that do not isolate workloads.
    #[serde(default)]
    pub trusted: bool,
}
