//! Pure domain engines of Leasehold: no I/O, no clock. Time and data come
//! in as arguments, so the simulators, benchmarks and services all drive the
//! same code.
//!
//! * [`catalog`]: the GPU models the platform knows.
//! * [`placement`]: where a lease's GPUs go.
//! * [`rating`]: what a lease costs, per invoice period.
//! * [`chain`]: the audit hash chain.

pub mod catalog;
pub mod chain;
pub mod fleet;
pub mod placement;
pub mod rating;
pub mod spot;
