//! The node aggregate (`lh.evt.node.<id>`): a GPU host, its inventory, its
//! GPUs' health and what the scheduler allocated on it.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{GpuInfo, IdlePolicy, MigInstance, StatedEvent};

/// An operator stopped new placements on a node. With `drain` its leases
/// are moved (`move`) or left to finish (`finish`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeCordoned {
    pub node_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainMode>,
    pub reason: String,
}

// On a command line the values are listed bare: the flag's help says what
// each does there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum DrainMode {
    /// Running leases finish where they are.
    #[cfg_attr(feature = "clap", value(help = None::<&str>))]
    Finish,
    /// Running leases are moved to other nodes.
    #[cfg_attr(feature = "clap", value(help = None::<&str>))]
    Move,
}

/// An operator vouched for a node: what its registration may claim. A
/// node's `node.registered` takes effect only within the newest of these
/// (`lh_domain::authority`): at most `max_gpus` GPUs, each of a model in
/// `gpu_models`, in `zone`, isolating at most as `max_isolation` says and
/// sharing GPUs only as `gpu_sharing` lists. A node the operator never
/// enrolled is in no fleet, whatever it says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeEnrolled {
    pub node_id: String,
    pub zone: String,
    pub max_gpus: u32,
    pub gpu_models: Vec<String>,
    #[serde(default, skip_serializing_if = "Isolation::is_none")]
    pub max_isolation: Isolation,
    /// Besides none, which is always allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_sharing: Vec<GpuSharing>,
}

/// The node takes new placements again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeUncordoned {
    pub node_id: String,
}

/// A lost node is heard from again: it may take leases again. Leases moved
/// away while it was lost stay where they went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeRejoined {
    pub node_id: String,
    pub heard_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeRegistered {
    pub node_id: String,
    pub zone: String,
    pub hostname: String,
    pub gpus: Vec<GpuInfo>,
    /// What keeps a workload from the host and from other tenants'. Absent
    /// (a registration older than the field) means none.
    #[serde(default, skip_serializing_if = "Isolation::is_none")]
    pub isolation: Isolation,
    /// What enforces a memory-sliced share's VRAM and compute caps. Absent
    /// (a registration older than the field) means nothing does.
    #[serde(default, skip_serializing_if = "GpuSharing::is_none")]
    pub gpu_sharing: GpuSharing,
    /// The interconnect its GPUs share with other nodes' (an NVLink switch
    /// domain, an InfiniBand fabric), as the operator labels it: a lease
    /// across nodes prefers members of one. Absent: none declared. A
    /// reader takes only a label [`fabric_label_is_valid`] accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<String>,
}

/// Most bytes of a fabric label.
pub const MAX_FABRIC_LABEL_BYTES: usize = 63;

/// A fabric label: 1 to [`MAX_FABRIC_LABEL_BYTES`] of ASCII letters,
/// digits, `.`, `_` and `-`.
pub fn fabric_label_is_valid(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= MAX_FABRIC_LABEL_BYTES
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// How a node's runtime isolates a workload, weakest first.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Nothing: the workload runs as the agent's user, on the whole host.
    #[default]
    None,
    /// A cgroup v2 per lease (memory, kill), but the host's users, files
    /// and processes are in reach.
    Cgroup,
    /// A container per lease (namespaces, its own filesystem, cgroups).
    Container,
}

impl Isolation {
    pub fn is_none(&self) -> bool {
        *self == Isolation::None
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::None => "none",
            Isolation::Cgroup => "cgroup",
            Isolation::Container => "container",
        }
    }
}

/// What enforces the caps of a share of one GPU on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum GpuSharing {
    /// Nothing: a share's caps would only be environment variables.
    #[default]
    None,
    /// MIG instances: the GPU itself isolates memory and compute.
    Mig,
    /// HAMi-core injected by the agent (`LD_PRELOAD` it sets, after the
    /// tenant's variables) caps VRAM and SMs.
    HamiCore,
    /// CUDA MPS: a control daemon per GPU, run by the agent, caps each
    /// client process's pinned VRAM and SM share where the client cannot
    /// lift them (ADR 016).
    Mps,
}

impl GpuSharing {
    pub fn is_none(&self) -> bool {
        *self == GpuSharing::None
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GpuSharing::None => "none",
            GpuSharing::Mig => "mig",
            GpuSharing::HamiCore => "hami-core",
            GpuSharing::Mps => "mps",
        }
    }

    /// Whether a memory-sliced share's caps hold on such a node.
    pub fn enforces_shares(self) -> bool {
        matches!(self, GpuSharing::HamiCore | GpuSharing::Mps)
    }
}

/// GPUs of a node given to leases. Written in the same atomic batch as the
/// `lease.placed` events it mirrors, with an expected-last-subject-sequence
/// on the node subject, so two schedulers can never hand out one GPU twice.
/// One event may carry several leases' allocations: one write per node per
/// batch keeps the expectation simple.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeGpusAllocated {
    pub node_id: String,
    pub allocations: Vec<NodeAllocation>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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

/// The scheduler heard nothing from the node for longer than its liveness
/// window: nothing new is placed there and its leases are moved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    pub window_seconds: Option<f64>,
    /// Clean samples in a row that brought the GPU back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_samples: Option<u32>,
    /// A self-test's result brought the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_test_passed: Option<bool>,
}

/// A GPU changed health, with its evidence (`at` is the node's clock).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
pub struct NodeGpuSelfTested {
    pub node_id: String,
    pub gpu_index: u32,
    pub passed: bool,
    pub duration_seconds: f64,
    pub detail: String,
    pub at: DateTime<Utc>,
}

/// Events node `node_id` acts on, relayed to its own view
/// (`lh.evt.node_view.<id>`) by the scheduler, so that a node reads
/// nothing of other nodes' leases or of tenants (docs/adr/027): its own
/// node's enrollment, registration, GPU health and restatement, and every
/// event on the subject of a lease while that lease is placed there (with
/// the lease's request when it is placed there). Each event keeps the
/// sequence the log stored it at: the node guards its reports by its
/// lease's subject sequence as before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeViewRelayed {
    pub node_id: String,
    /// Oldest first.
    pub events: Vec<StatedEvent>,
    /// The idle policies of the tenants whose leases are placed here in
    /// this relay, where they set one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub idle_policies: Vec<TenantIdlePolicy>,
}

/// A tenant's idle policy, as a relay carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TenantIdlePolicy {
    pub tenant_id: Uuid,
    pub policy: IdlePolicy,
}
