//! Where the node-agent learns about its GPUs: one trait, two backends.
//!
//! * [`nvml::NvmlBackend`] asks the NVIDIA Management Library on a real host.
//! * [`sim::SimBackend`] plays the GPUs of a fleet-file node, with an
//!   optional script of faults in time, so every health path runs on a
//!   machine without a GPU.
//!
//! The trait is synchronous because NVML is: its calls block (an event wait
//! blocks up to its timeout), so the agent calls them from
//! `tokio::task::spawn_blocking`. Implementations are `Send + Sync` so one
//! backend behind an `Arc` serves the sampling loop and the event loop.
//!
//! What the backends report is raw observation; judging it (healthy,
//! degraded, unhealthy) is [`crate::gpu::health`]'s job.

pub mod nvml;
pub mod sim;

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The MPS control binary, as the driver installs it. The workload side
/// drives it for shares; the simulated backend stands in for it under
/// this name.
pub const MPS_CONTROL_BINARY: &str = "nvidia-cuda-mps-control";
/// What sets a GPU's compute mode, as the driver installs it (and the
/// simulated backend stands in for it).
pub const NVIDIA_SMI_BINARY: &str = "nvidia-smi";

/// One physical GPU as the host sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// The driver's index (`nvidia-smi -i`), the key of samples and events.
    pub index: u32,
    pub uuid: String,
    /// Marketing name as the driver reports it (`NVIDIA H100 80GB HBM3`),
    /// or the fleet file's model for the simulated backend.
    pub model: String,
    pub vram_mib: u64,
    pub mig_enabled: bool,
    /// MIG devices (compute instances) that exist now; empty when MIG is
    /// off or no instance has been created yet.
    pub mig_devices: Vec<MigDevice>,
    /// Indices of the GPUs this one reaches over an active NVLink.
    pub nvlink_peers: Vec<u32>,
    /// NUMA node of the GPU's PCIe root, when the platform says.
    pub numa_node: Option<u32>,
}

/// One MIG device (a compute instance inside a GPU instance).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigDevice {
    /// What CUDA is given to see it (`MIG-<uuid>` on current drivers).
    pub uuid: String,
    /// Profile name such as `1g.10gb`.
    pub profile: String,
    /// First memory slice of its GPU instance (NVML's placement start),
    /// when the backend can tell.
    pub gpu_instance_start: Option<u32>,
}

/// One reading of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub index: u32,
    /// `None` where the GPU cannot tell (NVML in MIG mode, some boards):
    /// not the same as an idle 0 %.
    pub utilization_pct: Option<u32>,
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
    pub temperature_c: u32,
    pub power_w: f64,
    /// Double-bit (uncorrectable) ECC errors since the driver loaded.
    /// `None` where ECC is off or unsupported, or the read failed: a missing
    /// reading must not look like a counter that went back to zero (and then
    /// jumped, which would read as new errors).
    pub ecc_double_bit_total: Option<u64>,
    /// Memory per process on this GPU, where the backend can tell cheaply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessMemory>,
}

impl GpuSample {
    /// Share of the GPU's memory in use, in percent.
    pub fn memory_used_pct(&self) -> f64 {
        if self.memory_total_mib == 0 {
            return 0.0;
        }
        self.memory_used_mib as f64 * 100.0 / self.memory_total_mib as f64
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMemory {
    pub pid: u32,
    pub used_mib: u64,
}

/// Something that happened to a GPU, as opposed to a value read from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuEvent {
    pub index: u32,
    pub kind: GpuEventKind,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuEventKind {
    /// An XID error the driver reported (code in the NVIDIA XID catalogue).
    Xid(u64),
    /// An uncorrectable double-bit ECC error.
    EccDoubleBit,
    /// The GPU stopped answering (NVML `GPU_IS_LOST`): gone from the bus.
    Lost,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The one line an operator sees when the agent is started with the
    /// NVML backend on a host without the NVIDIA driver.
    #[error("NVML library (libnvidia-ml.so.1) not found: install the NVIDIA driver, or run with --gpu-backend sim")]
    LibraryMissing {
        /// What the dynamic loader said, for the debug log.
        detail: String,
    },
    #[error("NVIDIA driver is not loaded (NVML found, nvmlInit failed): load the nvidia kernel module, or run with --gpu-backend sim")]
    DriverNotLoaded,
    #[error("NVML {call} failed: {message}")]
    Nvml { call: &'static str, message: String },
    /// The simulated node was stopped by its fault script: the host is
    /// "powered off", so the agent must stop heartbeating (see
    /// [`BackendError::is_node_stopped`]).
    #[error("simulated node stopped by its fault script")]
    NodeStopped,
    /// A MIG instance cannot be made or removed as asked (no MIG mode, an
    /// unknown profile, a slot taken): the lease that needed it cannot run
    /// here, but the GPU is fine.
    #[error("MIG instance on GPU {gpu}: {why}")]
    Mig { gpu: u32, why: String },
}

impl BackendError {
    /// The host is gone (the simulated `node_stop` fault): the agent stops
    /// heartbeating and publishing rather than retrying, so the scheduler
    /// sees the silence and declares the node lost, as it would for a host
    /// that lost power.
    pub fn is_node_stopped(&self) -> bool {
        matches!(self, BackendError::NodeStopped)
    }
}

/// A source of GPU facts. Methods block; call them from `spawn_blocking`.
pub trait GpuBackend: Send + Sync {
    /// Short name for logs (`nvml`, `sim`).
    fn name(&self) -> &'static str;

    /// The GPUs of this host, ordered by index.
    fn inventory(&self) -> Result<Vec<GpuDevice>, BackendError>;

    /// One reading of every GPU that answers, stamped by the caller's clock
    /// (`now`). A GPU that does not answer is left out; its loss is
    /// reported by [`GpuBackend::wait_events`].
    fn sample(&self, now: DateTime<Utc>) -> Result<Vec<GpuSample>, BackendError>;

    /// Events that happened since the last call, waiting up to `timeout`
    /// for the first one. An empty vector means the wait timed out.
    fn wait_events(&self, timeout: Duration) -> Result<Vec<GpuEvent>, BackendError>;

    /// The GPUs that leases hold now. A real GPU shows its own load, so
    /// NVML ignores this; the simulated backend plays a workload on them.
    fn set_busy(&self, _gpus: &BTreeSet<u32>) {}

    /// A workload started on these GPUs as process group `pgid`. A real
    /// driver kills what runs on a GPU that faults, so NVML ignores this;
    /// the simulated backend kills the group on a fault that its script
    /// says kills workloads.
    fn workload_started(&self, _gpus: &[u32], _pgid: u32) {}

    /// The workload of process group `pgid` has ended.
    fn workload_ended(&self, _pgid: u32) {}

    /// Creates a GPU instance of `profile` (our name, `3g.40gb`) whose
    /// placement starts at memory slice `start` on GPU `gpu`, and one
    /// compute instance filling it; returns the MIG device CUDA sees.
    /// Refused when the GPU is not in MIG mode (switching the mode needs a
    /// GPU reset: an operator's action, never the agent's), the profile is
    /// unknown to the GPU, or the slot overlaps an instance.
    fn create_mig_instance(
        &self,
        gpu: u32,
        profile: &str,
        start: u32,
    ) -> Result<MigDevice, BackendError> {
        let _ = (profile, start);
        Err(BackendError::Mig {
            gpu,
            why: format!("the {} backend cannot create MIG instances", self.name()),
        })
    }

    /// Destroys the MIG device `uuid` on GPU `gpu`: its compute instances,
    /// then its GPU instance. One already gone is not an error.
    fn destroy_mig_instance(&self, gpu: u32, uuid: &str) -> Result<(), BackendError> {
        let _ = uuid;
        Err(BackendError::Mig {
            gpu,
            why: format!("the {} backend cannot destroy MIG instances", self.name()),
        })
    }
}

/// At most this many events are returned by one `wait_events` call; the
/// rest wait for the next call (a storm of XIDs must not starve sampling).
pub const MAX_EVENTS_PER_WAIT: usize = 64;
