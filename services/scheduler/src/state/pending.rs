//! Why a lease waits (or can never be placed).

use lh_domain::fleet::Fleet;
use lh_domain::placement::{self, Request, Unplaceable};
use lh_events::GpuHealth;

use super::*;

/// Why `lease` cannot be placed now, and whether only busy capacity is in
/// the way (so waiting, or preempting, can help).
pub(super) fn why_pending(scratch: &Fleet, lease: &Lease) -> (String, bool) {
    if let Some(profile) = &lease.mig_profile {
        let mig_gpus = scratch
            .nodes
            .values()
            .flat_map(|n| n.gpus.iter())
            .filter(|g| g.model == lease.gpu_model && g.mig)
            .count();
        return match (mig_size(&lease.gpu_model, profile), mig_gpus) {
            (None, _) => (
                format!("{} has no MIG profile {profile}", lease.gpu_model),
                false,
            ),
            (Some(_), 0) => (
                format!("no {} in MIG mode yet", lease.gpu_model),
                false,
            ),
            (Some(_), n) => (
                format!(
                    "waiting for capacity: no room for a {profile} instance on the {n} {} in MIG mode",
                    lease.gpu_model
                ),
                true,
            ),
        };
    }
    match lease.fraction {
        None => {
            let request = Request {
                gpus: lease.gpus,
                gpu_model: lease.gpu_model.clone(),
            };
            let usable: Vec<placement::Node> = scratch
                .nodes
                .values()
                .filter(|n| n.is_schedulable())
                .map(|n| placement::Node {
                    gpus: n
                        .gpus
                        .iter()
                        .filter(|g| g.health == GpuHealth::Healthy)
                        .cloned()
                        .collect(),
                    ..n.clone()
                })
                .collect();
            match placement::best_fit(&usable, &request) {
                Err(why) => (
                    why.reason(&request),
                    matches!(why, Unplaceable::Busy { .. }),
                ),
                // Only when the ask is out of the engine's range.
                Ok(_) => (
                    format!("{} x {} cannot be placed", lease.gpus, lease.gpu_model),
                    false,
                ),
            }
        }
        Some(f) => {
            let largest = scratch
                .nodes
                .values()
                .flat_map(|n| n.gpus.iter())
                .filter(|g| g.model == lease.gpu_model)
                .map(|g| g.vram_gb)
                .max();
            match largest {
                None => (format!("no node offers {} yet", lease.gpu_model), false),
                Some(v) if v < f.vram_gb || f.milli > 1000 || f.milli == 0 => (
                    format!(
                        "a share of {} milli / {} GB does not fit one {} ({v} GB)",
                        f.milli, f.vram_gb, lease.gpu_model
                    ),
                    false,
                ),
                Some(_) => (
                    format!(
                        "waiting for capacity: a share of {} milli / {} GB of one {}",
                        f.milli, f.vram_gb, lease.gpu_model
                    ),
                    true,
                ),
            }
        }
    }
}
