//! Why a node cannot take a demand, and why an allocation failed.

use std::fmt;

use crate::mig::{self};

/// Why a node cannot take a demand now (first failing check). The GPU checks
/// tell waiting from never: [`Reject::GpuBusy`] passes once leases end, the
/// other GPU reasons hold until the node itself changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reject {
    /// The request needs a node that isolates workloads; this one does not.
    Isolation,
    Zone,
    Model,
    Cpu,
    Memory,
    /// Its GPUs are taken now; with them free it would take the demand.
    GpuBusy,
    /// A GPU with room for the share holds shares of another size and takes
    /// one size at a time; it takes any size once those end.
    ShareSize,
    /// Not even with all its GPUs free: too few GPUs of the model, too little
    /// VRAM on one, or a share over one whole GPU.
    GpuTooSmall,
    /// None of its GPUs of the model is in the sharing mode the demand needs
    /// (MIG mode for a MIG instance; shares or whole GPUs otherwise).
    GpuMode,
    /// Its GPUs of the model in MIG mode have no such profile.
    MigProfile,
    /// Its GPUs of the model in MIG mode have no room for the instance even
    /// with their leases ended: MIG instances no lease holds are in the
    /// way, until an operator destroys them.
    MigUnowned,
}

impl Reject {
    /// Every reason, in the order the checks run.
    pub const ALL: [Reject; 11] = [
        Reject::Isolation,
        Reject::Zone,
        Reject::Model,
        Reject::Cpu,
        Reject::Memory,
        Reject::GpuBusy,
        Reject::ShareSize,
        Reject::GpuTooSmall,
        Reject::GpuMode,
        Reject::MigProfile,
        Reject::MigUnowned,
    ];
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reject::Isolation => "isolation",
            Reject::Zone => "zone",
            Reject::Model => "gpu model",
            Reject::Cpu => "cpu",
            Reject::Memory => "memory",
            Reject::GpuBusy => "gpu busy",
            Reject::ShareSize => "share size",
            Reject::GpuTooSmall => "gpu too small",
            Reject::GpuMode => "gpu mode",
            Reject::MigProfile => "mig profile",
            Reject::MigUnowned => "mig unowned",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocError {
    NoSuchNode,
    NotFeasible(Reject),
    BadGpus,
    UnknownAllocation,
    MigUnsupported,
    /// A MIG instance the placement rules refuse (restoring a layout).
    Mig(mig::MigError),
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::NoSuchNode => f.write_str("no such node"),
            AllocError::NotFeasible(r) => write!(f, "node cannot take it: {r}"),
            AllocError::BadGpus => f.write_str("chosen GPUs do not fit the demand"),
            AllocError::UnknownAllocation => f.write_str("no such live allocation"),
            AllocError::MigUnsupported => f.write_str("MIG geometry not available"),
            AllocError::Mig(e) => write!(f, "MIG: {e}"),
        }
    }
}

impl std::error::Error for AllocError {}
