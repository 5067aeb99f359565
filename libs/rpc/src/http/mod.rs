//! The REST API's bodies: what the gateway reads from a request and writes
//! in an answer, and what `lh` sends and reads back, one type for both
//! ends. One file per resource, as the gateway's handlers have them.
//!
//! Only data shapes live here, with the serde attributes that fix their
//! JSON (which fields a body may omit, which an answer leaves out when
//! empty) and their OpenAPI schema. Checking a body against the rules, and
//! the problem a refusal answers with, is the gateway's. An answer the
//! gateway relays from another service is that service's type, named in
//! its own module ([`crate::balance::Balance`], [`crate::charges`],
//! [`crate::price_book::PriceBooks`], ...).

pub mod balances;
pub mod billing;
pub mod datasets;
pub mod keys;
pub mod lease_logs;
pub mod leases;
pub mod nodes;
pub mod price_books;
pub mod problem;
pub mod quotes;
pub mod reservations;
pub mod sessions;
pub mod ssh_keys;
pub mod templates;
pub mod tenants;
pub mod usage;
pub mod workspaces;

pub use problem::Problem;
