//! End-to-end placement rate through JetStream with `sync_interval: always`:
//! leases placed per second by 1..N active-active scheduler replicas, and a
//! check from the log that no GPU was ever held by two leases.
//!
//! `cargo run --release -p lh-load-tests --bin lease-rate -- --leases 1000 --replicas 3`
//!
//! The fleet is registered and a backlog of requests is appended straight
//! onto the log (no gateway); then the replicas start, replay the log and
//! drain the backlog. The figure is leases placed per second from their
//! start to the last placement, replay included.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use clap::Parser;
use lh_bus::{Bus, BusConfig, Expect};
use lh_events::*;
use lh_load_tests::as_its_writer;
use lh_service::CancellationToken;
use uuid::Uuid;

#[derive(Parser)]
struct Args {
    /// Lease requests (1 GPU each) appended at once.
    #[arg(long, default_value_t = 1000)]
    leases: usize,
    /// Scheduler replicas running at once.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Nodes of 8 x A100-40GB (the default fleet holds every lease).
    #[arg(long, default_value_t = 128)]
    nodes: usize,
    /// Concurrent writers appending the requests.
    #[arg(long, default_value_t = 32)]
    writers: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if std::env::var("RUST_LOG").is_ok() {
        lh_telemetry::init("lease-rate", lh_telemetry::LogFormat::Pretty);
    }
    let nats = lh_testkit::Nats::start().await?;
    let bus = Bus::connect(&BusConfig::new(nats.url(), "lease-rate")).await?;
    for n in 0..args.nodes {
        let node_id = format!("node-{n:04}");
        for envelope in lh_load_tests::enrolled(fixtures::node(
            &node_id,
            &format!("z{}", n % 3),
            8,
            fixtures::MODEL,
            fixtures::MODEL_VRAM_GB,
        )) {
            bus.publish(&envelope, Expect::Any).await?;
        }
    }
    let tenant = Uuid::now_v7();
    bus.publish(
        &as_its_writer(EventData::TenantCreated(fixtures::tenant(
            tenant, 1_000_000,
        ))),
        Expect::Any,
    )
    .await?;

    let append_start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        let bus = bus.clone();
        let share = args.leases / args.writers + usize::from(w < args.leases % args.writers);
        tasks.push(tokio::spawn(async move {
            for _ in 0..share {
                let lease_id = Uuid::now_v7();
                let request = as_its_writer(EventData::LeaseRequested(fixtures::whole_request(
                    lease_id,
                    tenant,
                    1,
                    fixtures::MODEL,
                )));
                bus.publish(&request, Expect::LastSubjectSequence(0))
                    .await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let appended = append_start.elapsed();

    // The whole backlog waits; now the schedulers start, replay the log and
    // drain it. The clock runs from their start to the last placement.
    let start = Instant::now();
    let shutdown = CancellationToken::new();
    let mut schedulers = Vec::new();
    for _ in 0..args.replicas {
        let mut config = lh_scheduler::Config::for_test(&nats.url());
        // The nodes here are registered without node-agents: no heartbeats.
        config.node_lost_after_ms = 0;
        schedulers.push(lh_scheduler::start(config, shutdown.clone()).await?);
    }

    // Count placements as they land.
    let mut feed = bus.feed(&[subject::EVENTS_ALL], 1).await?;
    let mut placed = 0usize;
    let mut held: HashMap<(String, u32), Uuid> = HashMap::new();
    let mut seen: HashSet<Uuid> = HashSet::new();
    let mut last_placed = start.elapsed();
    let deadline = Instant::now() + Duration::from_secs(300);
    while placed < args.leases && Instant::now() < deadline {
        let Some(event) = feed.next_within(Duration::from_secs(10)).await else {
            break;
        };
        let event = event?;
        if let EventData::LeasePlaced(p) = &event.envelope.data {
            assert!(seen.insert(p.lease_id), "lease {} placed twice", p.lease_id);
            for g in &p.gpus {
                if let Some(other) = held.insert((p.node_id.clone(), g.index), p.lease_id) {
                    panic!(
                        "GPU {}/{} given to {} while {other} holds it",
                        p.node_id, g.index, p.lease_id
                    );
                }
            }
            placed += 1;
            last_placed = start.elapsed();
        }
    }
    shutdown.cancel();
    for s in schedulers {
        s.wait().await?;
    }
    let rate = placed as f64 / last_placed.as_secs_f64();
    println!(
        "lease-rate: replicas={} leases={} placed={} nodes={} appended_in={:.2}s all_placed_in={:.2}s placed_per_s={:.0} double_allocations=0",
        args.replicas,
        args.leases,
        placed,
        args.nodes,
        appended.as_secs_f64(),
        last_placed.as_secs_f64(),
        rate
    );
    anyhow::ensure!(
        placed == args.leases,
        "only {placed} of {} leases placed",
        args.leases
    );
    Ok(())
}
