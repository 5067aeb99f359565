//! Why a lease waits, or can never be placed as the fleet is: the
//! lh-placement engine that refused it says which (its [`Pending`]); this
//! module words it for the tenant, with the figures of the fleet the engine
//! was built from.

use lh_domain::fleet::{Fleet, Gpu, Node};
use lh_events::GpuHealth;
use lh_placement::{Pending, Reject};

use super::*;

/// Why `lease` cannot be placed now, from the engine's refusal (`None`: the
/// ask is out of the engine's range, so nothing ever fits), and whether only
/// busy GPUs are in the way (so waiting, or preempting, can help).
pub(super) fn why_pending(
    scratch: &Fleet,
    lease: &Lease,
    pending: Option<&Pending>,
) -> (String, bool) {
    let busy = pending.is_some_and(Pending::busy);
    let refused_for = |reason: Reject| pending.is_some_and(|p| p.count(reason) > 0);
    let model = &lease.gpu_model;
    let reason = if let Some(profile) = &lease.mig_profile {
        let in_mig = scratch
            .nodes
            .values()
            .flat_map(|n| usable(n, model))
            .filter(|g| g.mig)
            .count();
        if mig_size(model, profile).is_none() || (!busy && refused_for(Reject::MigProfile)) {
            format!("{model} has no MIG profile {profile}")
        } else if busy {
            format!(
                "waiting for capacity: no room for a {profile} instance on the {in_mig} {model} in MIG mode"
            )
        } else {
            format!("no {model} in MIG mode yet")
        }
    } else if let Some(f) = lease.fraction {
        let (milli, vram_gb) = (f.milli, f.vram_gb);
        let largest = scratch
            .nodes
            .values()
            .flat_map(|n| usable(n, model))
            .filter(|g| !g.mig)
            .map(|g| g.vram_gb)
            .max();
        match largest {
            _ if busy => format!(
                "waiting for capacity: a share of {milli} milli / {vram_gb} GB of one {model}"
            ),
            Some(v) if pending.is_none() || refused_for(Reject::GpuTooSmall) => {
                format!("a share of {milli} milli / {vram_gb} GB does not fit one {model} ({v} GB)")
            }
            _ if refused_for(Reject::GpuMode) => {
                format!("no {model} out of MIG mode takes shares yet")
            }
            _ => format!("no node offers {model} yet"),
        }
    } else {
        let gpus = lease.gpus;
        let per_node = scratch.nodes.values().map(|n| {
            let whole: Vec<_> = usable(n, model).filter(|g| !g.mig).collect();
            let free = whole.iter().filter(|g| g.is_free()).count();
            (whole.len(), free)
        });
        let (largest, free_max) = per_node.fold((0, 0), |(l, f), (nl, nf)| (l.max(nl), f.max(nf)));
        if busy {
            format!(
                "waiting for capacity: {gpus} x {model} requested, at most {free_max} free on one node"
            )
        } else if pending.is_none() || refused_for(Reject::GpuTooSmall) {
            format!("{gpus} x {model} requested but the largest node has {largest}")
        } else if refused_for(Reject::GpuMode) {
            format!("no {model} out of MIG mode yet")
        } else {
            format!("no node offers {model} yet")
        }
    };
    (reason, busy)
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
