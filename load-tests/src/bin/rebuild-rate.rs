//! How fast the projections are rebuilt from the log: events per second a
//! rebuild writes into PostgreSQL, for the gateway's projection and
//! pricing's, and whether the rebuilt tables equal the live ones.
//!
//! `cargo build --release -p lh-load-tests --bin rebuild-rate`, then
//! `$CARGO_TARGET_DIR/release/rebuild-rate --leases 5000`
//!
//! A private nats-server (lazy fsync: how the log was made durable changes
//! nothing a replay reads) and PostgreSQL (the test kit's, `fsync=off`) are
//! started. The log is written straight onto `LH_EVENTS`: the default price
//! book, the tenants, then lease after lease `requested`, `placed`,
//! `started`, `ended` and the `charge.accrued` pricing would write for its
//! run. Each projection then runs live over the whole log until it has
//! caught up (its catch-up rate is printed too), and is rebuilt into a fresh
//! schema by `lh_projection::rebuild`, timed; the rebuilt tables are
//! compared with the live ones row for row. Exits non-zero when a table
//! differs.

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use clap::Parser;
use lh_bus::{Bus, BusConfig};
use lh_domain::rating;
use lh_events::*;
use lh_projection::Projector;
use sqlx::migrate::Migrator;
use uuid::Uuid;

const GPU_MODEL: &str = "A100-40GB";
const GPU_VRAM_GB: u32 = 40;
const NODE_ID: &str = "node-0000";
const ZONE: &str = "cn-north-1a";
/// Room given to the log.
const EVENTS_MAX_BYTES: i64 = 8 * 1024 * 1024 * 1024;
/// Longest a live projection may take to catch up with the written log.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(1800);
/// How long each lease ran, so that every one is billed.
const RUN_SECS: i64 = 90;

#[derive(Parser)]
struct Args {
    /// Leases written, each requested, placed, started, ended and charged.
    #[arg(long, default_value_t = 5_000)]
    leases: usize,
    #[arg(long, default_value_t = 200)]
    tenants: usize,
    /// Publishes whose acknowledgement may be outstanding at once.
    #[arg(long, default_value_t = 2048)]
    max_in_flight: usize,
}

/// One whole lease: its life and the charges of its run.
fn lease_events(tenant_id: Uuid, gpu: u32, book: &PriceBookPublished) -> Vec<Envelope> {
    let lease_id = Uuid::now_v7();
    let now = Utc::now();
    let started_at = now - chrono::Duration::seconds(RUN_SECS);
    let scheduler = Actor::Service("scheduler".into());
    let node = Actor::Node(NODE_ID.into());
    let ended = Envelope::new(
        node.clone(),
        now,
        EventData::LeaseEnded(fixtures::ended(lease_id, NODE_ID, now, EndReason::Stopped)),
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
            scheduler,
            now,
            EventData::LeasePlaced(fixtures::placed(
                lease_id,
                NODE_ID,
                ZONE,
                GPU_MODEL,
                GPU_VRAM_GB,
                &[gpu],
            )),
        ),
        Envelope::new(
            node,
            now,
            EventData::LeaseStarted(fixtures::started(lease_id, NODE_ID, started_at)),
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

async fn write_log(bus: &Bus, args: &Args) -> anyhow::Result<u64> {
    lh_pricing::charges::ensure_price_book(bus, Utc::now()).await?;
    let book = rating::default_price_book(chrono::DateTime::UNIX_EPOCH);
    let mut out = lh_load_tests::Appender::new(bus.jetstream().clone(), args.max_in_flight, 1);
    let tenants: Vec<Uuid> = (0..args.tenants.max(1)).map(|_| Uuid::now_v7()).collect();
    for &tenant_id in &tenants {
        // The gateway keeps API key digests unique: one of 64 hex digits each.
        let api_key_sha256 = format!(
            "{}{}",
            tenant_id.simple(),
            derived_id(&["api-key", &tenant_id.to_string()]).simple()
        );
        let data = EventData::TenantCreated(TenantCreated {
            api_key_sha256,
            ..fixtures::tenant(tenant_id, 8)
        });
        out.append(&Envelope::new(Actor::Admin, Utc::now(), data))
            .await?;
    }
    for i in 0..args.leases {
        for e in lease_events(tenants[i % tenants.len()], (i % 8) as u32, &book) {
            out.append(&e).await?;
        }
    }
    out.flush().await?;
    Ok(bus.last_sequence().await?)
}

/// One projection's figures.
struct Measured {
    events: u64,
    live: Duration,
    rebuild: Duration,
    differing: Vec<&'static str>,
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
) -> anyhow::Result<Measured> {
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
    lh_projection::rebuild(bus, database_url, &into, migrator, projector, |_, _| {
        events += 1
    })
    .await?;
    let rebuild = start.elapsed();
    let tables = [tables, &[lh_projection::SKIPPED_TABLE]].concat();
    let differing = lh_projection::compare_tables(database_url, schema, &into, &tables)
        .await?
        .into_iter()
        .filter(|c| !c.identical())
        .map(|c| c.table)
        .collect();
    Ok(Measured {
        events,
        live,
        rebuild,
        differing,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let nats = lh_load_tests::NatsServer::start(false)?;
    let mut config = BusConfig::new(nats.url(), "rebuild-rate");
    config.events_max_bytes = EVENTS_MAX_BYTES;
    let bus = Bus::connect(&config).await?;
    let postgres = lh_testkit::Postgres::start().await?;
    let database_url = postgres.create_database().await?;

    let start = Instant::now();
    let head = write_log(&bus, &args).await?;
    println!(
        "rebuild-rate: wrote {head} events in {:.1}s: {} tenants, {} leases (requested, placed, started, ended, charged)",
        start.elapsed().as_secs_f64(),
        args.tenants,
        args.leases
    );

    let gateway = measure(
        &bus,
        &database_url,
        "gateway",
        &lh_gateway::projection::MIGRATOR,
        &lh_gateway::projection::GatewayProjection,
        lh_gateway::projection::TABLES,
    )
    .await?;
    let pricing = measure(
        &bus,
        &database_url,
        "pricing",
        &lh_pricing::MIGRATOR,
        &lh_pricing::projection::InvoiceProjector,
        lh_pricing::projection::TABLES,
    )
    .await?;

    println!(
        "{:<10} {:>9} {:>10} {:>12} {:>10} {:>12}  identical",
        "projection", "events", "live", "live ev/s", "rebuild", "rebuild ev/s"
    );
    let mut differing = Vec::new();
    for (name, m) in [("gateway", &gateway), ("pricing", &pricing)] {
        println!(
            "{:<10} {:>9} {:>9.2}s {:>12.0} {:>9.2}s {:>12.0}  {}",
            name,
            m.events,
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
    Ok(())
}
