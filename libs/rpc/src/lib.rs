//! Request/reply contracts between services: for each call, its subject, its
//! request and reply types, and a `call` helper.
//!
//! A caller (the gateway, the CLI, a test) depends on this crate and never on
//! the service that answers, so it links none of that service's storage or
//! loops. The answering service depends on it too and serves the same types.
//! Replies travel on `lh.rpc.>` and are never stored in a stream.

pub mod audit;
pub mod balance;
pub mod charges;
pub mod cost_report;
pub mod fleet;
pub mod http;
pub mod invoice_document;
pub mod lease_logs;
pub mod price_book;
pub mod quote;
pub mod reservation;
pub mod session;
pub mod session_lane;
pub mod spot;
pub mod what_if;
pub mod workload_env;
