//! One decision pass of the pure scheduler state at fleet scale, without
//! NATS: the CPU the pass itself costs, to profile (`perf record -g`).
//!
//! `cargo run --release -p lh-scheduler --example decision_pass -- 10000 1000 5`
//! (nodes of 8 GPUs, one-GPU leases waiting, passes timed).

use std::time::Instant;

use chrono::Utc;
use lh_events::{fixtures, Actor, Envelope, EventData};
use lh_scheduler::State;
use uuid::Uuid;

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let (nodes, queued, passes) = (arg(1, 10_000), arg(2, 1_000), arg(3, 5));
    let now = Utc::now();
    let envelope = |data| Envelope::new(Actor::Admin, now, data);
    let mut state = State::default();
    let mut sequence = 0u64;
    let mut apply = |state: &mut State, data| {
        sequence += 1;
        state.apply(sequence, &envelope(data));
    };
    for n in 0..nodes {
        let node = fixtures::node(
            &format!("node-{n:05}"),
            &format!("z{}", n % 3),
            8,
            fixtures::MODEL,
            fixtures::MODEL_VRAM_GB,
        );
        apply(&mut state, EventData::NodeRegistered(node));
    }
    let tenant = Uuid::now_v7();
    apply(
        &mut state,
        EventData::TenantCreated(fixtures::tenant(tenant, u32::MAX)),
    );
    for _ in 0..queued {
        let request = fixtures::whole_request(Uuid::now_v7(), tenant, 1, fixtures::MODEL);
        apply(&mut state, EventData::LeaseRequested(request));
    }
    let mut config = lh_scheduler::Config::for_test("nats://127.0.0.1:4222");
    config.node_lost_after_ms = 0;
    let rules = config.rules();
    for _ in 0..passes {
        let began = Instant::now();
        let decisions = state.decide(now, &rules);
        println!(
            "decision pass: nodes={nodes} queued={queued} batches={} took_ms={:.1}",
            decisions.batches.len(),
            began.elapsed().as_secs_f64() * 1e3
        );
    }
}
