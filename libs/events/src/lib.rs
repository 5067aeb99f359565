//! The one event vocabulary of Leasehold.
//!
//! Every fact the platform records is an [`Envelope`] around one of the
//! [`EventData`] variants, stored as JSON on the `LH_EVENTS` stream under the
//! subject of the aggregate it belongs to (`lh.evt.lease.<id>`, …). The event
//! type lives in the envelope (and in the `Lh-Event-Type` header), never in the
//! subject, so that an expected-last-subject-sequence guards the whole
//! aggregate. JSON Schemas for every type are generated into `schemas/` by
//! [`schemas`]; a test fails when they drift from these types.

use chrono::{DateTime, SubsecRound, Utc};
use rust_decimal::Decimal;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub mod subject;
pub mod telemetry;

/// Version of every event type defined here. Old versions are upcast on read.
pub const EVENT_VERSION: u16 = 1;

/// Namespace for deterministic (UUIDv5) event ids: a retried or replayed
/// handler derives the same id for the same cause, and JetStream's duplicate
/// window drops the second copy.
pub const ID_NAMESPACE: Uuid = Uuid::from_u128(0x6c68_2d65_7665_6e74_2d69_6473_2d76_3100);

/// Derives a deterministic id from a cause (for example `lease_id` and a step name).
pub fn derived_id(parts: &[&str]) -> Uuid {
    Uuid::new_v5(&ID_NAMESPACE, parts.join("\u{1f}").as_bytes())
}

/// Who caused an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum Actor {
    Tenant(Uuid),
    Admin,
    Auditor,
    Service(String),
    Node(String),
}

/// The envelope every event travels in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub id: Uuid,
    /// Event type, for example `lease.placed`; mirrors the `type` tag of `data`.
    #[serde(rename = "type")]
    pub event_type: String,
    pub version: u16,
    /// UTC, truncated to microseconds.
    pub occurred_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<Uuid>,
    pub actor: Actor,
    pub correlation_id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causation_id: Option<Uuid>,
    pub data: EventData,
}

impl Envelope {
    /// A new event with a fresh UUIDv7 id that starts its own correlation.
    pub fn new(actor: Actor, occurred_at: DateTime<Utc>, data: EventData) -> Self {
        let id = Uuid::now_v7();
        Self {
            id,
            event_type: data.event_type().to_string(),
            version: EVENT_VERSION,
            occurred_at: occurred_at.trunc_subsecs(6),
            tenant_id: data.tenant_id(),
            actor,
            correlation_id: id,
            causation_id: None,
            data,
        }
    }

    /// An event caused by `cause`: same correlation, causation set.
    pub fn caused_by(mut self, cause: &Envelope) -> Self {
        self.correlation_id = cause.correlation_id;
        self.causation_id = Some(cause.id);
        if self.tenant_id.is_none() {
            self.tenant_id = cause.tenant_id;
        }
        self
    }

    /// Replaces the id with a deterministic one (see [`derived_id`]).
    pub fn with_id(mut self, id: Uuid) -> Self {
        if self.causation_id.is_none() {
            self.correlation_id = id;
        }
        self.id = id;
        self
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an envelope always serialises")
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// Service tier of a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Basic,
    Spot,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Basic => "basic",
            Tier::Spot => "spot",
        }
    }
}

/// Per-tenant limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Most GPUs the tenant may hold at once, across all its leases. A
    /// fraction or MIG slice counts by its size (milli-GPU / 1000).
    pub max_gpus: u32,
    /// Most VRAM (GB) the tenant may hold at once; no limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_vram_gb: Option<u32>,
}

/// One GPU of a node's inventory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub vram_gb: u32,
    /// MIG mode is on: the GPU takes MIG leases only, each in a GPU instance
    /// created for it (and destroyed when it ends).
    #[serde(default, skip_serializing_if = "is_false")]
    pub mig: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A MIG GPU instance: its profile (e.g. `3g.20gb`) and NVML placement start
/// slice, which names it on its GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MigInstance {
    pub profile: String,
    pub start: u8,
}

/// A GPU handed to a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AssignedGpu {
    pub index: u32,
    pub uuid: String,
    /// For a fractional (memory-sliced vGPU) lease: the share of this GPU's
    /// compute it holds, in milli-GPU (1..=1000). Absent for a whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milli: Option<u32>,
    /// For a fractional lease: the VRAM in GB it holds on this GPU. Absent
    /// for a whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vram_gb: Option<u32>,
    /// For a MIG lease: the GPU instance it holds on this GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_instance: Option<MigInstance>,
}

/// A share of one GPU (memory-sliced vGPU): compute in milli-GPU
/// (1..=1000) and a hard VRAM amount in GB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuFraction {
    pub milli: u32,
    pub vram_gb: u32,
}

/// Why a lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The tenant asked for it.
    Stopped,
    /// Stopped before it was ever placed or started; nothing is billed.
    Cancelled,
    /// The workload exited on its own.
    Completed,
    /// The workload or node failed.
    Failed,
    /// A spot lease evicted for an on-demand one after its notice ran out.
    Preempted,
}

/// Every v1 event. The `type` tag is the event type name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventData {
    #[serde(rename = "tenant.created")]
    TenantCreated(TenantCreated),
    #[serde(rename = "lease.requested")]
    LeaseRequested(LeaseRequested),
    #[serde(rename = "lease.queued")]
    LeaseQueued(LeaseQueued),
    #[serde(rename = "lease.rejected")]
    LeaseRejected(LeaseRejected),
    #[serde(rename = "lease.placed")]
    LeasePlaced(LeasePlaced),
    #[serde(rename = "lease.stop_requested")]
    LeaseStopRequested(LeaseStopRequested),
    #[serde(rename = "lease.preemption_noticed")]
    LeasePreemptionNoticed(LeasePreemptionNoticed),
    #[serde(rename = "lease.started")]
    LeaseStarted(LeaseStarted),
    #[serde(rename = "lease.ended")]
    LeaseEnded(LeaseEnded),
    #[serde(rename = "lease.migrated")]
    LeaseMigrated(LeaseMigrated),
    #[serde(rename = "lease.gpu_fault")]
    LeaseGpuFault(LeaseGpuFault),
    #[serde(rename = "lease.idle_detected")]
    LeaseIdleDetected(LeaseIdleDetected),
    #[serde(rename = "lease.suspended")]
    LeaseSuspended(LeaseSuspended),
    #[serde(rename = "lease.resume_requested")]
    LeaseResumeRequested(LeaseResumeRequested),
    #[serde(rename = "node.registered")]
    NodeRegistered(NodeRegistered),
    #[serde(rename = "node.gpus_allocated")]
    NodeGpusAllocated(NodeGpusAllocated),
    #[serde(rename = "node.lost")]
    NodeLost(NodeLost),
    #[serde(rename = "node.rejoined")]
    NodeRejoined(NodeRejoined),
    #[serde(rename = "node.gpu_health_changed")]
    NodeGpuHealthChanged(NodeGpuHealthChanged),
    #[serde(rename = "node.gpu_self_tested")]
    NodeGpuSelfTested(NodeGpuSelfTested),
    #[serde(rename = "node.cordoned")]
    NodeCordoned(NodeCordoned),
    #[serde(rename = "node.uncordoned")]
    NodeUncordoned(NodeUncordoned),
    #[serde(rename = "spot.price_set")]
    SpotPriceSet(SpotPriceSet),
    #[serde(rename = "price_book.published")]
    PriceBookPublished(PriceBookPublished),
    #[serde(rename = "charge.accrued")]
    ChargeAccrued(ChargeAccrued),
    #[serde(rename = "audit.checkpoint")]
    AuditCheckpoint(AuditCheckpoint),
}

/// A tenant came into being. Personal fields are encrypted with the tenant's
/// own key, which lives outside the log (crypto-shredding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantCreated {
    pub tenant_id: Uuid,
    /// Base64 of nonce ‖ ChaCha20-Poly1305 ciphertext of the name.
    pub name_sealed: String,
    /// Base64 of nonce ‖ ChaCha20-Poly1305 ciphertext of the e-mail address.
    pub email_sealed: String,
    /// Hex SHA-256 of the API key; the key itself is shown once and never stored.
    pub api_key_sha256: String,
    pub quota: Quota,
    /// Weight in fair sharing across tenants (default 1).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// What node-agents do with this tenant's idle leases; the agent's
    /// default (`--idle-window-secs`, `--idle-action`) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_policy: Option<IdlePolicy>,
}

/// A tenant's rule for leases whose GPUs do nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdlePolicy {
    /// Seconds of zero GPU utilisation before the lease counts as idle.
    pub window_s: u64,
    pub action: IdleAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Only `lease.idle_detected`: the tenant is told, the lease runs on.
    Notify,
    /// `lease.idle_detected`, then the node-agent asks for the lease to stop
    /// (`lease.stop_requested` by the node), which ends it as a stop does.
    Stop,
    /// `lease.idle_detected`, then the node-agent stops the workload and
    /// reports `lease.suspended`: its GPUs are freed and billing stops, the
    /// lease is kept; `POST /v1/leases/{id}/resume` queues it again.
    Suspend,
}

impl IdleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Notify => "notify",
            IdleAction::Stop => "stop",
            IdleAction::Suspend => "suspend",
        }
    }
}

fn default_weight() -> u32 {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequested {
    pub lease_id: Uuid,
    pub tenant_id: Uuid,
    pub gpus: u32,
    pub gpu_model: String,
    pub tier: Tier,
    /// Order among the tenant's own waiting leases; higher first (default 0).
    #[serde(default)]
    pub priority: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// A share of one GPU instead of whole GPUs (then `gpus` is 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<GpuFraction>,
    /// One MIG instance of this profile of `gpu_model` instead of whole GPUs
    /// (then `gpus` is 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// What the lease runs, when the node runs workloads (without one, or on
    /// a simulated node, the lease "runs" until it is stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadSpec>,
}

/// A lease's workload: a command, or a container image (and its command).
/// `env` values are kept in the event log like every other field: they are
/// not a place for secrets.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseQueued {
    pub lease_id: Uuid,
    pub reason: String,
    /// 1-based position among the leases waiting for the same GPU model.
    pub position: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRejected {
    pub lease_id: Uuid,
    pub reason: String,
    /// The request field at fault, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// Provenance of a placement decision: why here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    pub policy: String,
    pub policy_version: u32,
    pub candidates: u32,
    pub winner_score: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_up_score: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeasePlaced {
    pub lease_id: Uuid,
    pub node_id: String,
    pub zone: String,
    pub gpu_model: String,
    /// VRAM the lease holds on each of its GPUs: the device's VRAM for a
    /// whole GPU, the share's VRAM for a fractional lease (what is billed).
    pub vram_gb_per_gpu: u32,
    pub gpus: Vec<AssignedGpu>,
    pub decision: Decision,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseStopRequested {
    pub lease_id: Uuid,
}

/// A spot lease will be evicted at `deadline` so that `preempted_for` (an
/// on-demand lease) can have its GPUs. The node-agent ends it then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeasePreemptionNoticed {
    pub lease_id: Uuid,
    pub node_id: String,
    pub preempted_for: Uuid,
    pub deadline: DateTime<Utc>,
}

/// The node-agent started the workload; billing starts at `started_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseStarted {
    pub lease_id: Uuid,
    pub node_id: String,
    pub started_at: DateTime<Utc>,
}

/// The lease is over; billing stops at `ended_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseEnded {
    pub lease_id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    pub ended_at: DateTime<Utc>,
    pub reason: EndReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

/// The lease left the GPUs it held (their node was lost, a GPU turned
/// unhealthy, the node is drained) and, when capacity allowed, was placed
/// again at once: `to` is that new placement, which the new node starts;
/// without `to` the lease waits in the queue like a new request (keeping its
/// place). Billing of the old run stops at `billing_ends_at`: for a lost
/// node, when it was last heard from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseMigrated {
    pub lease_id: Uuid,
    pub reason: String,
    pub from_node_id: String,
    pub from_gpu_indices: Vec<u32>,
    pub billing_ends_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Relocation>,
}

/// Where a migrated lease runs next (the fields of `lease.placed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Relocation {
    pub node_id: String,
    pub zone: String,
    pub vram_gb_per_gpu: u32,
    pub gpus: Vec<AssignedGpu>,
    pub decision: Decision,
}

/// The scheduler heard nothing from the node for longer than its liveness
/// window: nothing new is placed there and its leases are moved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeLost {
    pub node_id: String,
    /// The node's own timestamp of its last heartbeat the scheduler saw.
    pub last_heard_at: DateTime<Utc>,
    /// Silence the scheduler waited, in milliseconds.
    pub silence_ms: u64,
}

/// Health of one GPU as its node-agent judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GpuHealth {
    Healthy,
    /// Too hot or its memory too full for a while: nothing new goes there.
    Degraded,
    /// Critical XID, double-bit ECC error, fell off the bus, failed
    /// self-test: nothing new goes there and its leases are moved.
    Unhealthy,
}

/// What a health judgement rests on: the sample values and faults seen.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthEvidence {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_double_bit_total: Option<u64>,
    /// How long the condition held, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<f64>,
    /// Clean samples in a row that brought the GPU back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_samples: Option<u32>,
    /// A self-test's result brought the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_test_passed: Option<bool>,
}

/// A GPU changed health, with its evidence (`at` is the node's clock).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeGpuHealthChanged {
    pub node_id: String,
    pub gpu_index: u32,
    pub gpu_uuid: String,
    pub from: GpuHealth,
    pub to: GpuHealth,
    pub reason: String,
    pub evidence: HealthEvidence,
    pub at: DateTime<Utc>,
}

/// A self-test (a load test on a free GPU) finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeGpuSelfTested {
    pub node_id: String,
    pub gpu_index: u32,
    pub passed: bool,
    pub duration_s: f64,
    pub detail: String,
    pub at: DateTime<Utc>,
}

/// An application error on a GPU (XID 13, 31, 43, 45, 68) caused by the
/// lease's workload: charged to the lease, the GPU stays healthy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseGpuFault {
    pub lease_id: Uuid,
    pub node_id: String,
    pub gpu_index: u32,
    pub xid: u64,
    pub at: DateTime<Utc>,
}

/// The lease's GPUs showed no utilisation for the tenant's idle window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseIdleDetected {
    pub lease_id: Uuid,
    pub node_id: String,
    pub idle_since: DateTime<Utc>,
    pub window_s: u64,
    /// What the tenant's policy does about it: `notify`, `stop` or `suspend`.
    pub action: IdleAction,
    /// When the agent saw it (`idle_since + window_s` at the earliest).
    pub at: DateTime<Utc>,
}

/// The lease's workload was stopped on its node and its GPUs freed, the
/// lease kept (an idle lease under a `suspend` policy). Billing of the run
/// ends at `suspended_at`; `lease.resume_requested` queues it again, and it
/// starts afresh wherever it is placed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseSuspended {
    pub lease_id: Uuid,
    pub node_id: String,
    pub gpu_indices: Vec<u32>,
    pub suspended_at: DateTime<Utc>,
    pub reason: String,
}

/// The tenant asked for a suspended lease to run again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseResumeRequested {
    pub lease_id: Uuid,
}

/// An operator stopped new placements on a node. With `drain` its leases
/// are moved (`move`) or left to finish (`finish`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeCordoned {
    pub node_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainMode>,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DrainMode {
    /// Running leases finish where they are.
    Finish,
    /// Running leases are moved to other nodes.
    Move,
}

/// The node takes new placements again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeUncordoned {
    pub node_id: String,
}

/// A lost node is heard from again: it may take leases again. Leases moved
/// away while it was lost stay where they went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeRejoined {
    pub node_id: String,
    pub heard_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeRegistered {
    pub node_id: String,
    pub zone: String,
    pub hostname: String,
    pub gpus: Vec<GpuInfo>,
}

/// GPUs of a node given to leases. Written in the same atomic batch as the
/// `lease.placed` events it mirrors, with an expected-last-subject-sequence
/// on the node subject, so two schedulers can never hand out one GPU twice.
/// One event may carry several leases' allocations: one write per node per
/// batch keeps the expectation simple.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeGpusAllocated {
    pub node_id: String,
    pub allocations: Vec<NodeAllocation>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeAllocation {
    pub lease_id: Uuid,
    pub gpu_indices: Vec<u32>,
    /// For a fractional lease: its share of the (single) GPU in milli-GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milli: Option<u32>,
    /// For a fractional lease: the VRAM in GB it holds on that GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vram_gb: Option<u32>,
    /// For a MIG lease: the GPU instance created for it on that GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_instance: Option<MigInstance>,
}

impl NodeGpusAllocated {
    /// An allocation of one lease.
    pub fn one(node_id: impl Into<String>, lease_id: Uuid, gpu_indices: Vec<u32>) -> Self {
        Self {
            node_id: node_id.into(),
            allocations: vec![NodeAllocation {
                lease_id,
                gpu_indices,
                milli: None,
                vram_gb: None,
                mig_instance: None,
            }],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpotPriceSet {
    pub zone: String,
    pub gpu_model: String,
    /// CNY per GB of VRAM per hour, as a decimal string.
    #[schemars(with = "String")]
    pub price_cny_per_gb_hour: Decimal,
    /// Share of this (zone, model)'s GPUs held by leases, 0..=1, as a decimal string.
    #[schemars(with = "String")]
    pub utilisation: Decimal,
    pub gpus_total: u32,
    pub gpus_used: u32,
}

/// A version of the price book. Every charge names the version it used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PriceBookPublished {
    pub version: u32,
    pub currency: String,
    pub effective_from: DateTime<Utc>,
    pub tiers: Vec<TierPrice>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TierPrice {
    pub tier: Tier,
    #[schemars(with = "String")]
    pub price_cny_per_gb_hour: Decimal,
}

/// What one lease costs within one invoice period (a UTC calendar month).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChargeAccrued {
    pub charge_id: Uuid,
    pub tenant_id: Uuid,
    pub lease_id: Uuid,
    /// `YYYY-MM`.
    pub period: String,
    pub tier: Tier,
    pub gpus: u32,
    pub vram_gb: u32,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub billed_seconds: u64,
    #[schemars(with = "String")]
    pub unit_price_cny_per_gb_hour: Decimal,
    #[schemars(with = "String")]
    pub amount: Decimal,
    pub currency: String,
    pub price_book_version: u32,
}

/// A signed statement of the audit chain's head at a stream sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditCheckpoint {
    pub sequence: u64,
    pub head: String,
    pub events: u64,
    /// Hex ed25519 public key that signed `head`.
    pub public_key: String,
    /// Hex ed25519 signature over the checkpoint statement (see schemas/audit-chain.md).
    pub signature: String,
}

impl EventData {
    pub fn event_type(&self) -> &'static str {
        match self {
            EventData::TenantCreated(_) => "tenant.created",
            EventData::LeaseRequested(_) => "lease.requested",
            EventData::LeaseQueued(_) => "lease.queued",
            EventData::LeaseRejected(_) => "lease.rejected",
            EventData::LeasePlaced(_) => "lease.placed",
            EventData::LeaseStopRequested(_) => "lease.stop_requested",
            EventData::LeasePreemptionNoticed(_) => "lease.preemption_noticed",
            EventData::LeaseStarted(_) => "lease.started",
            EventData::LeaseEnded(_) => "lease.ended",
            EventData::LeaseMigrated(_) => "lease.migrated",
            EventData::LeaseGpuFault(_) => "lease.gpu_fault",
            EventData::LeaseIdleDetected(_) => "lease.idle_detected",
            EventData::LeaseSuspended(_) => "lease.suspended",
            EventData::LeaseResumeRequested(_) => "lease.resume_requested",
            EventData::NodeRegistered(_) => "node.registered",
            EventData::NodeGpusAllocated(_) => "node.gpus_allocated",
            EventData::NodeLost(_) => "node.lost",
            EventData::NodeRejoined(_) => "node.rejoined",
            EventData::NodeGpuHealthChanged(_) => "node.gpu_health_changed",
            EventData::NodeGpuSelfTested(_) => "node.gpu_self_tested",
            EventData::NodeCordoned(_) => "node.cordoned",
            EventData::NodeUncordoned(_) => "node.uncordoned",
            EventData::SpotPriceSet(_) => "spot.price_set",
            EventData::PriceBookPublished(_) => "price_book.published",
            EventData::ChargeAccrued(_) => "charge.accrued",
            EventData::AuditCheckpoint(_) => "audit.checkpoint",
        }
    }

    pub fn tenant_id(&self) -> Option<Uuid> {
        match self {
            EventData::TenantCreated(e) => Some(e.tenant_id),
            EventData::LeaseRequested(e) => Some(e.tenant_id),
            EventData::ChargeAccrued(e) => Some(e.tenant_id),
            _ => None,
        }
    }

    /// The lease whose subject this event is on, for events of a lease.
    /// Writers that guard on a lease's subject sequence must count every
    /// one of these, not only the types they act on.
    pub fn lease_id(&self) -> Option<Uuid> {
        match self {
            EventData::LeaseRequested(e) => Some(e.lease_id),
            EventData::LeaseQueued(e) => Some(e.lease_id),
            EventData::LeaseRejected(e) => Some(e.lease_id),
            EventData::LeasePlaced(e) => Some(e.lease_id),
            EventData::LeaseStopRequested(e) => Some(e.lease_id),
            EventData::LeasePreemptionNoticed(e) => Some(e.lease_id),
            EventData::LeaseStarted(e) => Some(e.lease_id),
            EventData::LeaseEnded(e) => Some(e.lease_id),
            EventData::LeaseMigrated(e) => Some(e.lease_id),
            EventData::LeaseGpuFault(e) => Some(e.lease_id),
            EventData::LeaseIdleDetected(e) => Some(e.lease_id),
            EventData::LeaseSuspended(e) => Some(e.lease_id),
            EventData::LeaseResumeRequested(e) => Some(e.lease_id),
            _ => None,
        }
    }

    /// The subject of the aggregate this event belongs to.
    pub fn subject(&self) -> String {
        match self {
            EventData::TenantCreated(e) => subject::tenant(e.tenant_id),
            EventData::LeaseRequested(e) => subject::lease(e.lease_id),
            EventData::LeaseQueued(e) => subject::lease(e.lease_id),
            EventData::LeaseRejected(e) => subject::lease(e.lease_id),
            EventData::LeasePlaced(e) => subject::lease(e.lease_id),
            EventData::LeaseStopRequested(e) => subject::lease(e.lease_id),
            EventData::LeasePreemptionNoticed(e) => subject::lease(e.lease_id),
            EventData::LeaseStarted(e) => subject::lease(e.lease_id),
            EventData::LeaseEnded(e) => subject::lease(e.lease_id),
            EventData::LeaseMigrated(e) => subject::lease(e.lease_id),
            EventData::LeaseGpuFault(e) => subject::lease(e.lease_id),
            EventData::LeaseIdleDetected(e) => subject::lease(e.lease_id),
            EventData::LeaseSuspended(e) => subject::lease(e.lease_id),
            EventData::LeaseResumeRequested(e) => subject::lease(e.lease_id),
            EventData::NodeRegistered(e) => subject::node(&e.node_id),
            EventData::NodeGpusAllocated(e) => subject::node(&e.node_id),
            EventData::NodeLost(e) => subject::node(&e.node_id),
            EventData::NodeRejoined(e) => subject::node(&e.node_id),
            EventData::NodeGpuHealthChanged(e) => subject::node(&e.node_id),
            EventData::NodeGpuSelfTested(e) => subject::node(&e.node_id),
            EventData::NodeCordoned(e) => subject::node(&e.node_id),
            EventData::NodeUncordoned(e) => subject::node(&e.node_id),
            EventData::SpotPriceSet(e) => subject::spot(&e.zone, &e.gpu_model),
            EventData::PriceBookPublished(_) => subject::price_book(),
            EventData::ChargeAccrued(e) => subject::charge(e.lease_id),
            EventData::AuditCheckpoint(_) => subject::audit(),
        }
    }
}

/// One JSON Schema per event type, keyed by file name (`lease.placed.v1.json`),
/// plus the envelope. `schemas/` holds exactly these files.
pub fn schemas() -> Vec<(String, serde_json::Value)> {
    fn schema<T: JsonSchema>() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(T)).expect("schema serialises")
    }
    let v = EVENT_VERSION;
    vec![
        (format!("envelope.v{v}.json"), schema::<Envelope>()),
        (
            format!("tenant.created.v{v}.json"),
            schema::<TenantCreated>(),
        ),
        (
            format!("lease.requested.v{v}.json"),
            schema::<LeaseRequested>(),
        ),
        (format!("lease.queued.v{v}.json"), schema::<LeaseQueued>()),
        (
            format!("lease.rejected.v{v}.json"),
            schema::<LeaseRejected>(),
        ),
        (format!("lease.placed.v{v}.json"), schema::<LeasePlaced>()),
        (
            format!("lease.stop_requested.v{v}.json"),
            schema::<LeaseStopRequested>(),
        ),
        (
            format!("lease.preemption_noticed.v{v}.json"),
            schema::<LeasePreemptionNoticed>(),
        ),
        (format!("lease.started.v{v}.json"), schema::<LeaseStarted>()),
        (format!("lease.ended.v{v}.json"), schema::<LeaseEnded>()),
        (
            format!("lease.migrated.v{v}.json"),
            schema::<LeaseMigrated>(),
        ),
        (
            format!("node.registered.v{v}.json"),
            schema::<NodeRegistered>(),
        ),
        (
            format!("node.gpus_allocated.v{v}.json"),
            schema::<NodeGpusAllocated>(),
        ),
        (format!("node.lost.v{v}.json"), schema::<NodeLost>()),
        (format!("node.rejoined.v{v}.json"), schema::<NodeRejoined>()),
        (
            format!("node.gpu_health_changed.v{v}.json"),
            schema::<NodeGpuHealthChanged>(),
        ),
        (
            format!("node.gpu_self_tested.v{v}.json"),
            schema::<NodeGpuSelfTested>(),
        ),
        (format!("node.cordoned.v{v}.json"), schema::<NodeCordoned>()),
        (
            format!("node.uncordoned.v{v}.json"),
            schema::<NodeUncordoned>(),
        ),
        (
            format!("lease.gpu_fault.v{v}.json"),
            schema::<LeaseGpuFault>(),
        ),
        (
            format!("lease.idle_detected.v{v}.json"),
            schema::<LeaseIdleDetected>(),
        ),
        (
            format!("lease.suspended.v{v}.json"),
            schema::<LeaseSuspended>(),
        ),
        (
            format!("lease.resume_requested.v{v}.json"),
            schema::<LeaseResumeRequested>(),
        ),
        (
            format!("spot.price_set.v{v}.json"),
            schema::<SpotPriceSet>(),
        ),
        (
            format!("price_book.published.v{v}.json"),
            schema::<PriceBookPublished>(),
        ),
        (
            format!("charge.accrued.v{v}.json"),
            schema::<ChargeAccrued>(),
        ),
        (
            format!("audit.checkpoint.v{v}.json"),
            schema::<AuditCheckpoint>(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_round_trips_and_type_matches_tag() {
        let data = EventData::LeaseStopRequested(LeaseStopRequested {
            lease_id: Uuid::nil(),
        });
        let env = Envelope::new(Actor::Admin, Utc::now(), data);
        let json: serde_json::Value = serde_json::from_slice(&env.to_json()).unwrap();
        assert_eq!(json["type"], "lease.stop_requested");
        assert_eq!(json["data"]["type"], "lease.stop_requested");
        assert_eq!(Envelope::from_json(&env.to_json()).unwrap(), env);
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        assert_eq!(derived_id(&["a", "b"]), derived_id(&["a", "b"]));
        assert_ne!(derived_id(&["a", "b"]), derived_id(&["ab"]));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let bad = r#"{"type":"lease.stop_requested","lease_id":"00000000-0000-0000-0000-000000000000","x":1}"#;
        assert!(serde_json::from_str::<EventData>(bad).is_err());
    }
}
