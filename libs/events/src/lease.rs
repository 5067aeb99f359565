//! The lease aggregate (`lh.evt.lease.<id>`): what a tenant asks for and
//! everything that happens to it until it ends.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{AssignedGpu, GpuFraction, IdleAction, Tier};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// Spot only: the most the tenant pays, CNY per GPU-hour (the spot
    /// price per GB-hour times the VRAM the lease holds on each GPU). The
    /// lease is placed only where the price is at or under it, and is given
    /// notice when the price rises above it. Without one, any price goes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "rust_decimal::serde::str_option"
    )]
    #[schemars(with = "Option<String>")]
    pub max_price_cny_per_gpu_hour: Option<rust_decimal::Decimal>,
    /// Zones the lease may run in; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    /// Regions the lease may run in (a zone's region is what precedes its
    /// last dot: `cn-north.1` is in `cn-north`); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
    /// Spot only: how the lease is recovered after a preemption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<SpotRecovery>,
    /// Set on a lease the scheduler requested to recover a preempted one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_of: Option<RecoveryOf>,
    /// The quote (`quote.issued`) the lease was asked for with: it is
    /// billed on the price book version the quote names. A recovered spot
    /// lease keeps it: it is the same request again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quote_id: Option<Uuid>,
}

/// Managed recovery of a spot lease: after a preemption the same request is
/// made again, as a new lease, up to `max_retries` times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SpotRecovery {
    pub max_retries: u32,
    /// Which zone the recovered lease tries first.
    #[serde(default)]
    pub zone_first: ZoneFirst,
}

/// Where a recovered spot lease looks first.
// On a command line the values are listed bare: the flag's help says what
// each does there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum ZoneFirst {
    /// The zone it was preempted in, then any zone it may run in.
    #[default]
    #[cfg_attr(feature = "clap", value(help = None::<&str>))]
    Same,
    /// Any zone it may run in, the one it left included.
    #[cfg_attr(feature = "clap", value(help = None::<&str>))]
    Any,
}

/// The preempted lease a recovery replaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RecoveryOf {
    /// The preempted lease.
    pub lease_id: Uuid,
    /// The lease the tenant asked for first.
    pub first_lease_id: Uuid,
    /// 1 for the first recovery.
    pub attempt: u32,
    /// The zone it was preempted in.
    pub zone: String,
}

/// A lease's workload: a command, or a container image (and its command).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct WorkloadSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Environment values in clear, in memory only: from the request to
    /// the gateway, which seals them and leaves `env_ref`, and from the
    /// node's fetch to the workload. They are never written to an event nor
    /// read from one: the values live sealed in the gateway, and an
    /// immutable log is no place for them (erasing the tenant could not
    /// reach them there), so an event naming `env` is read without it.
    #[serde(skip)]
    pub env: std::collections::BTreeMap<String, String>,
    /// The environment, kept out of the log: the gateway holds the values
    /// sealed with the tenant's key, and the node fetches them when it
    /// starts the workload. An immutable log is no place for a tenant's
    /// values: erasing the tenant could not reach them there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_ref: Option<WorkloadEnvRef>,
    /// What network its container is on; none unless asked.
    #[serde(default, skip_serializing_if = "WorkloadNetwork::is_none")]
    pub network: WorkloadNetwork,
    /// The gateway's template the image and command were filled from
    /// (`jupyter`), kept so that a client can find the template's ports
    /// again (`lh lease open`); none for a workload the tenant spelled out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The tenant's datasets the workload sees read-only, each at one
    /// version fixed when the lease was asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<DatasetMount>,
    /// The tenant's workspaces the workload reads and writes: restored
    /// before it starts on any node, synced back while it runs and before
    /// it ends there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspaces: Vec<WorkspaceMount>,
    /// Whether the container may reach its tenant's bucket itself: it
    /// gets the tenant's store identity in its environment and the store
    /// at `AWS_ENDPOINT_URL`, a relay the node keeps on the container's
    /// own loopback (docs/adr/032).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub object_store: bool,
}

impl WorkloadSpec {
    /// Whether the node needs the tenant's storage to start it.
    pub fn uses_storage(&self) -> bool {
        !self.datasets.is_empty() || !self.workspaces.is_empty() || self.object_store
    }
}

/// One version of a tenant's dataset, seen read-only at `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DatasetMount {
    pub name: String,
    /// Lowercase hex SHA-256 of the version's manifest.
    pub version: String,
    /// Bytes of its files: what staging it takes on a node.
    pub bytes: u64,
    /// Absolute path inside the workload.
    pub path: String,
}

/// A tenant's workspace, read and written at `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkspaceMount {
    pub name: String,
    /// Absolute path inside the workload.
    pub path: String,
}

/// The network of a lease's container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum WorkloadNetwork {
    /// No network at all: a loopback interface only.
    #[default]
    #[cfg_attr(feature = "clap", value(help = None::<&str>))]
    None,
    /// The tenant's own network on the node, shared by the tenant's
    /// containers there and by no one else's: no route out of it, and
    /// the node itself unreachable from it.
    #[cfg_attr(feature = "clap", value(help = None::<&str>))]
    Tenant,
}

impl WorkloadNetwork {
    pub fn is_none(&self) -> bool {
        *self == WorkloadNetwork::None
    }
}

/// Where a workload's environment is kept, and what it must hash to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkloadEnvRef {
    /// The lease the values were stored with; a lease the scheduler
    /// requested to recover a preempted one keeps its first lease's.
    pub lease_id: Uuid,
    /// The variables' names, sorted.
    pub names: Vec<String>,
    /// Hex SHA-256 of a secret per-lease salt and the values
    /// (`lh_domain::workload::env_digest`): the node checks that what it
    /// fetched is what was asked for, while the log, which outlives the
    /// tenant's key, cannot be searched for a guessed value.
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseQueued {
    pub lease_id: Uuid,
    pub reason: String,
    /// 1-based position among the leases waiting for the same GPU model.
    pub position: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseRejected {
    pub lease_id: Uuid,
    pub reason: String,
    /// The request field at fault, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// Provenance of a placement decision: why here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Decision {
    pub policy: String,
    pub policy_version: u32,
    pub candidates: u32,
    pub winner_score: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_up_score: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// A lease of more GPUs than one node holds (a gang): every member in
    /// node-rank order, the first being the node `node_id`, `zone` and
    /// `gpus` name. Empty for a lease on one node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<LeaseMember>,
}

/// One node of a lease that spans several: the GPUs it takes there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseMember {
    pub node_id: String,
    pub zone: String,
    /// How the other members reach it (the node's registered host name):
    /// the first member's is the job's `MASTER_ADDR`.
    pub address: String,
    pub gpus: Vec<AssignedGpu>,
}

impl LeasePlaced {
    /// Every node the lease holds GPUs on, first the one `node_id` names.
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        let gang = self.members.iter().map(|m| m.node_id.as_str());
        std::iter::once(self.node_id.as_str()).chain(gang.skip(1))
    }

    /// GPUs the lease holds on all its nodes.
    pub fn gpu_count(&self) -> usize {
        match self.members.as_slice() {
            [] => self.gpus.len(),
            members => members.iter().map(|m| m.gpus.len()).sum(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseStopRequested {
    pub lease_id: Uuid,
}

/// A spot lease will be evicted at `deadline`, for `reason`: so that
/// `preempted_for` (an on-demand lease) can have its GPUs, or because the
/// spot price rose above its bid (then `preempted_for` is the nil id: no
/// lease takes the GPUs). The node-agent ends it then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeasePreemptionNoticed {
    pub lease_id: Uuid,
    pub node_id: String,
    pub preempted_for: Uuid,
    pub deadline: DateTime<Utc>,
    /// Logs from before reasons were recorded hold only capacity notices.
    #[serde(default)]
    pub reason: PreemptionReason,
}

/// Why a spot lease is preempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PreemptionReason {
    /// On-demand work needs its GPUs.
    #[default]
    Capacity,
    /// The spot price rose above its bid.
    Outbid,
    /// A lease of a higher priority class needs its GPUs.
    Priority,
}

impl PreemptionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptionReason::Capacity => "capacity",
            PreemptionReason::Outbid => "outbid",
            PreemptionReason::Priority => "priority",
        }
    }
}

/// The node-agent started the workload; billing starts at `started_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseStarted {
    pub lease_id: Uuid,
    pub node_id: String,
    pub started_at: DateTime<Utc>,
    /// The MIG devices the node-agent created for a MIG lease, as CUDA
    /// names them; empty for any other lease (and in events written before
    /// the field existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_devices: Vec<StartedMigDevice>,
}

/// A MIG device a lease runs on: what `lease.placed` asked for
/// (`mig_instance`) made real on the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StartedMigDevice {
    pub gpu_index: u32,
    /// `MIG-<uuid>`: what `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES`
    /// take.
    pub uuid: String,
}

/// The lease is over; billing stops at `ended_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseEnded {
    pub lease_id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    pub ended_at: DateTime<Utc>,
    pub reason: EndReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// What made it fail, where its node could tell (`reason` is
    /// `failed`); absent when it could not, or before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<LeaseFailure>,
}

/// What made a lease fail, as its node saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseFailure {
    /// Its workload asked for more GPU memory than its share holds and got
    /// an allocation error (the share's limit held; its neighbours kept
    /// their memory).
    GpuMemoryExceeded,
    /// It used all the host memory its size gives and the kernel's OOM
    /// killer ended it.
    OutOfMemory,
    /// Its image is neither on its node nor to be pulled from anywhere the
    /// node may pull from.
    ImageMissing,
    /// Its container was not running within the node's start timeout (a
    /// pull that took too long, a stuck engine).
    StartTimeout,
    /// The container engine refused to run it, its image present.
    EngineError,
    /// Its workload exited non-zero (`exit_code`) for a reason of its own.
    ExitCode,
    /// A cause a newer node named that this reader does not know: still a
    /// failure, so an older reader keeps the event.
    #[serde(other)]
    Other,
}

/// The lease left the GPUs it held (their node was lost, a GPU turned
/// unhealthy, the node is drained) and, when capacity allowed, was placed
/// again at once: `to` is that new placement, which the new node starts;
/// without `to` the lease waits in the queue like a new request (keeping its
/// place). Billing of the old run stops at `billing_ends_at`: for a lost
/// node, when it was last heard from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
pub struct Relocation {
    pub node_id: String,
    pub zone: String,
    pub vram_gb_per_gpu: u32,
    pub gpus: Vec<AssignedGpu>,
    pub decision: Decision,
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

/// An application error on a GPU (XID 13, 31, 43, 45, 68) caused by the
/// lease's workload: charged to the lease, the GPU stays healthy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseGpuFault {
    pub lease_id: Uuid,
    pub node_id: String,
    pub gpu_index: u32,
    pub xid: u64,
    pub at: DateTime<Utc>,
}

/// The lease's GPUs showed no utilisation for the tenant's idle window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseIdleDetected {
    pub lease_id: Uuid,
    pub node_id: String,
    pub idle_since: DateTime<Utc>,
    pub window_seconds: u64,
    /// What the tenant's policy does about it: `notify`, `stop` or `suspend`.
    pub action: IdleAction,
    /// When the agent saw it (`idle_since + window_seconds` at the earliest).
    pub at: DateTime<Utc>,
}

/// The lease's workload was stopped on its node and its GPUs freed, the
/// lease kept (an idle lease under a `suspend` policy). Billing of the run
/// ends at `suspended_at`; `lease.resume_requested` queues it again, and it
/// starts afresh wherever it is placed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseSuspended {
    pub lease_id: Uuid,
    pub node_id: String,
    pub gpu_indices: Vec<u32>,
    pub suspended_at: DateTime<Utc>,
    pub reason: String,
}

/// One member of a lease that spans several nodes (a gang) saw its part
/// exit 0. The gang completes when every member's part has: its first
/// member ends the lease once it has its own part's exit and this from
/// every other member, so that no rank still writing its results is
/// stopped because another finished first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseMemberCompleted {
    pub lease_id: Uuid,
    pub node_id: String,
}

/// A node copied a lease's workspace to the tenant's bucket: what a lease
/// moved, recovered or resumed elsewhere starts from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseWorkspaceSynced {
    pub lease_id: Uuid,
    pub node_id: String,
    pub workspace: String,
    /// Lowercase hex SHA-256 of the manifest now at the workspace's head.
    pub manifest: String,
    pub bytes: u64,
    pub files: u64,
    /// Bytes sent this time (what was not on the store yet).
    pub bytes_sent: u64,
    pub reason: WorkspaceSyncReason,
    pub synced_at: DateTime<Utc>,
}

/// What made a node sync a workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceSyncReason {
    /// The sync interval passed.
    Interval,
    /// The workload ended or was stopped.
    End,
    /// The lease was suspended while idle.
    Suspension,
    /// Its node is drained, or the lease moves to another node.
    Move,
    /// A spot preemption notice.
    Notice,
}

impl WorkspaceSyncReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceSyncReason::Interval => "interval",
            WorkspaceSyncReason::End => "end",
            WorkspaceSyncReason::Suspension => "suspension",
            WorkspaceSyncReason::Move => "move",
            WorkspaceSyncReason::Notice => "notice",
        }
    }
}

/// The tenant asked for a suspended lease to run again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseResumeRequested {
    pub lease_id: Uuid,
}

/// What a lease asks for, in one place: whole GPUs, a memory-sliced share of
/// one GPU, or one MIG instance. [`LeaseRequested`] keeps the three wire
/// fields; [`LeaseRequested::ask`] reads them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuAsk {
    Whole(u32),
    Fraction(GpuFraction),
    /// A MIG instance of this profile of the lease's GPU model.
    Mig(String),
}

impl GpuAsk {
    /// The request field that carries this ask (`gpus`, `gpu_fraction` or
    /// `mig_profile`), for errors that name it.
    pub fn field(&self) -> &'static str {
        match self {
            GpuAsk::Whole(_) => "gpus",
            GpuAsk::Fraction(_) => "gpu_fraction",
            GpuAsk::Mig(_) => "mig_profile",
        }
    }

    /// GPUs the lease spans: a share or a MIG instance is on one GPU.
    pub fn gpus(&self) -> u32 {
        match self {
            GpuAsk::Whole(n) => *n,
            GpuAsk::Fraction(_) | GpuAsk::Mig(_) => 1,
        }
    }
}

impl LeaseRequested {
    /// What the lease asks for. A share wins over a MIG profile, which wins
    /// over whole GPUs; the gateway never writes more than one of them.
    pub fn ask(&self) -> GpuAsk {
        match (self.fraction, &self.mig_profile) {
            (Some(f), _) => GpuAsk::Fraction(f),
            (None, Some(p)) => GpuAsk::Mig(p.clone()),
            (None, None) => GpuAsk::Whole(self.gpus),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::Utc;
    use uuid::Uuid;

    use super::*;
    use crate::{fixtures, Actor, Envelope, EventData};

    fn env_ref() -> WorkloadEnvRef {
        WorkloadEnvRef {
            lease_id: Uuid::from_u128(1),
            names: vec!["TOKEN".into()],
            sha256: "ab".repeat(32),
        }
    }

    fn requested(workload: WorkloadSpec) -> Envelope {
        let mut request =
            fixtures::whole_request(Uuid::from_u128(1), Uuid::from_u128(2), 1, fixtures::MODEL);
        request.workload = Some(workload);
        Envelope::new(
            Actor::Tenant(Uuid::from_u128(2)),
            Utc::now(),
            EventData::LeaseRequested(request),
        )
    }

    fn workload_of(envelope: &Envelope) -> &WorkloadSpec {
        match &envelope.data {
            EventData::LeaseRequested(r) => r.workload.as_ref().expect("a workload"),
            other => panic!("not a request: {other:?}"),
        }
    }

    #[test]
    fn values_in_memory_never_reach_the_event() {
        let workload = WorkloadSpec {
            command: vec!["python".into(), "train.py".into()],
            image: None,
            env: BTreeMap::from([("TOKEN".to_string(), "s3cret-value".to_string())]),
            env_ref: Some(env_ref()),
            network: Default::default(),
            template: None,
            datasets: Vec::new(),
            workspaces: Vec::new(),
            object_store: false,
        };
        let bytes = requested(workload).to_json();
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let written = &json["data"]["workload"];
        assert!(
            written.get("env").is_none(),
            "values in the event: {written}"
        );
        assert_eq!(written["env_ref"]["names"], serde_json::json!(["TOKEN"]));
        assert!(
            !String::from_utf8_lossy(&bytes).contains("s3cret-value"),
            "a value in the event's bytes"
        );
    }

    #[test]
    fn values_an_event_names_are_not_read() {
        let workload = WorkloadSpec {
            command: vec!["true".into()],
            image: None,
            env: BTreeMap::new(),
            env_ref: Some(env_ref()),
            network: Default::default(),
            template: None,
            datasets: Vec::new(),
            workspaces: Vec::new(),
            object_store: false,
        };
        let mut json: serde_json::Value =
            serde_json::from_slice(&requested(workload).to_json()).unwrap();
        json["data"]["workload"]["env"] = serde_json::json!({"TOKEN": "s3cret-value"});
        let read = Envelope::from_json(&serde_json::to_vec(&json).unwrap()).unwrap();
        let workload = workload_of(&read);
        assert!(workload.env.is_empty(), "values honoured: {workload:?}");
        assert_eq!(workload.env_ref, Some(env_ref()));
        assert_eq!(workload.command, ["true"]);

        let bare: WorkloadSpec =
            serde_json::from_value(serde_json::json!({"command": ["true"], "env": {"A": "1"}}))
                .unwrap();
        assert!(bare.env.is_empty() && bare.env_ref.is_none(), "{bare:?}");
    }

    #[test]
    fn the_schema_has_no_place_for_values() {
        let schema = serde_json::to_value(schemars::schema_for!(WorkloadSpec)).unwrap();
        let properties = schema["properties"].as_object().unwrap();
        assert!(!properties.contains_key("env"), "{schema}");
        assert!(properties.contains_key("env_ref"), "{schema}");
    }
}
