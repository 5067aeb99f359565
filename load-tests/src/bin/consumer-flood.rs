//! What one node's credential can cost the others through consumers: it
//! makes consumers of its view (the only stream of the log's account it
//! may read, docs/adr/028) as fast as it can, with the longest idle time
//! allowed, on a secured server of the deployment's accounts, while a
//! service keeps making consumers of the log and asking it for its head.
//! Reports how many the node made and had refused, the server's memory,
//! and the service's consumers and latency before and during.
//!
//! `cargo run --release -p lh-load-tests --bin consumer-flood -- --seconds 30`

use std::time::{Duration, Instant};

use async_nats::jetstream;
use clap::Parser;
use lh_bus::{auth, Bus, BusConfig, Credentials, CONSUMER_MAX_IDLE};
use lh_events::subject;
use lh_testkit::Nats;

#[derive(Parser)]
struct Args {
    /// How long the node makes consumers.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Creates in flight at once, over the node's one connection.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

const NODE: &str = "n1";

fn seed() -> String {
    nkeys::KeyPair::new_user().seed().expect("a new seed")
}

fn public(seed: &str) -> String {
    nkeys::KeyPair::from_seed(seed)
        .expect("a seed")
        .public_key()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Milliseconds of `n` stream-info requests by a service: p50 and p99.
async fn service_latency(bus: &Bus, n: usize) -> (f64, f64) {
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let _ = bus.last_sequence().await;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    (ms[n / 2], ms[(n * 99 / 100).min(n - 1)])
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let scheduler_seed = seed();
    let node_seed = seed();
    // The server refuses permissions.conf with a variable no user uses.
    let fixed: Vec<(String, String)> = auth::fixed_users()
        .into_iter()
        .map(|(user, _)| {
            let key = if user == "scheduler" {
                public(&scheduler_seed)
            } else {
                public(&seed())
            };
            (user, key)
        })
        .collect();
    let users = auth::users_conf(&fixed, &[(NODE.to_string(), public(&node_seed))]);
    let nats = Nats::start_secured(
        vec![
            ("permissions.conf".into(), auth::permissions_conf()),
            ("users.conf".into(), users),
        ],
        "include \"users.conf\"",
    )
    .await?;
    let pid = nats.pid().expect("the server runs");
    let mut config = BusConfig::new(nats.url(), "scheduler");
    config.credentials = Credentials::Nkey {
        user: "scheduler".into(),
        seed: scheduler_seed,
    };
    let scheduler = Bus::connect(&config).await?;
    let node = async_nats::ConnectOptions::new()
        .nkey(node_seed)
        .custom_inbox_prefix(auth::inbox_prefix(&auth::node_user(NODE)))
        .connect(nats.url())
        .await?;
    scheduler.ensure_node_view_stream(NODE).await?;
    let log = jetstream::with_prefix(node, auth::NODE_LOG_API_PREFIX);
    let events = log.get_stream(subject::node_view_stream(NODE)).await?;
    let view = subject::guarded(&subject::node_view(NODE));

    let (p50_before, p99_before) = service_latency(&scheduler, 200).await;
    let rss_before = rss_kib(pid);
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let events = events.clone();
        let view = view.clone();
        tasks.push(tokio::spawn(async move {
            let (mut made, mut refused, mut why) = (0u64, 0u64, None);
            while Instant::now() < deadline {
                let consumer = events
                    .create_consumer(jetstream::consumer::pull::Config {
                        name: Some(uuid::Uuid::new_v4().simple().to_string()),
                        filter_subject: view.clone(),
                        inactive_threshold: CONSUMER_MAX_IDLE,
                        ..Default::default()
                    })
                    .await;
                match consumer {
                    Ok(_) => made += 1,
                    Err(e) => {
                        refused += 1;
                        why.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            (made, refused, why)
        }));
    }
    let (p50_during, p99_during) = service_latency(&scheduler, 200).await;
    // The service's own consumers of the log, made while the node floods.
    let (mut service_made, mut service_refused) = (0u64, 0u64);
    while Instant::now() < deadline {
        match scheduler.feed(&[subject::EVENTS_ALL], 1).await {
            Ok(_) => service_made += 1,
            Err(_) => service_refused += 1,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut made, mut refused, mut why) = (0, 0, None);
    for task in tasks {
        let (m, r, w) = task.await?;
        made += m;
        refused += r;
        why = why.or(w);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let rss_after = rss_kib(pid);
    let alive = scheduler
        .jetstream()
        .get_stream(subject::node_view_stream(NODE))
        .await?
        .info()
        .await?
        .state
        .consumer_count;
    let rate = made as f64 / elapsed;
    let per_consumer_kib = rss_after.saturating_sub(rss_before) as f64 / made.max(1) as f64;
    println!(
        "consumer-flood: seconds={elapsed:.1} made={made} refused={refused} rate={rate:.0}/s alive_on_view={alive} \
         rss_before={:.0}MiB rss_after={:.0}MiB per_consumer={per_consumer_kib:.1}KiB \
         service_p50_ms={p50_before:.2}->{p50_during:.2} service_p99_ms={p99_before:.2}->{p99_during:.2} \
         service_feeds_made={service_made} service_feeds_refused={service_refused} first_refusal={:?}",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        why.unwrap_or_default(),
    );
    Ok(())
}
