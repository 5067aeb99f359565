//! The policies the lab compares, by the names `lh-sim --policy` takes: the
//! baselines of the published simulator beside the production policies of
//! `lh_placement`. Names are a research convenience: the scheduler builds
//! its one policy directly and never looks one up.

use lh_placement::policy::{Fgd, Leasehold, Policy};
use lh_placement::ShapeMix;

mod baselines;

pub use baselines::{BestFit, DotProduct, GpuClustering, GpuPacking, RandomPolicy};
pub use baselines::{MAX_SPEC_CPU, MAX_SPEC_GPU};

/// Policy names, as `lh-sim --policy` takes them.
pub const POLICY_NAMES: &[&str] = &[
    "random",
    "dotprod",
    "gpuclustering",
    "gpupacking",
    "bestfit",
    "fgd",
    "leasehold",
];

/// The name of the policy the scheduler runs.
pub const DEFAULT_POLICY: &str = "leasehold";

/// Builds a policy by name. Fragmentation-aware policies measure against
/// `mix` (the distribution of task shapes). The ablations of the default
/// (`leasehold+<switch>`) are built by [`crate::policy_by_name`].
pub fn by_name(name: &str, mix: &ShapeMix) -> Option<Box<dyn Policy>> {
    Some(match name {
        "random" => Box::new(RandomPolicy),
        "dotprod" => Box::new(DotProduct),
        "gpuclustering" => Box::new(GpuClustering),
        "gpupacking" => Box::new(GpuPacking),
        "bestfit" => Box::new(BestFit),
        "fgd" => Box::new(Fgd::new(mix.clone())),
        "leasehold" => Box::new(Leasehold::new(mix.clone())),
        _ => return None,
    })
}
