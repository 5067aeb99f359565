//! What the engine is told: nodes, their GPUs and how each GPU is shared, and
//! requests. These are plain values; [`crate::Cluster`] interns the strings
//! and keeps the compact mutable state.

/// How one GPU is shared between leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SharingMode {
    /// One lease holds the whole device.
    Whole,
    /// Memory-sliced vGPU: many leases, each with a share of compute
    /// (milli-GPU, 1..=1000) and a hard VRAM amount; never more than 1000
    /// milli nor the device's VRAM in total. A whole-GPU lease may take a
    /// vGPU device while it holds no slice.
    VGpu,
    /// Multi-Instance GPU: instances of the profiles the model allows
    /// (geometry in the `mig` module). Only MIG requests go there.
    Mig,
}

/// One GPU of a node, as registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSpec {
    pub model: String,
    pub vram_gb: u32,
    pub mode: SharingMode,
}

/// One node, as registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub id: String,
    pub zone: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: Vec<GpuSpec>,
    /// NVLink / NUMA domains: groups of GPU indices that talk fast to each
    /// other. Empty when the node does not say.
    pub domains: Vec<Vec<u8>>,
    /// Its runtime isolates a workload from the host and from other
    /// tenants' (containers); only such nodes take requests that need it.
    pub isolates_workloads: bool,
    /// Each of its memory-sliced GPUs hosts shares of one size at a time:
    /// its enforcement (CUDA MPS) holds every client of a GPU to the smallest
    /// share the GPU has hosted since it was last empty, so a larger share
    /// next to a smaller one would get less than it asked for.
    pub one_share_size_per_gpu: bool,
    /// The fabric its GPUs share with other nodes' (an NVLink switch, an
    /// InfiniBand island), by label; empty when it does not say. A lease
    /// spanning nodes prefers nodes of one fabric.
    pub fabric: String,
}

impl NodeSpec {
    /// A node of `count` identical GPUs, no domains.
    pub fn uniform(
        id: impl Into<String>,
        zone: impl Into<String>,
        cpu_milli: u64,
        memory_mib: u64,
        count: usize,
        gpu: GpuSpec,
    ) -> Self {
        NodeSpec {
            id: id.into(),
            zone: zone.into(),
            cpu_milli,
            memory_mib,
            gpus: vec![gpu; count],
            domains: Vec::new(),
            isolates_workloads: true,
            one_share_size_per_gpu: false,
            fabric: String::new(),
        }
    }
}

/// What a request needs from GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GpuDemand {
    /// CPU and memory only.
    None,
    /// Whole GPUs, all on one node (1..=8 in the API; up to the node's count
    /// here).
    Whole { count: u8 },
    /// A share of one GPU: compute in milli-GPU (1..=1000) and a hard VRAM
    /// amount in GB (0 when the caller does not limit VRAM, as in the trace).
    Fraction { milli: u16, vram_gb: u32 },
    /// One MIG instance of the named profile (e.g. `1g.10gb`).
    Mig { profile: String },
}

/// Whether a request's GPUs may be taken back for other work: guaranteed
/// (basic, performance and reserved leases) or preemptible (spot). Placement
/// does not depend on it (the queue does); it is carried so that a
/// decision's provenance is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Preemptibility {
    #[default]
    Guaranteed,
    Preemptible,
}

/// A placement request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu: GpuDemand,
    /// Any of these GPU models; empty means any model.
    pub models: Vec<String>,
    /// Any of these zones; empty means any zone.
    pub zones: Vec<String>,
    pub preemptibility: Preemptibility,
    /// Only nodes that isolate workloads ([`NodeSpec::isolates_workloads`]).
    pub needs_isolation: bool,
}

impl Request {
    pub fn cpu_only(cpu_milli: u64, memory_mib: u64) -> Self {
        Request {
            cpu_milli,
            memory_mib,
            gpu: GpuDemand::None,
            models: Vec::new(),
            zones: Vec::new(),
            preemptibility: Preemptibility::Guaranteed,
            needs_isolation: false,
        }
    }

    pub fn whole(count: u8, cpu_milli: u64, memory_mib: u64) -> Self {
        Request {
            gpu: GpuDemand::Whole { count },
            ..Request::cpu_only(cpu_milli, memory_mib)
        }
    }

    pub fn fraction(milli: u16, vram_gb: u32, cpu_milli: u64, memory_mib: u64) -> Self {
        Request {
            gpu: GpuDemand::Fraction { milli, vram_gb },
            ..Request::cpu_only(cpu_milli, memory_mib)
        }
    }

    pub fn with_models<S: Into<String>>(mut self, models: impl IntoIterator<Item = S>) -> Self {
        self.models = models.into_iter().map(Into::into).collect();
        self
    }

    /// Only on nodes that isolate workloads.
    pub fn isolated(mut self) -> Self {
        self.needs_isolation = true;
        self
    }

    pub fn with_zones<S: Into<String>>(mut self, zones: impl IntoIterator<Item = S>) -> Self {
        self.zones = zones.into_iter().map(Into::into).collect();
        self
    }

    /// GPU milli this request takes in total (1000 per whole GPU).
    pub fn gpu_milli_total(&self) -> u64 {
        match &self.gpu {
            GpuDemand::None => 0,
            GpuDemand::Whole { count } => 1000 * u64::from(*count),
            GpuDemand::Fraction { milli, .. } => u64::from(*milli),
            GpuDemand::Mig { .. } => 0,
        }
    }
}
