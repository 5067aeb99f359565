//! Pure domain engines of Leasehold: no I/O, no clock. Time and data come
//! in as arguments, so the simulators, benchmarks and services all drive the
//! same code.
//!
//! * [`authority`]: who may act on an aggregate now.
//! * [`catalog`]: the GPU models the platform knows, with their MIG geometry.
//! * [`fleet`]: the GPU fleet as the log describes it.
//! * [`lease`]: what a tenant may request, stop and resume.
//! * [`workload`]: what a workload may carry onto a GPU host.
//! * [`storage`]: what a tenant may name on its object storage, and where
//!   a lease mounts it.
//! * [`rating`]: what a lease costs, per invoice period.
//! * [`storage_rating`]: what a tenant's object storage costs, between
//!   the gateway's measurements.
//! * [`chain`]: the audit hash chain.
//! * [`chain_check`]: verifying the log and its signed checkpoints from the
//!   stream alone, as an auditor does.

pub mod authority;
pub mod catalog;
pub mod chain;
pub mod chain_check;
pub mod fleet;
pub mod lease;
pub mod moves;
pub mod rating;
pub mod restate;
pub mod spot;
pub mod storage;
pub mod storage_rating;
pub mod workload;
