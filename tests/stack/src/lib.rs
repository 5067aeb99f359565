//! The whole platform in one test process: a real nats-server (or a
//! three-node cluster of them) and a real PostgreSQL started by the test
//! kit, and every service started through the same `start` its binary calls.
//!
//! A crate of its own under `tests/` because it links every service crate:
//! a library must never reach up into a service, so only the system tests
//! (`tests/system`) and the load tests depend on this.
//!
//! [`Stack`] starts and stops the services and talks to the gateway as a
//! tenant would; [`FLEET`] and [`TWO_A100`] are node lists it starts on;
//! the log readers ([`read_log`], [`of_type`], [`expected_charge`]) check
//! what the services wrote; [`chaos`] is the chaos harness built on them, [`red_team`] the red-team
//! harness.

pub mod chaos;
mod fleets;
mod log;
pub mod red_team;
mod stack;

pub use fleets::{enforcing, one_a100_each, FLEET, TWO_A100, TWO_NODES};
pub use log::{expected_charge, of_type, read_log, starts};
pub use stack::{
    test_front, write_master_key_file, GatewayConfigChange, Stack, StackNats, ADMIN_TOKEN,
    AUDITOR_TOKEN,
};
