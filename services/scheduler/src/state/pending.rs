//! Why a lease waits, or can never be placed as the fleet is: the
//! lh-placement engine that refused it says which (its [`Pending`]); this
//! module words it for the tenant, with the figures of the fleet the engine
//! was built from.

use lh_domain::catalog;
use lh_domain::fleet::{Gpu, Node};
use lh_events::{GpuAsk, GpuFraction, GpuHealth};
use lh_placement::{Pending, Reject};

use super::{FleetView, Lease};

/// Why `lease` cannot be placed now, from the engine's refusal (`None`: the
/// ask is out of the engine's range, so nothing ever fits), and whether only
/// busy GPUs are in the way (so waiting, or preempting, can help).
pub(super) fn why_pending(
    planned: &impl FleetView,
    lease: &Lease,
    pending: Option<&Pending>,
) -> (String, bool) {
    let refusal = Refusal::of(pending);
    let model = &lease.gpu_model;
    // A gang: the engine words what its best region lacks; one that no
    // region could hold even empty is told the largest node too.
    if let Some((p, gang)) = pending.and_then(|p| Some((p, p.gang.as_ref()?))) {
        let gpus = lease.ask.gpus();
        return match p.busy() {
            true => (format!("waiting for capacity: {gpus} x {model}: {p}"), true),
            false => (
                format!(
                    "{}, and the nodes of one region {} at most",
                    whole_reason(planned, model, gpus, Refusal::TooSmall),
                    gang.capacity
                ),
                false,
            ),
        };
    }
    if refusal == Refusal::NoIsolation {
        return (NO_ISOLATION.to_string(), false);
    }
    let reason = match &lease.ask {
        GpuAsk::Mig(profile) => mig_reason(planned, model, profile, refusal),
        GpuAsk::Fraction(share) => share_reason(planned, model, *share, refusal),
        GpuAsk::Whole(gpus) => whole_reason(planned, model, *gpus, refusal),
    };
    let busy = matches!(refusal, Refusal::Busy | Refusal::ShareSize);
    (reason, busy)
}

/// Why an untrusted tenant's lease waits while only nodes that do not
/// isolate workloads could take it.
pub const NO_ISOLATION: &str =
    "no isolating runtime for untrusted tenants: no node that runs workloads in containers can take it";
/// Why a MIG lease waits while the only slots for its instance are taken by
/// instances no lease holds (made outside Leasehold): only an operator
/// destroying them makes room.
pub const UNOWNED_MIG_IN_THE_WAY: &str =
    "waiting for an operator: MIG instances that belong to no lease";
/// Why a share waits while no node enforces its caps.
pub const NO_SHARING: &str = "no node enforces GPU memory sharing";
/// Why a share waits while the GPUs with room for it are on MPS nodes and
/// host shares of another size (an MPS GPU gives every share its smallest
/// share's limits, so it hosts one size at a time).
pub const NO_GPU_OF_THIS_SHARE_SIZE: &str =
    "waiting for capacity: no GPU of an MPS node hosts only shares of this size";

/// What keeps a lease out, as the engine's refusal tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// GPUs that could take it are busy now.
    Busy,
    /// GPUs of MPS nodes with room for it host shares of another size, and
    /// such a GPU takes one size at a time.
    ShareSize,
    /// The tenant is not trusted and no node that isolates workloads can
    /// take it.
    NoIsolation,
    /// No node could take it even with all its GPUs free.
    TooSmall,
    /// No GPU of the model in MIG mode has its profile.
    NoProfile,
    /// No GPU of the model in MIG mode has room for its instance even with
    /// its leases ended: instances no lease holds are in the way.
    Unowned,
    /// No GPU of the model is in the sharing mode it needs.
    WrongMode,
    /// No node that takes leases has the model.
    NoModel,
}

impl Refusal {
    fn of(pending: Option<&Pending>) -> Self {
        let Some(p) = pending else {
            return Refusal::TooSmall;
        };
        let refused_for = |reason: Reject| p.count(reason) > 0;
        if refused_for(Reject::ShareSize) {
            Refusal::ShareSize
        } else if p.busy() {
            Refusal::Busy
        } else if refused_for(Reject::Isolation) {
            Refusal::NoIsolation
        } else if refused_for(Reject::GpuTooSmall) {
            Refusal::TooSmall
        } else if refused_for(Reject::MigUnowned) {
            Refusal::Unowned
        } else if refused_for(Reject::MigProfile) {
            Refusal::NoProfile
        } else if refused_for(Reject::GpuMode) {
            Refusal::WrongMode
        } else {
            Refusal::NoModel
        }
    }
}

fn mig_reason(planned: &impl FleetView, model: &str, profile: &str, refusal: Refusal) -> String {
    let known = catalog::check(model, &GpuAsk::Mig(profile.to_string())).is_ok();
    if !known || refusal == Refusal::NoProfile {
        return format!("{model} has no MIG profile {profile}");
    }
    let in_mig = || {
        planned
            .nodes()
            .flat_map(|n| usable(n, model))
            .filter(|g| g.mig)
    };
    match refusal {
        Refusal::Busy => format!(
            "waiting for capacity: no room for a {profile} instance on the {} {model} in MIG mode",
            in_mig().count()
        ),
        Refusal::Unowned => {
            let unowned: usize = in_mig().map(|g| g.unowned_mig.len()).sum();
            format!(
                "{UNOWNED_MIG_IN_THE_WAY} ({unowned} on the {} {model} in MIG mode) leave no room for a {profile} instance",
                in_mig().count()
            )
        }
        _ => format!("no {model} in MIG mode yet"),
    }
}

fn share_reason(
    planned: &impl FleetView,
    model: &str,
    share: GpuFraction,
    refusal: Refusal,
) -> String {
    let (milli, vram_gb) = (share.milli, share.vram_gb);
    let largest = planned
        .nodes()
        .flat_map(|n| usable(n, model))
        .filter(|g| !g.mig)
        .map(|g| g.vram_gb)
        .max();
    match (refusal, largest) {
        (Refusal::ShareSize, _) => {
            format!("{NO_GPU_OF_THIS_SHARE_SIZE} ({milli} milli / {vram_gb} GB of one {model})")
        }
        (Refusal::Busy, _) => {
            format!("waiting for capacity: a share of {milli} milli / {vram_gb} GB of one {model}")
        }
        (Refusal::TooSmall, Some(v)) => {
            format!("a share of {milli} milli / {vram_gb} GB does not fit one {model} ({v} GB)")
        }
        (Refusal::WrongMode, _) => {
            let whole_only = planned
                .nodes()
                .filter(|n| !n.gpu_sharing.enforces_shares())
                .flat_map(|n| usable(n, model))
                .any(|g| !g.mig);
            if whole_only {
                format!("{NO_SHARING} on a {model}")
            } else {
                format!("no {model} out of MIG mode takes shares yet")
            }
        }
        _ => format!("no node offers {model} yet"),
    }
}

fn whole_reason(planned: &impl FleetView, model: &str, gpus: u32, refusal: Refusal) -> String {
    let (largest, free_max) = planned
        .nodes()
        .map(|n| {
            let whole: Vec<&Gpu> = usable(n, model).filter(|g| !g.mig).collect();
            let free = whole.iter().filter(|g| g.is_free()).count();
            (whole.len(), free)
        })
        .fold((0, 0), |(l, f), (nl, nf)| (l.max(nl), f.max(nf)));
    match refusal {
        Refusal::Busy => format!(
            "waiting for capacity: {gpus} x {model} requested, at most {free_max} free on one node"
        ),
        Refusal::TooSmall => {
            format!("{gpus} x {model} requested but the largest node has {largest}")
        }
        Refusal::WrongMode => format!("no {model} out of MIG mode yet"),
        Refusal::NoProfile
        | Refusal::Unowned
        | Refusal::NoModel
        | Refusal::NoIsolation
        | Refusal::ShareSize => {
            format!("no node offers {model} yet")
        }
    }
}

/// The GPUs of `model` on `node` the engine places on: healthy, on a node
/// that takes leases.
fn usable<'a>(node: &'a Node, model: &'a str) -> impl Iterator<Item = &'a Gpu> + 'a {
    let gpus = if node.is_schedulable() {
        &node.gpus[..]
    } else {
        &[]
    };
    gpus.iter()
        .filter(move |g| g.model == model && g.health == GpuHealth::Healthy)
}
