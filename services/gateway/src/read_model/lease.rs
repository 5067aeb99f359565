//! A lease as the read model holds it: the view the API shows
//! ([`LeaseView`], the HTTP contract's), what only the gateway keeps beside
//! it, the columns it is read from, and the functions that build it from a
//! lease's request. The projection writes what these build and the handlers
//! answer with it, so both take it from here, and nothing here knows of
//! HTTP handling.

use chrono::{DateTime, Utc};
use lh_domain::lease::{LeaseNow, LeaseState};
use lh_events::{GpuFraction, LeaseRequested};
use lh_rpc::http::leases::{FractionBody, LeaseMemberView, LeaseView, MigInstanceView};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{FromRow, Row};

/// A lease's row: what the API shows of it, and what the gateway keeps
/// for itself (where it sits in the lists, the request's key, where its
/// last workload's log is).
#[derive(Debug, Clone)]
pub struct Lease {
    pub view: LeaseView,
    /// The stream sequence of its request: the lists' order and cursor.
    pub requested_sequence: i64,
    pub idempotency_key: Option<String>,
    /// The node of its last placement, kept when it goes back to the
    /// queue: where its last workload's log is.
    pub last_placement_node_id: Option<String>,
    /// The stream sequence of that placement: the node names the log by it.
    pub last_placement_sequence: Option<i64>,
}

pub(crate) const VIEW_COLUMNS: &str = "id, tenant_id, state, gpus, gpu_fraction, mig_profile, mig_instance, workload, gpu_model, tier, priority, node_id, zone, gpu_uuids, gpu_indices,
    queued_reason, queue_position, rejected_reason, stop_requested, preemption_deadline, preemption_reason, spot, constraints, end_reason, failure, migrations, last_migration_reason, idle_since, suspended_at, created_at, placed_at,
    started_at, ended_at, requested_sequence, idempotency_key, last_placement_node_id, last_placement_sequence,
    members, members_started";

impl Lease {
    /// What the stop and resume rules need to know of the lease.
    pub(crate) fn now(&self) -> LeaseNow {
        LeaseNow {
            id: self.view.id,
            state: self.view.state,
            suspended_at: self.view.suspended_at,
        }
    }

    /// Whether this lease is the one `requested` describes: a retry with the
    /// same Idempotency-Key must ask for the same thing. The view keeps the
    /// workload with its environment's names and hash, not its values.
    pub(crate) fn asks_for(&self, requested: &LeaseRequested) -> bool {
        let view = &self.view;
        let fraction = view.gpu_fraction.map(GpuFraction::from);
        let workload = requested.workload.as_ref().map(workload_view);
        view.gpus as u32 == requested.gpus
            && fraction == requested.fraction
            && view.gpu_model == requested.gpu_model
            && view.mig_profile == requested.mig_profile
            && view.workload == workload
            && view.tier == requested.tier.as_str()
            && view.priority == requested.priority
            && view.spot == spot_terms(requested)
            && view.constraints == constraints(requested)
    }
}

impl<'r> FromRow<'r, PgRow> for Lease {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        let state: String = row.try_get("state")?;
        let state = LeaseState::try_from(state).map_err(|e| sqlx::Error::ColumnDecode {
            index: "state".into(),
            source: Box::new(e),
        })?;
        let json = |column: &str| -> sqlx::Result<Option<serde_json::Value>> {
            Ok(row
                .try_get::<Option<Json<serde_json::Value>>, _>(column)?
                .map(|j| j.0))
        };
        let view = LeaseView {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            state,
            gpus: row.try_get("gpus")?,
            gpu_fraction: row
                .try_get::<Option<Json<FractionBody>>, _>("gpu_fraction")?
                .map(|j| j.0),
            mig_profile: row.try_get("mig_profile")?,
            workload: json("workload")?,
            mig_instance: row
                .try_get::<Option<Json<MigInstanceView>>, _>("mig_instance")?
                .map(|j| j.0),
            gpu_model: row.try_get("gpu_model")?,
            tier: row.try_get("tier")?,
            priority: row.try_get("priority")?,
            node_id: row.try_get("node_id")?,
            zone: row.try_get("zone")?,
            gpu_uuids: row.try_get::<Json<Vec<String>>, _>("gpu_uuids")?.0,
            gpu_indices: row.try_get::<Json<Vec<u32>>, _>("gpu_indices")?.0,
            queued_reason: row.try_get("queued_reason")?,
            queue_position: row.try_get("queue_position")?,
            rejected_reason: row.try_get("rejected_reason")?,
            stop_requested: row.try_get("stop_requested")?,
            preemption_deadline: row.try_get("preemption_deadline")?,
            preemption_reason: row.try_get("preemption_reason")?,
            spot: json("spot")?,
            constraints: json("constraints")?,
            end_reason: row.try_get("end_reason")?,
            failure: row.try_get("failure")?,
            migrations: row.try_get("migrations")?,
            last_migration_reason: row.try_get("last_migration_reason")?,
            idle_since: row.try_get("idle_since")?,
            suspended_at: row.try_get("suspended_at")?,
            created_at: row.try_get("created_at")?,
            placed_at: row.try_get("placed_at")?,
            started_at: row.try_get("started_at")?,
            ended_at: row.try_get("ended_at")?,
            members: members_view(
                row.try_get::<Json<Vec<PlacedMember>>, _>("members")?.0,
                &row.try_get::<Json<Vec<String>>, _>("members_started")?.0,
            ),
        };
        Ok(Lease {
            view,
            requested_sequence: row.try_get("requested_sequence")?,
            idempotency_key: row.try_get("idempotency_key")?,
            last_placement_node_id: row.try_get("last_placement_node_id")?,
            last_placement_sequence: row.try_get("last_placement_sequence")?,
        })
    }
}

/// The row `lease.requested` makes: the lease the moment it is requested.
/// The API answers a request with its view before this projection has
/// applied the event, and this projection inserts what it returns, so the
/// answer and a later read cannot differ.
pub fn requested_lease(e: &LeaseRequested, sequence: u64, occurred_at: DateTime<Utc>) -> Lease {
    let view = LeaseView {
        id: e.lease_id,
        tenant_id: e.tenant_id,
        state: LeaseState::Requested,
        gpus: e.gpus as i32,
        gpu_fraction: e.fraction.map(FractionBody::from),
        mig_profile: e.mig_profile.clone(),
        workload: e.workload.as_ref().map(workload_view),
        mig_instance: None,
        gpu_model: e.gpu_model.clone(),
        tier: e.tier.as_str().to_string(),
        priority: e.priority,
        node_id: None,
        zone: None,
        gpu_uuids: Vec::new(),
        gpu_indices: Vec::new(),
        queued_reason: None,
        queue_position: None,
        rejected_reason: None,
        stop_requested: false,
        preemption_deadline: None,
        preemption_reason: None,
        spot: spot_terms(e),
        constraints: constraints(e),
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
        members: Vec::new(),
    };
    Lease {
        view,
        requested_sequence: sequence as i64,
        idempotency_key: e.idempotency_key.clone(),
        last_placement_node_id: None,
        last_placement_sequence: None,
    }
}

/// What the read model keeps of a workload: its command and image, the
/// template they came from, of an environment kept out of the log, where
/// it is and its names, never values (the log never holds them), the
/// datasets and workspaces it mounts, its network and whether it reaches
/// the store itself.
pub(crate) fn workload_view(w: &lh_events::WorkloadSpec) -> serde_json::Value {
    let mut view = serde_json::json!({"command": w.command, "image": w.image});
    if let Some(template) = &w.template {
        view["template"] = serde_json::json!(template);
    }
    if let Some(env_ref) = &w.env_ref {
        view["env"] = serde_json::json!(env_ref);
    }
    if !w.datasets.is_empty() {
        view["datasets"] = serde_json::json!(w.datasets);
    }
    if !w.workspaces.is_empty() {
        view["workspaces"] = serde_json::json!(w.workspaces);
    }
    if !w.network.is_none() {
        view["network"] = serde_json::json!(w.network);
    }
    if w.object_store {
        view["object_store"] = serde_json::json!(true);
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

/// A gang's member as the read model keeps it (`leases.members`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct PlacedMember {
    pub node_id: String,
    pub zone: String,
    pub gpu_uuids: Vec<String>,
    pub gpu_indices: Vec<u32>,
}

/// The members a placement gives a lease: every node of a gang, none for
/// a lease on one node.
pub(crate) fn placed_members(e: &lh_events::LeasePlaced) -> serde_json::Value {
    let members: Vec<PlacedMember> = e
        .members
        .iter()
        .map(|m| PlacedMember {
            node_id: m.node_id.clone(),
            zone: m.zone.clone(),
            gpu_uuids: m.gpus.iter().map(|g| g.uuid.clone()).collect(),
            gpu_indices: m.gpus.iter().map(|g| g.index).collect(),
        })
        .collect();
    serde_json::json!(members)
}

/// The view of a gang's members, `started` those whose part has.
pub(crate) fn members_view(members: Vec<PlacedMember>, started: &[String]) -> Vec<LeaseMemberView> {
    members
        .into_iter()
        .map(|m| LeaseMemberView {
            started: started.contains(&m.node_id),
            node_id: m.node_id,
            zone: m.zone,
            gpu_uuids: m.gpu_uuids,
            gpu_indices: m.gpu_indices,
        })
        .collect()
}

/// The MIG instance a placement gives a lease, if any.
pub(crate) fn placed_mig_instance(e: &lh_events::LeasePlaced) -> Option<serde_json::Value> {
    e.gpus
        .first()
        .and_then(|g| g.mig_instance.as_ref())
        .map(|m| serde_json::json!({"profile": m.profile, "start": m.start}))
}
