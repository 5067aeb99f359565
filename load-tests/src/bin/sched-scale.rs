//! The scheduler at fleet scale, as its own process: resident memory, the
//! time of one decision pass, and placements per second through JetStream
//! (`sync_interval: always`), on a fleet of 10,000 nodes × 8 GPUs.
//!
//! `cargo build --release -p lh-load-tests --bin sched-scale -p lh-scheduler --bin lh-scheduler`,
//! then `target/release/sched-scale --nodes 10000 --queued 1000 --leases 20000`
//!
//! The fleet and one tenant are appended straight onto the log (no
//! gateway, no node-agents: node loss is off). Then two rounds:
//! 1. `--queued` one-GPU requests wait on the log; the scheduler binary
//!    (next to this one) starts, replays the log and places them. Its first
//!    pass decides the whole backlog at once.
//! 2. The scheduler is stopped, `--leases` more requests are appended, and
//!    a fresh scheduler process replays the log and places them. Placements
//!    per second run from the first `lease.placed` of the round to its last,
//!    by the log's own clock.
//!
//! Each round reports the process's VmRSS and VmHWM (from /proc once every
//! lease of the round is placed) and its decision passes (from the debug
//! line the scheduler logs per pass: `lh_scheduler::pass`). The log is read
//! back from the start at the end of each round: any GPU given to two
//! leases, or any lease placed twice, fails the run.
//!
//! A round's first deciding pass is its scheduler's first: it builds the
//! placement engine. Then (unless `--warm 0`) the first round's scheduler,
//! still running, gets `--warm` more requests to decide in one pass with
//! the engine its earlier passes kept: the tenant is suspended, the
//! requests appended (each is told it waits), the tenant resumed.

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Parser;
use lh_bus::{Bus, BusConfig};
use lh_events::*;
use lh_load_tests::{as_its_writer, Appender, NatsServer};
use uuid::Uuid;

/// GPUs of each node (whole A100-40GB).
const GPUS_PER_NODE: u32 = 8;
/// How long a quiet feed is waited on before a round is given up.
const FEED_QUIET_LIMIT: Duration = Duration::from_secs(60);
/// Wait after the last placement of a round before memory is read, so that
/// what the scheduler does once caught up (the next pass, a snapshot) is
/// counted.
const SETTLE_AFTER_PLACED: Duration = Duration::from_secs(2);
/// How long the scheduler may take to stop when asked.
const STOP_LIMIT: Duration = Duration::from_secs(10);

#[derive(Parser)]
struct Args {
    /// Nodes of 8 × A100-40GB.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// One-GPU requests waiting when the first scheduler starts.
    #[arg(long, default_value_t = 1_000)]
    queued: usize,
    /// One-GPU requests waiting when the second scheduler starts (the
    /// placements-per-second round).
    #[arg(long, default_value_t = 20_000)]
    leases: usize,
    /// Publishes whose acknowledgement may be outstanding at once.
    #[arg(long, default_value_t = 2048)]
    max_in_flight: usize,
    /// How long one round may take, seconds.
    #[arg(long, default_value_t = 600)]
    round_limit_secs: u64,
    /// One-GPU requests the first round's scheduler decides in one more
    /// pass, with the engine it kept (0: none).
    #[arg(long, default_value_t = 1_000)]
    warm: usize,
}

/// The scheduler binary, stopped when dropped.
struct Scheduler {
    child: Child,
    log: PathBuf,
}

impl Scheduler {
    fn start(bin_dir: &Path, nats_url: &str, log: PathBuf) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let out = std::fs::File::create(&log)?;
        let binary = bin_dir.join("lh-scheduler");
        let child = Command::new(&binary)
            .env("LH_NATS_URL", nats_url)
            .env("LH_HTTP_ADDR", format!("127.0.0.1:{port}"))
            // No node-agent sends heartbeats here.
            .env("LH_NODE_LOST_AFTER_MS", "0")
            .env("LH_LOG_FORMAT", "json")
            .env("RUST_LOG", "warn,lh_scheduler::pass=debug")
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Scheduler { child, log })
    }

    fn memory_kb(&self) -> anyhow::Result<(u64, u64)> {
        lh_load_tests::memory_kb(self.child.id())
    }

    /// Stops it with SIGTERM (a clean shutdown), then SIGKILL.
    fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let until = Instant::now() + STOP_LIMIT;
        while Instant::now() < until {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Every decision pass it logged: (microseconds, leases waiting,
    /// decisions).
    fn passes(&self) -> anyhow::Result<Vec<(u64, u64, u64)>> {
        let file = std::fs::File::open(&self.log)?;
        let mut out = Vec::new();
        for line in std::io::BufReader::new(file).lines() {
            let line = line?;
            if !line.contains("decision pass") {
                continue;
            }
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let fields = v.get("fields").unwrap_or(&v);
            let field = |name: &str| fields.get(name).and_then(serde_json::Value::as_u64);
            if let (Some(us), Some(waiting), Some(decisions)) =
                (field("pass_us"), field("waiting"), field("decisions"))
            {
                out.push((us, waiting, decisions));
            }
        }
        Ok(out)
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `q`-quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// What the log says of the placements so far.
#[derive(Default)]
struct Placements {
    /// Time the log stored each placement of the round's leases.
    stored_at: Vec<DateTime<Utc>>,
    /// Every lease placed, from the start of the log.
    placed: usize,
}

impl Placements {
    /// Seconds from the first placement of the round's leases to the last,
    /// by the log's clock.
    fn span_s(&self) -> f64 {
        let first = self.stored_at.iter().min();
        let last = self.stored_at.iter().max();
        match (first, last) {
            (Some(f), Some(l)) => (*l - *f).num_microseconds().unwrap_or(0) as f64 / 1e6,
            _ => 0.0,
        }
    }

    fn per_second(&self) -> f64 {
        match self.span_s() {
            s if s > 0.0 => self.stored_at.len() as f64 / s,
            _ => 0.0,
        }
    }
}

/// Reads the log from its start until `want` of `round`'s leases are
/// placed (or the feed stays quiet too long); fails on a GPU given to two
/// leases or a lease placed twice.
async fn read_placements(
    bus: &Bus,
    round: &HashSet<Uuid>,
    want: usize,
    limit: Duration,
) -> anyhow::Result<Placements> {
    let mut feed = bus.feed(&[subject::EVENTS_ALL], 1).await?;
    let mut held: HashMap<(String, u32), Uuid> = HashMap::new();
    let mut seen: HashSet<Uuid> = HashSet::new();
    let mut out = Placements::default();
    let until = Instant::now() + limit;
    while out.stored_at.len() < want && Instant::now() < until {
        let Some(event) = feed.next_within(FEED_QUIET_LIMIT).await else {
            break;
        };
        let event = event?;
        if let EventData::LeasePlaced(p) = &event.envelope.data {
            anyhow::ensure!(seen.insert(p.lease_id), "lease {} placed twice", p.lease_id);
            for g in &p.gpus {
                if let Some(other) = held.insert((p.node_id.clone(), g.index), p.lease_id) {
                    anyhow::bail!(
                        "GPU {}/{} given to {} while {other} holds it",
                        p.node_id,
                        g.index,
                        p.lease_id
                    );
                }
            }
            out.placed += 1;
            if round.contains(&p.lease_id) {
                out.stored_at.push(event.stored_at);
            }
        }
    }
    Ok(out)
}

/// Reads the log from its start until each of `ids` was told it waits.
async fn read_queued(bus: &Bus, ids: &HashSet<Uuid>, limit: Duration) -> anyhow::Result<()> {
    let mut feed = bus.feed(&[subject::EVENTS_ALL], 1).await?;
    let mut told: HashSet<Uuid> = HashSet::new();
    let until = Instant::now() + limit;
    while told.len() < ids.len() && Instant::now() < until {
        let Some(event) = feed.next_within(FEED_QUIET_LIMIT).await else {
            break;
        };
        if let EventData::LeaseQueued(q) = &event?.envelope.data {
            if ids.contains(&q.lease_id) {
                told.insert(q.lease_id);
            }
        }
    }
    anyhow::ensure!(
        told.len() == ids.len(),
        "only {} of {} requests were told they wait",
        told.len(),
        ids.len()
    );
    Ok(())
}

/// Appends `count` one-GPU requests of `tenant`; their ids.
async fn append_requests(
    out: &mut Appender,
    tenant: Uuid,
    count: usize,
) -> anyhow::Result<HashSet<Uuid>> {
    let mut ids = HashSet::with_capacity(count);
    for _ in 0..count {
        let lease_id = Uuid::now_v7();
        ids.insert(lease_id);
        out.append(&as_its_writer(EventData::LeaseRequested(
            fixtures::whole_request(lease_id, tenant, 1, fixtures::MODEL),
        )))
        .await?;
    }
    out.flush().await?;
    Ok(ids)
}

/// `count` more requests of `tenant` that `scheduler` decides in one pass:
/// appended while the tenant is suspended, then the tenant resumed. Prints
/// that pass and the placements per second.
async fn warm_pass(
    name: &str,
    bus: &Bus,
    out: &mut Appender,
    scheduler: &Scheduler,
    (tenant, count): (Uuid, usize),
    limit: Duration,
) -> anyhow::Result<()> {
    out.append(&as_its_writer(EventData::TenantSuspended(
        TenantSuspended {
            tenant_id: tenant,
            reason_sealed: String::new(),
            stop_leases: false,
        },
    )))
    .await?;
    out.flush().await?;
    let ids = append_requests(out, tenant, count).await?;
    read_queued(bus, &ids, limit).await?;
    let before = scheduler.passes()?.len();
    out.append(&as_its_writer(EventData::TenantResumed(TenantResumed {
        tenant_id: tenant,
    })))
    .await?;
    out.flush().await?;
    let placements = read_placements(bus, &ids, ids.len(), limit).await?;
    anyhow::ensure!(
        placements.stored_at.len() == ids.len(),
        "{name} warm: only {} of {} leases placed",
        placements.stored_at.len(),
        ids.len()
    );
    let passes = scheduler.passes()?;
    let pass = passes[before.min(passes.len())..]
        .iter()
        .find(|p| p.2 > 0)
        .copied()
        .unwrap_or_default();
    println!(
        "sched-scale {name} warm: leases={} placed={} placed_per_s={:.0}; deciding pass with the kept engine: waiting={} decisions={} took_ms={:.1}",
        ids.len(),
        placements.stored_at.len(),
        placements.per_second(),
        pass.1,
        pass.2,
        ms(pass.0),
    );
    Ok(())
}

/// One round: a fresh scheduler over a log where `round` waits; then, with
/// `warm`, more requests for it to decide with the engine it kept.
#[allow(clippy::too_many_arguments)]
async fn round(
    name: &str,
    bus: &Bus,
    nats_url: &str,
    bin_dir: &Path,
    logs: &Path,
    ids: &HashSet<Uuid>,
    limit: Duration,
    warm: Option<(&mut Appender, Uuid, usize)>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let scheduler = Scheduler::start(
        bin_dir,
        nats_url,
        logs.join(format!("scheduler-{name}.log")),
    )?;
    let placements = read_placements(bus, ids, ids.len(), limit).await?;
    let all_placed_in = started.elapsed();
    tokio::time::sleep(SETTLE_AFTER_PLACED).await;
    let (rss_kb, hwm_kb) = scheduler.memory_kb()?;
    let passes = scheduler.passes()?;
    if let Some((out, tenant, count)) = warm.filter(|w| w.2 > 0) {
        warm_pass(name, bus, out, &scheduler, (tenant, count), limit).await?;
    }
    scheduler.stop()?;
    let placed = placements.stored_at.len();
    let span_s = placements.span_s();
    let rate = placements.per_second();
    let deciding: Vec<&(u64, u64, u64)> = passes.iter().filter(|p| p.2 > 0).collect();
    let mut times: Vec<u64> = deciding.iter().map(|p| p.0).collect();
    times.sort_unstable();
    let mut idle: Vec<u64> = passes.iter().filter(|p| p.2 == 0).map(|p| p.0).collect();
    idle.sort_unstable();
    let first_pass = deciding.first();
    println!(
        "sched-scale {name}: leases={} placed={placed} all_placed_in={:.2}s placed_first_to_last={span_s:.3}s placed_per_s={rate:.0} \
         rss_mib={:.1} hwm_mib={:.1} double_allocations=0",
        ids.len(),
        all_placed_in.as_secs_f64(),
        rss_kb as f64 / 1024.0,
        hwm_kb as f64 / 1024.0,
    );
    println!(
        "sched-scale {name}: first deciding pass: waiting={} decisions={} took_ms={:.1}; deciding passes={} p50_ms={:.1} p99_ms={:.1} max_ms={:.1}; idle passes={} p50_ms={:.1} max_ms={:.1}",
        first_pass.map_or(0, |p| p.1),
        first_pass.map_or(0, |p| p.2),
        ms(first_pass.map_or(0, |p| p.0)),
        times.len(),
        ms(quantile(&times, 0.5)),
        ms(quantile(&times, 0.99)),
        ms(times.last().copied().unwrap_or(0)),
        idle.len(),
        ms(quantile(&idle, 0.5)),
        ms(idle.last().copied().unwrap_or(0)),
    );
    anyhow::ensure!(
        placed == ids.len(),
        "{name}: only {placed} of {} leases placed",
        ids.len()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        (args.queued + args.warm + args.leases) as u64
            <= args.nodes as u64 * u64::from(GPUS_PER_NODE),
        "the fleet must hold every lease"
    );
    let bin_dir = std::env::current_exe()?
        .parent()
        .context("the harness's directory")?
        .to_path_buf();
    // Kept after the run: the scheduler's own log says what a round did.
    let logs = tempfile::Builder::new()
        .prefix("sched-scale-")
        .tempdir()?
        .keep();
    println!(
        "sched-scale: the scheduler's logs are in {}",
        logs.display()
    );
    let nats = NatsServer::start(true)?;
    let bus = Bus::connect(&BusConfig::new(nats.url(), "sched-scale")).await?;
    let mut out = Appender::new(bus.jetstream().clone(), args.max_in_flight, 0);

    let fleet_start = Instant::now();
    for n in 0..args.nodes {
        let node_id = format!("node-{n:05}");
        for envelope in lh_load_tests::enrolled(fixtures::node(
            &node_id,
            &format!("z{}", n % 3),
            GPUS_PER_NODE,
            fixtures::MODEL,
            fixtures::MODEL_VRAM_GB,
        )) {
            out.append(&envelope).await?;
        }
    }
    let tenant = Uuid::now_v7();
    let max_gpus = u32::try_from(args.queued + args.warm + args.leases)?;
    out.append(&as_its_writer(EventData::TenantCreated(fixtures::tenant(
        tenant, max_gpus,
    ))))
    .await?;
    out.flush().await?;
    println!(
        "sched-scale: nodes={} gpus={} registered_in={:.2}s",
        args.nodes,
        args.nodes as u64 * u64::from(GPUS_PER_NODE),
        fleet_start.elapsed().as_secs_f64()
    );

    let limit = Duration::from_secs(args.round_limit_secs);
    let queued = append_requests(&mut out, tenant, args.queued).await?;
    round(
        "queued",
        &bus,
        &nats.url(),
        &bin_dir,
        &logs,
        &queued,
        limit,
        Some((&mut out, tenant, args.warm)),
    )
    .await?;
    if args.leases > 0 {
        let backlog = append_requests(&mut out, tenant, args.leases).await?;
        round(
            "backlog",
            &bus,
            &nats.url(),
            &bin_dir,
            &logs,
            &backlog,
            limit,
            None,
        )
        .await?;
    }
    Ok(())
}
