//! Every end-to-end suite, in one test binary. Each suite links the whole
//! platform, about 140 MB of test binary; linked one per suite they would be
//! more than half of a clean build's disk and its link time.
//! nextest still runs every test in a process of its own; a suite is picked
//! by its module path, e.g. `cargo nextest run -p lh-system-tests -E
//! 'test(/^lease_flow::/)'`.

mod audit_query;
mod authority;
mod balance;
mod browser;
mod chaos;
mod concurrency;
mod console;
mod console_account;
mod console_lease;
mod console_oidc;
mod console_operator;
mod console_speed;
mod data;
mod data_at_rest;
mod dependency_rules;
mod erasure;
mod failover;
mod fleet_view;
mod fractions;
mod front_door;
mod gangs;
mod gpu_health;
mod history;
mod lease_flow;
mod lease_views;
mod lease_writes;
mod limits;
mod metrics;
mod mig;
mod outages;
mod queueing;
mod quotes;
mod rebuild_batched;
mod red_team;
mod report_daily;
mod restart;
mod robustness;
mod roles;
mod sessions;
mod spot_market;
mod ssh_keys;
mod templates;
mod tenant_keys;
mod traces;
mod usage;
mod workloads;
