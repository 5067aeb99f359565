//! Placement research, kept out of the scheduler's dependencies and kept
//! reproducible: every figure of docs/placement.md comes from here.
//!
//! * [`trace`]: the published openb trace experiment (parsing, arrival
//!   sequence, replay, the allocation curve), as pure functions, and the
//!   multi-node variant of a task list.
//! * [`timed`]: a replay with departures and waiting, to measure what a
//!   gang of nodes waits against a task of one node.
//! * [`ablation`]: the default policy with each of its ideas behind a switch,
//!   so that one idea can be measured on its own (`leasehold+<switch>`).
//! * [`policy`]: the baselines of the published simulator, and the
//!   production policies of `lh_placement`, by name.
//! * [`policy_by_name`]: every policy `lh-sim --policy` takes: those of
//!   [`policy`] and the ablations.
//!
//! The `lh-sim` binary adds files, threads and charts; the examples and the
//! `decide` bench replay the same trace.

pub mod ablation;
pub mod policy;
pub mod timed;
pub mod trace;

use lh_placement::policy::Policy;
use lh_placement::ShapeMix;

/// Builds a policy by name: `leasehold+<switch>+<switch>` is the default
/// policy with single ideas switched off or on (see
/// [`ablation::LeaseholdConfig::apply`]); any other name is one of
/// [`policy::POLICY_NAMES`].
pub fn policy_by_name(name: &str, mix: &ShapeMix) -> Option<Box<dyn Policy>> {
    match name.strip_prefix("leasehold+") {
        Some(switches) => {
            let mut cfg = ablation::LeaseholdConfig::default();
            for switch in switches.split('+') {
                cfg.apply(switch)?;
            }
            Some(Box::new(ablation::Ablation::with_config(mix.clone(), cfg)))
        }
        None => policy::by_name(name, mix),
    }
}
