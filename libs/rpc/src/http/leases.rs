//! Leases (`/v1/leases`): the request for one, and a lease as the tenant
//! sees it, alone or a page at a time.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use lh_domain::lease::{LeaseBody, LeaseState};
use lh_events::{
    DatasetMount, GpuFraction, SpotRecovery, Tier, WorkloadNetwork, WorkloadSpec, WorkspaceMount,
    ZoneFirst,
};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

// Every field a request may omit is left out when unset, so that a client
// sends only what it asks for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateLease {
    /// Whole GPUs: 1 to 16, or a multiple of 8 up to 128; more than one
    /// node holds are placed across nodes as a gang. Exactly one of `gpus`,
    /// `gpu_fraction` and `mig_profile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// A share of one GPU (memory-sliced vGPU) instead of whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_fraction: Option<FractionBody>,
    /// One MIG instance of this profile of `gpu_model` (e.g. `3g.20gb` on
    /// an `A100-40GB`) instead of whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// What to run on the node: `{"command": ["python", "train.py"],
    /// "image"?: "…", "env"?: {"NAME": "value"}}`. Env values never enter
    /// the event log: they are kept sealed with the tenant's key, given only
    /// to the node the lease runs on, and destroyed with the tenant's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub workload: Option<WorkloadBody>,
    /// A template of the gateway's (`GET /v1/templates`), e.g. `jupyter`:
    /// the workload's image and command are the template's, so `workload`
    /// may then give only `env` and `network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// A model from the catalog, e.g. `A100-40GB`.
    pub gpu_model: String,
    #[serde(default = "default_tier")]
    #[schema(value_type = String, example = "basic")]
    pub tier: Tier,
    /// Order among this tenant's own waiting leases, -1000 to 1000; higher first.
    #[serde(default)]
    pub priority: i32,
    /// Tier spot only: the most you pay, CNY per GPU-hour, as a decimal
    /// string (the spot price per GB-hour times the VRAM held on each GPU).
    /// The lease is placed only where the price is at or under it and gets
    /// a preemption notice when the price rises above it.
    #[serde(
        default,
        with = "rust_decimal::serde::str_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, example = "4.5")]
    pub max_price_cny_per_gpu_hour: Option<Decimal>,
    /// Zones the lease may run in (at most 16); empty or absent: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    /// Regions the lease may run in (at most 16; a zone's region is what
    /// precedes its last dot); empty or absent: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
    /// Tier spot only: `{"max_retries": 0..=10, "zone_first": "same"|"any"}`.
    /// A preempted lease is then requested again as a new lease, the zone
    /// it left first (`same`, the default) or any zone first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub recovery: Option<RecoveryBody>,
    /// A quote of this tenant's (`POST /v1/quotes`), unexpired, for the same
    /// GPUs, model and tier: the lease is billed on the price book version
    /// it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quote_id: Option<Uuid>,
}

fn default_tier() -> Tier {
    Tier::Basic
}

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

impl From<GpuFraction> for FractionBody {
    fn from(f: GpuFraction) -> Self {
        FractionBody {
            milli: f.milli,
            vram_gb: f.vram_gb,
        }
    }
}

/// Managed recovery as a request states it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoveryBody {
    pub max_retries: u32,
    #[serde(default)]
    pub zone_first: ZoneFirst,
}

/// What to run, as a request states it. The event's [`WorkloadSpec`]
/// ignores fields it does not know (a newer writer's); a request naming one
/// is refused instead, so this body has its own type.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadBody {
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `tenant`: the container joins its tenant's network on the node;
    /// none by default.
    #[serde(default, skip_serializing_if = "WorkloadNetwork::is_none")]
    pub network: WorkloadNetwork,
    /// The tenant's datasets, each seen read-only at its path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<DatasetMountBody>,
    /// The tenant's workspaces, each read and written at its path and kept
    /// on the tenant's storage across moves, recoveries and resumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspaces: Vec<WorkspaceMountBody>,
    /// The container reaches its tenant's bucket itself: the tenant's
    /// store identity in its environment, the store at
    /// `AWS_ENDPOINT_URL`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub object_store: bool,
}

/// A dataset a lease mounts, as a request states it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetMountBody {
    pub name: String,
    /// One version (64 hex digits); the newest when absent, fixed when the
    /// lease is asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Absolute path inside the workload.
    pub path: String,
}

/// A workspace a lease mounts, as a request states it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceMountBody {
    pub name: String,
    /// Absolute path inside the workload.
    pub path: String,
}

impl From<WorkloadBody> for WorkloadSpec {
    fn from(body: WorkloadBody) -> Self {
        WorkloadSpec {
            command: body.command,
            image: body.image,
            env: body.env,
            env_ref: None,
            network: body.network,
            template: None,
            // An empty version is the newest: the gateway fixes it before
            // the request is logged.
            datasets: body
                .datasets
                .into_iter()
                .map(|d| DatasetMount {
                    name: d.name,
                    version: d.version.unwrap_or_default(),
                    bytes: 0,
                    path: d.path,
                })
                .collect(),
            workspaces: body
                .workspaces
                .into_iter()
                .map(|w| WorkspaceMount {
                    name: w.name,
                    path: w.path,
                })
                .collect(),
            object_store: body.object_store,
        }
    }
}

/// Everything but `template`, which only the gateway's set of templates
/// turns into an image and a command: it takes the name out first.
impl From<CreateLease> for LeaseBody {
    fn from(body: CreateLease) -> Self {
        LeaseBody {
            gpus: body.gpus,
            fraction: body.gpu_fraction.map(GpuFraction::from),
            mig_profile: body.mig_profile,
            gpu_model: body.gpu_model,
            tier: body.tier,
            priority: body.priority,
            workload: body.workload.map(WorkloadSpec::from),
            max_price_cny_per_gpu_hour: body.max_price_cny_per_gpu_hour,
            zones: body.zones,
            regions: body.regions,
            recovery: body.recovery.map(|r| SpotRecovery {
                max_retries: r.max_retries,
                zone_first: r.zone_first,
            }),
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
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LeaseView {
    pub id: Uuid,
    pub tenant_id: Uuid,
    /// requested, queued, placed, running, suspended, ended or rejected.
    #[schema(value_type = String)]
    pub state: LeaseState,
    pub gpus: i32,
    /// Set for a fractional lease: its share of one GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_fraction: Option<FractionBody>,
    /// Set for a MIG lease: the profile asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// What the lease runs: `command`, `image`, the `template` they came
    /// from if any, and for an environment
    /// `env` with its variables' `names` (never their values), the
    /// `lease_id` they are stored with and their salted `sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub workload: Option<serde_json::Value>,
    /// Set for a placed MIG lease: the GPU instance it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_instance: Option<MigInstanceView>,
    pub gpu_model: String,
    pub tier: String,
    pub priority: i32,
    pub node_id: Option<String>,
    pub zone: Option<String>,
    pub gpu_uuids: Vec<String>,
    pub gpu_indices: Vec<u32>,
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
    pub spot: Option<serde_json::Value>,
    /// `{"zones": [...], "regions": [...]}` it may run in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub constraints: Option<serde_json::Value>,
    pub end_reason: Option<String>,
    /// What made a failed lease fail, where its node could tell:
    /// `gpu_memory_exceeded` (its workload asked for more GPU memory than
    /// its share holds and got an allocation error), `out_of_memory` (the
    /// OOM killer ended it at its host memory limit), `image_missing`,
    /// `start_timeout` (its container was not running in time),
    /// `engine_error` (the container engine refused it), `exit_code` (it
    /// exited non-zero: `exit_code`).
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
    /// A lease of more GPUs than one node holds (a gang): every node it
    /// runs on, in node-rank order; `node_id`, `zone` and the GPU fields
    /// above are the first's. Absent for a lease on one node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<LeaseMemberView>,
}

/// One node of a lease that spans several.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseMemberView {
    pub node_id: String,
    pub zone: String,
    pub gpu_uuids: Vec<String>,
    pub gpu_indices: Vec<u32>,
    /// Its part has started: the lease runs once every member's has.
    #[serde(default)]
    pub started: bool,
}

/// A page of leases, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LeasePage {
    pub items: Vec<LeaseView>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_naming_an_unknown_field_is_refused_at_every_level() {
        let refused = |json: &str| serde_json::from_str::<CreateLease>(json).is_err();
        let ok = r#"{"gpus":1,"gpu_model":"A100-40GB","workload":{"command":["true"]}}"#;
        assert!(!refused(ok));
        assert!(refused(
            r#"{"gpus":1,"gpu_model":"A100-40GB","colour":"red"}"#
        ));
        assert!(refused(
            r#"{"gpus":1,"gpu_model":"A100-40GB","workload":{"command":["true"],"colour":"red"}}"#
        ));
        assert!(refused(
            r#"{"gpu_fraction":{"milli":250,"vram_gb":10,"colour":"red"},"gpu_model":"A100-40GB"}"#
        ));
    }

    #[test]
    fn a_request_carries_only_what_it_asks_for() {
        let body = CreateLease {
            gpus: Some(2),
            gpu_fraction: None,
            mig_profile: None,
            workload: Some(WorkloadBody {
                command: vec!["true".into()],
                image: None,
                env: BTreeMap::new(),
                network: WorkloadNetwork::None,
                ..Default::default()
            }),
            template: None,
            gpu_model: "H100".into(),
            tier: Tier::Spot,
            priority: 0,
            max_price_cny_per_gpu_hour: Some("4.50".parse().unwrap()),
            zones: vec![],
            regions: vec!["cn-east".into()],
            recovery: Some(RecoveryBody {
                max_retries: 2,
                zone_first: ZoneFirst::Any,
            }),
            quote_id: None,
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({
                "gpus": 2, "gpu_model": "H100", "tier": "spot", "priority": 0,
                "max_price_cny_per_gpu_hour": "4.50", "regions": ["cn-east"],
                "recovery": {"max_retries": 2, "zone_first": "any"},
                "workload": {"command": ["true"], "env": {}}
            })
        );
    }
}
