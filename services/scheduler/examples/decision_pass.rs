//! One decision pass of the pure scheduler state at fleet scale, without
//! NATS: the CPU the pass itself costs, to profile (`perf record -g`).
//!
//! `cargo run --release -p lh-scheduler --example decision_pass -- 10000 1000 5`
//! (nodes of 8 GPUs, one-GPU leases waiting, passes timed). Every pass
//! decides the same waiting leases (nothing it decides is stored): the
//! first builds the placement engine, the next ones find it kept. A fourth
//! argument places that many one-GPU leases first (decided and stored as
//! the log would), so that the passes run beside live leases.

use std::time::Instant;

use chrono::Utc;
use lh_events::{fixtures, Actor, Envelope, EventData};
use lh_scheduler::state::PlacementEngineCache;
use lh_scheduler::State;
use uuid::Uuid;

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let (nodes, queued, passes, held) = (arg(1, 10_000), arg(2, 1_000), arg(3, 5), arg(4, 0));
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
    let mut config = lh_scheduler::Config::for_test("nats://127.0.0.1:4222");
    config.node_lost_after_ms = 0;
    let rules = config.rules();
    let mut engine = PlacementEngineCache::default();
    if held > 0 {
        for _ in 0..held {
            let request = fixtures::whole_request(Uuid::now_v7(), tenant, 1, fixtures::MODEL);
            apply(&mut state, EventData::LeaseRequested(request));
        }
        for batch in state.decide(now, &rules, &mut engine).batches {
            for (event, _) in batch {
                apply(&mut state, event.data);
            }
        }
    }
    for _ in 0..queued {
        let request = fixtures::whole_request(Uuid::now_v7(), tenant, 1, fixtures::MODEL);
        apply(&mut state, EventData::LeaseRequested(request));
    }
    for _ in 0..passes {
        let (began, cpu_began) = (Instant::now(), cpu_ns());
        let decisions = state.decide(now, &rules, &mut engine);
        let took = began.elapsed();
        let cpu = cpu_ns().zip(cpu_began).map(|(end, start)| end - start);
        println!(
            "decision pass: nodes={nodes} held={held} queued={queued} batches={} took_ms={:.1} cpu_ms={}",
            decisions.batches.len(),
            took.as_secs_f64() * 1e3,
            cpu.map_or("?".into(), |ns| format!("{:.1}", ns as f64 / 1e6)),
        );
    }
}

/// Nanoseconds this thread has run on a CPU (Linux): on a machine shared
/// with other work, steadier than the wall clock, which counts the time
/// the thread waited for a CPU too.
fn cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}
