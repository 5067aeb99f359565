//! How fast the projections are rebuilt from the log: events per second a
//! rebuild writes into PostgreSQL, for the gateway's projection, pricing's
//! and the gateway's usage (from the telemetry stream), and whether the
//! rebuilt tables equal the live ones.
//!
//! `cargo build --release -p lh-load-tests --bin rebuild-rate`, then
//! `$CARGO_TARGET_DIR/release/rebuild-rate --leases 5000`
//!
//! A private nats-server (lazy fsync: how the log was made durable changes
//! nothing a replay reads) and PostgreSQL (the test kit's, `fsync=off`) are
//! started. The log is written straight onto `LH_EVENTS`: the default price
//! book, the tenants, then lease after lease `requested`, `placed`, its
//! node's `gpus_allocated` (64 nodes), `started`, `stop_requested`, `ended`
//! and the `charge.accrued` pricing would write for its run; then
//! `--samples-per-lease` usage samples of each lease onto `LH_TELEMETRY`,
//! 10 s apart, from its node. Each projection then runs live over the whole
//! log until it has caught up (its catch-up rate is printed too), and is
//! rebuilt into a fresh schema by `lh_projection::rebuild`, timed; the
//! rebuilt tables are compared with the live ones row for row. The usage
//! projection is replayed (`lh_projection::replay`, as a rebuild carries it
//! over) into the rebuilt gateway schema, whose leases its samples are
//! attributed by. Exits non-zero when a table differs. Before that, the
//! feed alone is timed: what the rebuild reads, counted and dropped (the
//! ceiling of reading), and the same filters read by a plain consumer that
//! leaves the filtering to nats-server.
//!
//! Then the live lag: both projections run live on their schemas while
//! `--live-leases-per-sec` new leases a second are written for
//! `--live-secs` (each `requested`, `placed` 10 ms and `started` 20 ms
//! later, stopped, ended and charged after a second). An event's lag is the time
//! from its publish to the commit of the transaction that applied it (the
//! runner's `on_committed`, for the gateway once its lease views have
//! re-read the batch's leases, as the service does); p50, p99 and the
//! maximum are printed per projection, with the transactions' sizes and
//! the time the lease views took. Exits non-zero when an event was never
//! committed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use clap::Parser;
use futures::StreamExt;
use lh_bus::async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use lh_bus::{Bus, BusConfig, Feed};
use lh_domain::rating;
use lh_events::telemetry::{LeaseGpuUsage, LeaseUsage};
use lh_events::*;
use lh_gateway::lease_views::LeaseViews;
use lh_projection::{Projector, Stream};
use sqlx::migrate::Migrator;
use uuid::Uuid;

const GPU_MODEL: &str = "A100-40GB";
const GPU_VRAM_GB: u32 = 40;
/// Nodes the leases are spread over: their `gpus_allocated` events share
/// a subject per node, as on a real log.
const NODES: usize = 64;
const ZONE: &str = "cn-north-1a";
/// Room given to the log.
const EVENTS_MAX_BYTES: i64 = 8 * 1024 * 1024 * 1024;
/// Longest a live projection may take to catch up with the written log.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(1800);
/// How long each lease ran, so that every one is billed.
const RUN_SECS: i64 = 90;
/// Seconds between two usage samples of a lease.
const SAMPLE_INTERVAL_SECS: i64 = 10;
/// The live phase writes its leases in steps of this length.
const LIVE_TICK: Duration = Duration::from_millis(10);
/// Steps from a lease's request to its end (a second).
const LIVE_TICKS_TO_END: u64 = 100;
/// Longest the feed may fall silent before the head while timed alone.
const FEED_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest the live projections may take to apply the live phase's last
/// event once it is written.
const LIVE_SETTLE_LIMIT: Duration = Duration::from_secs(120);

#[derive(Parser)]
struct Args {
    /// Leases written, each requested, placed, started, stopped, ended and charged.
    #[arg(long, default_value_t = 5_000)]
    leases: usize,
    #[arg(long, default_value_t = 200)]
    tenants: usize,
    /// Publishes whose acknowledgement may be outstanding at once.
    #[arg(long, default_value_t = 2048)]
    max_in_flight: usize,
    /// New leases a second while the projections run live (0: no live phase).
    #[arg(long, default_value_t = 3_000)]
    live_leases_per_sec: usize,
    /// How long the live phase writes new leases.
    #[arg(long, default_value_t = 20)]
    live_secs: u64,
    /// Usage samples of each lease written onto the telemetry stream.
    #[arg(long, default_value_t = 5)]
    samples_per_lease: usize,
}

fn node_of(i: usize) -> String {
    format!("node-{:04}", i % NODES)
}

fn gpu_of(i: usize) -> u32 {
    ((i / NODES) % 8) as u32
}

/// One whole lease: its life and the charges of its run.
fn lease_events(
    tenant_id: Uuid,
    i: usize,
    lease_id: Uuid,
    book: &PriceBookPublished,
) -> Vec<Envelope> {
    let node_id = node_of(i);
    let gpu = gpu_of(i);
    let now = Utc::now();
    let started_at = now - chrono::Duration::seconds(RUN_SECS);
    let scheduler = Actor::Service("scheduler".into());
    let node = Actor::Node(node_id.clone());
    let ended = Envelope::new(
        node.clone(),
        now,
        EventData::LeaseEnded(fixtures::ended(lease_id, &node_id, now, EndReason::Stopped)),
    );
    let segment = rating::Segment {
        lease_id,
        index: 0,
        tenant_id,
        tier: Tier::Basic,
        gpus: 1,
        vram_gb_per_gpu: GPU_VRAM_GB,
        started_at,
        ended_at: now,
    };
    let mut out = vec![
        Envelope::new(
            Actor::Tenant(tenant_id),
            now,
            EventData::LeaseRequested(fixtures::whole_request(lease_id, tenant_id, 1, GPU_MODEL)),
        ),
        Envelope::new(
            scheduler.clone(),
            now,
            EventData::LeasePlaced(fixtures::placed(
                lease_id,
                &node_id,
                ZONE,
                GPU_MODEL,
                GPU_VRAM_GB,
                &[gpu],
            )),
        ),
        Envelope::new(
            scheduler,
            now,
            EventData::NodeGpusAllocated(NodeGpusAllocated::one(
                node_id.clone(),
                lease_id,
                vec![gpu],
            )),
        ),
        Envelope::new(
            node,
            now,
            EventData::LeaseStarted(fixtures::started(lease_id, &node_id, started_at)),
        ),
        Envelope::new(
            Actor::Tenant(tenant_id),
            now,
            EventData::LeaseStopRequested(LeaseStopRequested { lease_id }),
        ),
        ended.clone(),
    ];
    out.extend(rating::charges(book, &segment).into_iter().map(|c| {
        Envelope::new(
            Actor::Service("pricing".into()),
            now,
            EventData::ChargeAccrued(c.clone()),
        )
        .caused_by(&ended)
        .with_id(c.charge_id)
    }));
    out
}

/// The `n`-th usage sample of the `i`-th lease, from its node, during its
/// run: (subject, payload).
fn usage_sample(i: usize, lease_id: Uuid, n: usize) -> (String, Vec<u8>) {
    let node_id = node_of(i);
    let gpu = gpu_of(i);
    let at = Utc::now() - chrono::Duration::seconds(RUN_SECS)
        + chrono::Duration::seconds(SAMPLE_INTERVAL_SECS * n as i64);
    let usage = LeaseUsage {
        lease_id,
        tenant_id: None,
        node_id: node_id.clone(),
        at,
        gpus: vec![LeaseGpuUsage {
            index: gpu,
            uuid: format!("GPU-{node_id}-{gpu}"),
            utilization_pct: Some(((i + n) % 101) as u32),
            memory_used_mib: 1024 * (1 + n as u64),
            shared: false,
            temperature_c: Some(40 + (n % 40) as u32),
            power_w: Some(100.0 + 0.5 * n as f64),
        }],
    };
    (
        subject::usage(&node_id, lease_id),
        serde_json::to_vec(&usage).expect("a sample serialises"),
    )
}

/// Writes the log; returns its head and the leases written, in order.
async fn write_log(bus: &Bus, args: &Args) -> anyhow::Result<(u64, Vec<Uuid>)> {
    lh_pricing::charges::ensure_price_book(bus, Utc::now()).await?;
    let book = rating::default_price_book(chrono::DateTime::UNIX_EPOCH);
    let mut out = lh_load_tests::Appender::new(bus.jetstream().clone(), args.max_in_flight, 1);
    let tenants: Vec<Uuid> = (0..args.tenants.max(1)).map(|_| Uuid::now_v7()).collect();
    for &tenant_id in &tenants {
        out.append(&lh_load_tests::tenant_created(tenant_id, 8))
            .await?;
    }
    let mut leases = Vec::with_capacity(args.leases);
    for i in 0..args.leases {
        let lease_id = Uuid::now_v7();
        for e in lease_events(tenants[i % tenants.len()], i, lease_id, &book) {
            out.append(&e).await?;
        }
        leases.push(lease_id);
    }
    out.flush().await?;
    Ok((bus.last_sequence().await?, leases))
}

/// Writes `--samples-per-lease` usage samples of each lease, lease after
/// lease; returns the telemetry stream's head.
async fn write_samples(bus: &Bus, args: &Args, leases: &[Uuid]) -> anyhow::Result<u64> {
    let mut out = lh_load_tests::Appender::new(bus.jetstream().clone(), args.max_in_flight, 0);
    for (i, &lease_id) in leases.iter().enumerate() {
        for n in 0..args.samples_per_lease {
            let (subject, payload) = usage_sample(i, lease_id, n);
            out.append_sample(subject, payload).await?;
        }
    }
    out.flush().await?;
    Ok(bus.telemetry_last_sequence().await?)
}

/// The head of the stream `projector` reads.
async fn head_of<P: Projector>(bus: &Bus, projector: &P) -> anyhow::Result<u64> {
    Ok(match projector.stream() {
        Stream::Events => bus.last_sequence().await?,
        Stream::Telemetry => bus.telemetry_last_sequence().await?,
    })
}

/// Reads what `projector` reads from the start to `head` through the bus's
/// feed (what a rebuild reads) and drops each message: (messages, time).
async fn read_feed<P: Projector>(
    bus: &Bus,
    projector: &P,
    head: u64,
) -> anyhow::Result<(u64, Duration)> {
    let start = Instant::now();
    let read = match projector.stream() {
        Stream::Events => {
            let feed = bus.reread(projector.filters(), 1).await?;
            drain(feed, head, |item| (item.sequence(), item.pending())).await?
        }
        Stream::Telemetry => {
            let feed = bus.telemetry_feed(projector.filters(), 1).await?;
            drain(feed, head, |sample| (sample.sequence, sample.pending)).await?
        }
    };
    Ok((read, start.elapsed()))
}

/// Messages read from `feed` until its last one, or `head`; `at` tells a
/// message's (sequence, pending).
async fn drain<T>(
    mut feed: Feed<T>,
    head: u64,
    at: impl Fn(&T) -> (u64, u64),
) -> anyhow::Result<u64> {
    let mut read = 0;
    loop {
        let item = feed
            .next_item_within(FEED_READ_TIMEOUT)
            .await
            .context("the feed fell silent before the head")??;
        read += 1;
        let (sequence, pending) = at(&item);
        if pending == 0 || sequence >= head {
            return Ok(read);
        }
    }
}

/// The same read by one ordered consumer of `filters`: nats-server does the
/// filtering.
async fn read_filtered<P: Projector>(
    bus: &Bus,
    projector: &P,
    head: u64,
) -> anyhow::Result<(u64, Duration)> {
    let start = Instant::now();
    let name = match projector.stream() {
        Stream::Events => subject::EVENTS_STREAM,
        Stream::Telemetry => subject::TELEMETRY_STREAM,
    };
    let filters = projector.filters();
    let stream = bus.jetstream().get_stream(name).await?;
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subjects: filters.iter().map(|f| f.to_string()).collect(),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let mut read = 0;
    loop {
        let message = tokio::time::timeout(FEED_READ_TIMEOUT, messages.next())
            .await
            .context("the consumer fell silent before the head")?
            .context("the consumer ended")??;
        read += 1;
        let info = message.info().map_err(|e| anyhow::anyhow!("{e}"))?;
        if info.pending == 0 || info.stream_sequence >= head {
            return Ok((read, start.elapsed()));
        }
    }
}

/// One projection's figures.
struct Measured {
    /// Messages the feed handed over, and how long reading alone took.
    feed: (u64, Duration),
    /// The same read filtered by nats-server alone.
    filtered: (u64, Duration),
    events: u64,
    live: Duration,
    rebuild: Duration,
    differing: Vec<&'static str>,
}

/// How a projection is brought into `{schema}_rebuild`.
#[derive(Clone, Copy)]
enum Rebuild {
    /// `lh_projection::rebuild`: a fresh schema.
    Fresh,
    /// `lh_projection::replay` into the schema as it stands (the usage
    /// projection, into the rebuilt gateway schema).
    Into,
}

/// Runs `projector` live into `schema` until it has caught up, then
/// rebuilds it into `{schema}_rebuild` and compares the two.
async fn measure<P: Projector>(
    bus: &Bus,
    database_url: &str,
    schema: &str,
    migrator: &Migrator,
    projector: &P,
    tables: &[&'static str],
    how: Rebuild,
) -> anyhow::Result<Measured> {
    let head = head_of(bus, projector).await?;
    let feed = read_feed(bus, projector, head).await?;
    let filtered = read_filtered(bus, projector, head).await?;
    let pool = lh_projection::connect_schema(database_url, schema).await?;
    lh_projection::migrate(&pool, migrator).await?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (progress_tx, progress_rx) = tokio::sync::oneshot::channel();
    let start = Instant::now();
    let live = lh_projection::run(
        bus,
        &pool,
        projector,
        async {
            let _ = stop_rx.await;
        },
        |p| {
            let _ = progress_tx.send(p);
        },
    );
    let wait = async {
        let progress = progress_rx.await.context("the projection started")?;
        let caught_up = progress.wait_caught_up(CATCH_UP_LIMIT).await;
        let elapsed = start.elapsed();
        let _ = stop_tx.send(());
        anyhow::ensure!(caught_up, "{} did not catch up", projector.name());
        Ok(elapsed)
    };
    let (ran, live) = tokio::join!(live, wait);
    ran?;
    let live = live?;
    pool.close().await;

    let into = format!("{schema}_rebuild");
    let mut events = 0u64;
    let start = Instant::now();
    match how {
        Rebuild::Fresh => {
            lh_projection::rebuild(bus, database_url, &into, migrator, projector, |_, _| {
                events += 1
            })
            .await?;
        }
        Rebuild::Into => {
            let pool = lh_projection::connect_schema(database_url, &into).await?;
            lh_projection::replay(bus, &pool, projector, |_, _| events += 1).await?;
            pool.close().await;
        }
    }
    let rebuild = start.elapsed();
    let tables = [tables, &[lh_projection::SKIPPED_TABLE]].concat();
    let differing = lh_projection::compare_tables(database_url, schema, &into, &tables)
        .await?
        .into_iter()
        .filter(|c| !c.identical())
        .map(|c| c.table)
        .collect();
    Ok(Measured {
        feed,
        filtered,
        events,
        live,
        rebuild,
        differing,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if std::env::var("RUST_LOG").is_ok() {
        lh_telemetry::init("rebuild-rate", lh_telemetry::LogFormat::Pretty);
    }
    let nats = lh_load_tests::NatsServer::start(false)?;
    let mut config = BusConfig::new(nats.url(), "rebuild-rate");
    config.events_max_bytes = EVENTS_MAX_BYTES;
    let bus = Bus::connect(&config).await?;
    let postgres = lh_testkit::Postgres::start().await?;
    let database_url = postgres.create_database().await?;

    let start = Instant::now();
    let (head, leases) = write_log(&bus, &args).await?;
    println!(
        "rebuild-rate: wrote {head} events in {:.1}s: {} tenants, {} leases (requested, placed, allocated, started, stopped, ended, charged)",
        start.elapsed().as_secs_f64(),
        args.tenants,
        args.leases
    );
    let start = Instant::now();
    let samples = write_samples(&bus, &args, &leases).await?;
    println!(
        "rebuild-rate: wrote {samples} usage samples in {:.1}s ({} a lease)",
        start.elapsed().as_secs_f64(),
        args.samples_per_lease
    );

    let gateway = measure(
        &bus,
        &database_url,
        "gateway",
        &lh_gateway::projection::MIGRATOR,
        &lh_gateway::projection::GatewayProjection,
        lh_gateway::projection::TABLES,
        Rebuild::Fresh,
    )
    .await?;
    let pricing = measure(
        &bus,
        &database_url,
        "pricing",
        &lh_pricing::MIGRATOR,
        &lh_pricing::projection::InvoiceProjector,
        lh_pricing::projection::TABLES,
        Rebuild::Fresh,
    )
    .await?;
    // Into the gateway's schemas: samples are attributed by their leases.
    let usage = measure(
        &bus,
        &database_url,
        "gateway",
        &lh_gateway::projection::MIGRATOR,
        &lh_gateway::usage::UsageProjection,
        &[lh_gateway::usage::TABLE],
        Rebuild::Into,
    )
    .await?;

    println!(
        "{:<10} {:>9} {:>10} {:>13} {:>10} {:>12} {:>10} {:>12}  identical",
        "projection",
        "events",
        "feed ev/s",
        "filtered ev/s",
        "live",
        "live ev/s",
        "rebuild",
        "rebuild ev/s"
    );
    let mut differing = Vec::new();
    for (name, m) in [
        ("gateway", &gateway),
        ("pricing", &pricing),
        ("usage", &usage),
    ] {
        println!(
            "{:<10} {:>9} {:>10.0} {:>13.0} {:>9.2}s {:>12.0} {:>9.2}s {:>12.0}  {}",
            name,
            m.events,
            m.feed.0 as f64 / m.feed.1.as_secs_f64(),
            m.filtered.0 as f64 / m.filtered.1.as_secs_f64(),
            m.live.as_secs_f64(),
            m.events as f64 / m.live.as_secs_f64(),
            m.rebuild.as_secs_f64(),
            m.events as f64 / m.rebuild.as_secs_f64(),
            if m.differing.is_empty() {
                "yes".to_string()
            } else {
                format!("NO: {:?}", m.differing)
            }
        );
        differing.extend(m.differing.iter().map(|t| format!("{name}.{t}")));
    }
    anyhow::ensure!(differing.is_empty(), "rebuilt tables differ: {differing:?}");
    if args.live_leases_per_sec > 0 {
        live_lag(&bus, &database_url, &args).await?;
    }
    Ok(())
}

/// Publish instants of the events one projection reads, by subject, and
/// the lag of each one committed.
#[derive(Default)]
struct Lags {
    published: HashMap<String, VecDeque<Instant>>,
    lags: Vec<Duration>,
    /// Transactions committed.
    transactions: usize,
    /// Time the lease views took to re-read each transaction's leases.
    refreshes: Vec<Duration>,
}

impl Lags {
    fn transaction(&mut self, subjects: &[String]) {
        self.transactions += 1;
        for subject in subjects {
            self.committed(subject);
        }
    }

    fn committed(&mut self, subject: &str) {
        if let Some(published) = self.published.get_mut(subject) {
            if let Some(at) = published.pop_front() {
                self.lags.push(at.elapsed());
            }
            if published.is_empty() {
                self.published.remove(subject);
            }
        }
    }

    fn unapplied(&self) -> usize {
        self.published.values().map(VecDeque::len).sum()
    }

    fn report(&mut self, name: &str) -> String {
        self.lags.sort();
        let at = |q: f64| {
            let i = ((self.lags.len() as f64 * q).ceil() as usize).clamp(1, self.lags.len());
            self.lags[i - 1].as_secs_f64() * 1e3
        };
        if self.lags.is_empty() {
            return format!("{name}: no event committed");
        }
        let mut line = format!(
            "{name:<8} {:>8} events  p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  in {} transactions",
            self.lags.len(),
            at(0.5),
            at(0.99),
            at(1.0),
            self.transactions,
        );
        if !self.refreshes.is_empty() {
            self.refreshes.sort();
            let total: Duration = self.refreshes.iter().sum();
            let p99 = self.refreshes[(self.refreshes.len() * 99).div_ceil(100) - 1];
            line += &format!(
                "; lease views re-read: p99 {:.1} ms, max {:.1} ms, {:.2} s in all",
                p99.as_secs_f64() * 1e3,
                self.refreshes.last().expect("one").as_secs_f64() * 1e3,
                total.as_secs_f64()
            );
        }
        line
    }
}

/// Runs `projector` live on `schema` (as left by [`measure`]), telling
/// `lags` of each committed subject, until `stop` resolves; with `views`,
/// each transaction's leases are re-read into them first, as the gateway
/// does before it reports the transaction. Spawned, as a service spawns
/// its projection: the runners and the writer each have a task.
#[allow(clippy::too_many_arguments)]
async fn run_live<P: Projector>(
    bus: Bus,
    database_url: String,
    schema: &'static str,
    projector: P,
    views: Option<Arc<LeaseViews>>,
    lags: Arc<Mutex<Lags>>,
    stop: tokio::sync::watch::Receiver<bool>,
    progress: tokio::sync::oneshot::Sender<lh_projection::Progress>,
) -> anyhow::Result<()> {
    let pool = lh_projection::connect_schema(&database_url, schema).await?;
    let mut stop = stop;
    lh_projection::run_observed(
        &bus,
        &pool,
        &projector,
        async move {
            let _ = stop.wait_for(|s| *s).await;
        },
        |p| {
            let _ = progress.send(p);
        },
        |subjects| {
            let (views, pool, lags) = (views.clone(), pool.clone(), lags.clone());
            async move {
                let refreshed = match views {
                    Some(views) => {
                        let start = Instant::now();
                        views.refresh_committed(&pool, &subjects).await;
                        Some(start.elapsed())
                    }
                    None => None,
                };
                let mut lags = lags.lock().expect("lags");
                lags.transaction(&subjects);
                lags.refreshes.extend(refreshed);
            }
        },
    )
    .await?;
    pool.close().await;
    Ok(())
}

/// Writes new leases at the asked rate while both projections run live,
/// and prints each one's lag from publish to commit.
async fn live_lag(bus: &Bus, database_url: &str, args: &Args) -> anyhow::Result<()> {
    let gateway = Arc::new(Mutex::new(Lags::default()));
    let pricing = Arc::new(Mutex::new(Lags::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (gateway_tx, gateway_progress) = tokio::sync::oneshot::channel();
    let (pricing_tx, pricing_progress) = tokio::sync::oneshot::channel();
    let gateway_run = tokio::spawn(run_live(
        bus.clone(),
        database_url.to_string(),
        "gateway",
        lh_gateway::projection::GatewayProjection,
        Some(Arc::new(LeaseViews::default())),
        gateway.clone(),
        stop_rx.clone(),
        gateway_tx,
    ));
    let pricing_run = tokio::spawn(run_live(
        bus.clone(),
        database_url.to_string(),
        "pricing",
        lh_pricing::projection::InvoiceProjector,
        None,
        pricing.clone(),
        stop_rx,
        pricing_tx,
    ));
    let write = async {
        // Both have read their offsets before the first lease is written.
        gateway_progress.await.context("gateway started")?;
        pricing_progress.await.context("pricing started")?;
        let book = rating::default_price_book(chrono::DateTime::UNIX_EPOCH);
        let tenants: Vec<Uuid> = (0..args.tenants.max(1)).map(|_| Uuid::now_v7()).collect();
        let mut out = lh_load_tests::Appender::new(bus.jetstream().clone(), args.max_in_flight, 0);
        let readers: [(&[&str], &Arc<Mutex<Lags>>); 2] = [
            (
                lh_gateway::projection::GatewayProjection.filters(),
                &gateway,
            ),
            (lh_pricing::projection::InvoiceProjector.filters(), &pricing),
        ];
        // The tenants first, outside the timed part.
        for &tenant_id in &tenants {
            out.append(&lh_load_tests::tenant_created(tenant_id, 8))
                .await?;
        }
        out.flush().await?;
        let ticks = args.live_secs * 1000 / LIVE_TICK.as_millis() as u64;
        let per_tick = args.live_leases_per_sec as f64 * LIVE_TICK.as_secs_f64();
        // Made before the clock starts: the writer's own work is not what
        // is measured.
        let total = (ticks as f64 * per_tick) as usize;
        let mut lives = (0..total)
            .map(|i| lease_events(tenants[i % tenants.len()], i, Uuid::now_v7(), &book))
            .collect::<Vec<_>>()
            .into_iter();
        let mut due: BTreeMap<u64, Vec<Envelope>> = BTreeMap::new();
        let mut interval = tokio::time::interval(LIVE_TICK);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let started = Instant::now();
        let mut leases = 0usize;
        let mut written = 0usize;
        let mut tick = 0u64;
        while tick < ticks || !due.is_empty() {
            interval.tick().await;
            if tick < ticks {
                let until = ((tick + 1) as f64 * per_tick) as usize;
                while leases < until {
                    let mut events = lives.next().expect("made ahead").into_iter();
                    let mut stage = |at: u64, e: Envelope| due.entry(at).or_default().push(e);
                    stage(tick, events.next().expect("requested"));
                    stage(tick + 1, events.next().expect("placed"));
                    stage(tick + 1, events.next().expect("gpus_allocated"));
                    stage(tick + 2, events.next().expect("started"));
                    for e in events {
                        stage(tick + LIVE_TICKS_TO_END, e);
                    }
                    leases += 1;
                }
            }
            for envelope in due.remove(&tick).unwrap_or_default() {
                let subject = envelope.subject();
                let now = Instant::now();
                for (filters, lags) in &readers {
                    if filters.iter().any(|f| subject::matches(f, &subject)) {
                        lags.lock()
                            .expect("lags")
                            .published
                            .entry(subject.clone())
                            .or_default()
                            .push_back(now);
                    }
                }
                out.append(&envelope).await?;
                written += 1;
            }
            tick += 1;
        }
        out.flush().await?;
        let wrote_for = started.elapsed();
        // Every event written is committed by the projections that read it.
        let settle_start = Instant::now();
        let settled = loop {
            let unapplied = gateway.lock().expect("lags").unapplied()
                + pricing.lock().expect("lags").unapplied();
            if unapplied == 0 {
                break true;
            }
            if settle_start.elapsed() > LIVE_SETTLE_LIMIT {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let _ = stop_tx.send(true);
        println!(
            "live: {leases} leases, {written} events written in {:.1}s ({:.0} leases/s, {:.0} events/s)",
            wrote_for.as_secs_f64(),
            leases as f64 / wrote_for.as_secs_f64(),
            written as f64 / wrote_for.as_secs_f64()
        );
        anyhow::Ok(settled)
    };
    let (gateway_ran, pricing_ran, wrote) = tokio::join!(gateway_run, pricing_run, write);
    gateway_ran??;
    pricing_ran??;
    let settled = wrote?;
    let mut unapplied = 0;
    for (name, lags) in [("gateway", &gateway), ("pricing", &pricing)] {
        let mut lags = lags.lock().expect("lags");
        println!("lag publish -> commit: {}", lags.report(name));
        unapplied += lags.unapplied();
    }
    anyhow::ensure!(
        settled && unapplied == 0,
        "{unapplied} events were not committed within {LIVE_SETTLE_LIMIT:?}"
    );
    Ok(())
}
