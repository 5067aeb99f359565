//! A lease as the scheduler tracks it, and its tenant.

use chrono::{DateTime, Utc};
use lh_events::{GpuAsk, GpuFraction, LeaseRequested, Quota, Tier};
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::planner::LeaseShape;

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
    /// A gang's members as last placed (node, GPUs there), in node-rank
    /// order; empty for a lease on one node. A gang moved or resumed
    /// restarts on them when they can take it again.
    #[serde(default)]
    pub members: Vec<(String, u32)>,
    /// Compute it takes, in milli-GPU, and VRAM, in GB: its ask's footprint
    /// in the catalogue, looked up once (quota sums read them every pass).
    pub compute_milli: u64,
    pub vram_gb: u32,
    pub started_at: Option<DateTime<Utc>>,
    /// Since when it has waited to start: its request, its resume, or its
    /// return to the queue; `None` once started. The queue wait is read
    /// from it.
    #[serde(default)]
    pub waiting_since: Option<DateTime<Utc>>,
    /// Set once this spot lease has been told it will be preempted.
    pub preemption_deadline: Option<DateTime<Utc>>,
    /// Spot: the most it pays, CNY per GPU-hour.
    #[serde(default)]
    pub max_price_cny_per_gpu_hour: Option<Decimal>,
    /// Zones and regions it may run in (empty: any).
    #[serde(default)]
    pub zones: Vec<String>,
    #[serde(default)]
    pub regions: Vec<String>,
    /// The zone it runs in, once placed.
    #[serde(default)]
    pub zone: Option<String>,
    /// A recovered lease tries this zone first.
    #[serde(default)]
    pub preferred_zone: Option<String>,
    /// Kept only for a spot lease under managed recovery: what is asked
    /// again after a preemption.
    #[serde(default)]
    pub recovery_request: Option<Box<LeaseRequested>>,
}

impl Lease {
    pub(super) fn milli(&self) -> u64 {
        self.compute_milli
    }

    /// Whether its zone and region constraints let it run in `zone`.
    pub fn may_run_in(&self, zone: &str) -> bool {
        let region = lh_domain::spot::region_of(zone);
        (self.zones.is_empty() || self.zones.iter().any(|z| z == zone))
            && (self.regions.is_empty() || self.regions.iter().any(|r| r == region))
    }

    /// Whether it is placed only in some zones: by its constraints or, for
    /// a spot lease, by its bid.
    pub fn is_constrained(&self) -> bool {
        !self.zones.is_empty() || !self.regions.is_empty() || self.bid().is_some()
    }

    /// Whether it is on demand: every tier but spot. On-demand leases are
    /// queued before spot and may preempt spot leases; spot never preempts
    /// them, whatever they pay.
    pub fn is_on_demand(&self) -> bool {
        match self.tier {
            Tier::Basic | Tier::Performance | Tier::Reserved => true,
            Tier::Spot => false,
        }
    }

    /// Its bid, when it is a spot lease that has one.
    pub fn bid(&self) -> Option<Decimal> {
        self.max_price_cny_per_gpu_hour
            .filter(|_| self.tier == Tier::Spot)
    }

    /// VRAM it holds on each GPU, GB: what a bid per GPU-hour is set against.
    pub fn vram_gb_per_gpu(&self) -> u32 {
        self.vram_gb / self.gpus.max(1)
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

    /// What it asks for, in the placement engine's terms.
    pub fn shape(&self) -> LeaseShape {
        LeaseShape::of(&self.ask, &self.gpu_model)
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
