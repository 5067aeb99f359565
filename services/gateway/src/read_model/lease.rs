//! A lease as the read model holds it and the API shows it: the view, the
//! columns it is read from, and the functions that build it from a lease's
//! request. The projection writes what these build and the handlers answer
//! with it, so both take it from here, and nothing here knows of HTTP (the
//! serde and OpenAPI derives describe the body, not a handler).

use chrono::{DateTime, Utc};
use lh_domain::lease::{LeaseNow, LeaseState};
use lh_events::{GpuFraction, LeaseRequested};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use utoipa::ToSchema;
use uuid::Uuid;

/// A share of one GPU: compute in milli-GPU and a hard VRAM amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FractionBody {
    /// Compute share in milli-GPU, 1 to 1000.
    pub milli: u32,
    /// VRAM in GB, at least 1 and at most the model's VRAM.
    pub vram_gb: u32,
}

impl From<FractionBody> for GpuFraction {
    fn from(f: FractionBody) -> Self {
        GpuFraction {
            milli: f.milli,
            vram_gb: f.vram_gb,
        }
    }
}

/// A MIG GPU instance: its profile and NVML placement start slice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MigInstanceView {
    pub profile: String,
    pub start: u8,
}

/// A lease as the tenant sees it.
#[derive(Debug, Clone, Serialize, Deserialize, FromRow, ToSchema)]
pub struct LeaseView {
    pub id: Uuid,
    pub tenant_id: Uuid,
    /// requested, queued, placed, running, suspended, ended or rejected.
    #[sqlx(try_from = "String")]
    #[schema(value_type = String)]
    pub state: LeaseState,
    pub gpus: i32,
    /// Set for a fractional lease: its share of one GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<FractionBody>)]
    pub gpu_fraction: Option<sqlx::types::Json<FractionBody>>,
    /// Set for a MIG lease: the profile asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// What the lease runs: `command`, `image`, and for an environment
    /// `env` with its variables' `names` (never their values), the
    /// `lease_id` they are stored with and their salted `sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub workload: Option<sqlx::types::Json<serde_json::Value>>,
    /// Set for a placed MIG lease: the GPU instance it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<MigInstanceView>)]
    pub mig_instance: Option<sqlx::types::Json<MigInstanceView>>,
    pub gpu_model: String,
    pub tier: String,
    pub priority: i32,
    pub node_id: Option<String>,
    pub zone: Option<String>,
    #[schema(value_type = Vec<String>)]
    pub gpu_uuids: sqlx::types::Json<Vec<String>>,
    #[schema(value_type = Vec<u32>)]
    pub gpu_indices: sqlx::types::Json<Vec<u32>>,
    pub queued_reason: Option<String>,
    pub queue_position: Option<i32>,
    pub rejected_reason: Option<String>,
    pub stop_requested: bool,
    /// Set when this spot lease will be evicted (the node-agent ends it then).
    pub preemption_deadline: Option<DateTime<Utc>>,
    /// Why: `capacity` (on-demand work needs its GPUs) or `outbid` (the
    /// spot price rose above its bid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption_reason: Option<String>,
    /// Spot terms: `max_price_cny_per_gpu_hour`, `recovery`, and for a
    /// lease the scheduler requested to recover a preempted one,
    /// `recovery_of {lease_id, first_lease_id, attempt, zone}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub spot: Option<sqlx::types::Json<serde_json::Value>>,
    /// `{"zones": [...], "regions": [...]}` it may run in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub constraints: Option<sqlx::types::Json<serde_json::Value>>,
    pub end_reason: Option<String>,
    /// What made a failed lease fail, where its node could tell:
    /// `gpu_memory_exceeded` (its workload asked for more GPU memory than
    /// its share holds and got an allocation error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Times the lease was moved to other GPUs (its node was lost).
    pub migrations: i32,
    /// Why it was last moved.
    pub last_migration_reason: Option<String>,
    /// Start of the last idle stretch its node reported (zero GPU use for
    /// the tenant's idle window).
    pub idle_since: Option<DateTime<Utc>>,
    /// When it was last suspended for being idle.
    pub suspended_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub placed_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    #[serde(skip)]
    pub requested_sequence: i64,
    #[serde(skip)]
    pub idempotency_key: Option<String>,
    /// The node of its last placement, kept when it goes back to the
    /// queue: where its last workload's log is.
    #[serde(skip)]
    pub last_placement_node_id: Option<String>,
    /// The stream sequence of that placement: the node names the log by it.
    #[serde(skip)]
    pub last_placement_sequence: Option<i64>,
}

pub(crate) const VIEW_COLUMNS: &str = "id, tenant_id, state, gpus, gpu_fraction, mig_profile, mig_instance, workload, gpu_model, tier, priority, node_id, zone, gpu_uuids, gpu_indices,
    queued_reason, queue_position, rejected_reason, stop_requested, preemption_deadline, preemption_reason, spot, constraints, end_reason, failure, migrations, last_migration_reason, idle_since, suspended_at, created_at, placed_at,
    started_at, ended_at, requested_sequence, idempotency_key, last_placement_node_id, last_placement_sequence";

impl LeaseView {
    /// What the stop and resume rules need to know of the lease.
    pub(crate) fn now(&self) -> LeaseNow {
        LeaseNow {
            id: self.id,
            state: self.state,
            suspended_at: self.suspended_at,
        }
    }

    /// Whether this lease is the one `requested` describes: a retry with the
    /// same Idempotency-Key must ask for the same thing. The view keeps the
    /// workload with its environment's names and hash, not its values.
    pub(crate) fn asks_for(&self, requested: &LeaseRequested) -> bool {
        let fraction = self.gpu_fraction.as_ref().map(|f| GpuFraction::from(f.0));
        let workload = requested.workload.as_ref().map(workload_view);
        self.gpus as u32 == requested.gpus
            && fraction == requested.fraction
            && self.gpu_model == requested.gpu_model
            && self.mig_profile == requested.mig_profile
            && self.workload.as_ref().map(|w| &w.0) == workload.as_ref()
            && self.tier == requested.tier.as_str()
            && self.priority == requested.priority
            && self.spot.as_ref().map(|s| &s.0) == spot_terms(requested).as_ref()
            && self.constraints.as_ref().map(|c| &c.0) == constraints(requested).as_ref()
    }
}

/// A page of leases, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LeasePage {
    pub items: Vec<LeaseView>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// The row `lease.requested` makes, as the API shows it: the lease the
/// moment it is requested. The API answers a request with it before this
/// projection has applied the event, and this projection inserts what it
/// returns, so the answer and a later read cannot differ.
pub fn requested_view(
    e: &lh_events::LeaseRequested,
    sequence: u64,
    occurred_at: chrono::DateTime<chrono::Utc>,
) -> LeaseView {
    LeaseView {
        id: e.lease_id,
        tenant_id: e.tenant_id,
        state: lh_domain::lease::LeaseState::Requested,
        gpus: e.gpus as i32,
        gpu_fraction: e.fraction.map(|f| {
            sqlx::types::Json(FractionBody {
                milli: f.milli,
                vram_gb: f.vram_gb,
            })
        }),
        mig_profile: e.mig_profile.clone(),
        workload: e
            .workload
            .as_ref()
            .map(|w| sqlx::types::Json(workload_view(w))),
        mig_instance: None,
        gpu_model: e.gpu_model.clone(),
        tier: e.tier.as_str().to_string(),
        priority: e.priority,
        node_id: None,
        zone: None,
        gpu_uuids: sqlx::types::Json(Vec::new()),
        gpu_indices: sqlx::types::Json(Vec::new()),
        queued_reason: None,
        queue_position: None,
        rejected_reason: None,
        stop_requested: false,
        preemption_deadline: None,
        preemption_reason: None,
        spot: spot_terms(e).map(sqlx::types::Json),
        constraints: constraints(e).map(sqlx::types::Json),
        end_reason: None,
        failure: None,
        migrations: 0,
        last_migration_reason: None,
        idle_since: None,
        suspended_at: None,
        created_at: occurred_at,
        placed_at: None,
        started_at: None,
        ended_at: None,
        requested_sequence: sequence as i64,
        idempotency_key: e.idempotency_key.clone(),
        last_placement_node_id: None,
        last_placement_sequence: None,
    }
}

/// What the read model keeps of a workload: its command and image, and of
/// an environment kept out of the log, where it is and its names, never
/// values (the log never holds them).
pub(crate) fn workload_view(w: &lh_events::WorkloadSpec) -> serde_json::Value {
    let mut view = serde_json::json!({"command": w.command, "image": w.image});
    if let Some(env_ref) = &w.env_ref {
        view["env"] = serde_json::json!(env_ref);
    }
    view
}

/// A request's spot terms for the read model: only the keys it has; `None`
/// without any.
pub(crate) fn spot_terms(e: &lh_events::LeaseRequested) -> Option<serde_json::Value> {
    let mut terms = serde_json::Map::new();
    if let Some(bid) = e.max_price_cny_per_gpu_hour {
        terms.insert("max_price_cny_per_gpu_hour".into(), bid.to_string().into());
    }
    if let Some(r) = &e.recovery {
        terms.insert("recovery".into(), serde_json::json!(r));
    }
    if let Some(of) = &e.recovery_of {
        terms.insert("recovery_of".into(), serde_json::json!(of));
    }
    (!terms.is_empty()).then_some(serde_json::Value::Object(terms))
}

/// A request's zone and region constraints; `None` without any.
pub(crate) fn constraints(e: &lh_events::LeaseRequested) -> Option<serde_json::Value> {
    (!e.zones.is_empty() || !e.regions.is_empty())
        .then(|| serde_json::json!({"zones": e.zones, "regions": e.regions}))
}

/// How an ended lease's reason reads in the view.
pub(crate) fn end_reason(e: &lh_events::LeaseEnded) -> Option<String> {
    serde_json::to_value(e.reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
}

/// What made an ended lease fail, as the view names it.
pub(crate) fn failure(e: &lh_events::LeaseEnded) -> Option<String> {
    e.failure
        .and_then(|f| serde_json::to_value(f).ok())
        .and_then(|v| v.as_str().map(str::to_string))
}

/// The GPU UUIDs a placement gives a lease, as the read model keeps them.
pub(crate) fn placed_gpu_uuids(e: &lh_events::LeasePlaced) -> serde_json::Value {
    serde_json::json!(e.gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>())
}

/// The GPU indices a placement gives a lease, as the read model keeps them.
pub(crate) fn placed_gpu_indices(e: &lh_events::LeasePlaced) -> serde_json::Value {
    serde_json::json!(e.gpus.iter().map(|g| g.index).collect::<Vec<_>>())
}

/// The MIG instance a placement gives a lease, if any.
pub(crate) fn placed_mig_instance(e: &lh_events::LeasePlaced) -> Option<serde_json::Value> {
    e.gpus
        .first()
        .and_then(|g| g.mig_instance.as_ref())
        .map(|m| serde_json::json!({"profile": m.profile, "start": m.start}))
}
