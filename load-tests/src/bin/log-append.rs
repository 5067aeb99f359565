//! What `sync_interval: always` costs: appends per second to LH_EVENTS on
//! two nats-servers started side by side, one fsyncing every write and one
//! with the server's default (lazy, every 2 minutes), sequentially (one
//! append waits for its ack) and with concurrent writers.
//!
//! `cargo run --release -p lh-load-tests --bin log-append -- --events 3000`

use std::time::Instant;

use chrono::Utc;
use clap::Parser;
use lh_bus::{Bus, BusConfig, Expect};
use lh_events::{Actor, Envelope, EventData, LeaseStopRequested};

#[derive(Parser)]
struct Args {
    /// Events appended per measurement.
    #[arg(long, default_value_t = 3000)]
    events: usize,
    /// Concurrent writers in the parallel measurement.
    #[arg(long, default_value_t = 32)]
    writers: usize,
}

fn event() -> Envelope {
    Envelope::new(
        Actor::Admin,
        Utc::now(),
        EventData::LeaseStopRequested(LeaseStopRequested {
            lease_id: uuid::Uuid::now_v7(),
        }),
    )
}

async fn sequential(bus: &Bus, n: usize) -> anyhow::Result<f64> {
    let t = Instant::now();
    for _ in 0..n {
        bus.publish(&event(), Expect::Any).await?;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// Two-message atomic batches (a placement's shape), one after another.
async fn atomic_pairs(bus: &Bus, n: usize) -> anyhow::Result<f64> {
    let t = Instant::now();
    for _ in 0..n / 2 {
        bus.publish_atomic(&[(event(), Expect::Any), (event(), Expect::Any)])
            .await?;
    }
    Ok((n / 2) as f64 / t.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!(
        "log-append: {} events per run, {} concurrent writers, 1 event ≈ 330 bytes",
        args.events, args.writers
    );
    let mut rows = Vec::new();
    for sync_always in [true, false] {
        let server = lh_load_tests::NatsServer::start(sync_always)?;
        let bus = Bus::connect(&BusConfig::new(server.url(), "log-append")).await?;
        // Warm up file creation and the connection.
        sequential(&bus, 100).await?;
        let seq = sequential(&bus, args.events).await?;
        let par =
            lh_load_tests::guarded_append_rate(&bus, args.events, args.writers, event).await?;
        let pairs = atomic_pairs(&bus, args.events).await?;
        let mode = if sync_always { "always" } else { "default" };
        println!(
            "sync_interval={mode:<8} sequential={seq:>9.0}/s parallel={par:>9.0}/s atomic_pairs={pairs:>9.0}/s"
        );
        rows.push((seq, par));
    }
    println!(
        "cost of always: sequential x{:.2} slower, parallel x{:.2} slower",
        rows[1].0 / rows[0].0,
        rows[1].1 / rows[0].1
    );
    Ok(())
}
