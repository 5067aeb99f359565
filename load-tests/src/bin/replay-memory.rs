//! Each service's memory after replaying a long log: how much resident
//! memory a service holds once it has read a million events (the
//! node-agent should keep only its own node's leases; the scheduler and
//! pricing should forget leases that ended), against the same service on an
//! empty log.
//!
//! `cargo build --release -p lh-load-tests -p lh-scheduler -p lh-pricing -p lh-node-agent
//!  -p lh-spot-broker -p lh-gateway -p lh-audit`, then
//! `target/release/replay-memory --events 1000000`
//!
//! The log is written straight onto `LH_EVENTS` (no gateway, no scheduler):
//! the default price book, the tenants, a fleet of nodes, then lease after
//! lease, each on one GPU slot of the fleet. A lease is `requested`,
//! `placed`, its node's `gpus_allocated`, `started`; before the next lease
//! takes the same slot the previous one is `stop_requested`, `ended` and
//! `charge.accrued` (the charge pricing itself would write). So the fleet is
//! never over-committed, every ended lease is billed, and the last lease of
//! each slot stays live. Events are appended with asynchronous publishes,
//! a bounded number of acknowledgements outstanding.
//!
//! Then each service binary (next to this one) starts alone against the
//! log, the time until its `/readyz` answers 200 is its catch-up time, and
//! its VmRSS and VmHWM are read from /proc. The same is done on an empty
//! log first, as the baseline. Then each service is killed and started
//! again on the same log and database; with `--tail-events N` about N more
//! events are appended while it is down, so the second start is the one a
//! service meets after a crash: its snapshot (or its projection's offset)
//! and a tail. Exits non-zero when a service does not catch up.
//!
//! Start-up on a year of history:
//! `target/release/replay-memory --events 3000000 --tail-events 99000 --no-baseline`

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use clap::Parser;
use lh_bus::{Bus, BusConfig};
use lh_domain::rating;
use lh_events::*;
use uuid::Uuid;

/// GPUs of each node of the fleet (whole A100-40GB).
const GPUS_PER_NODE: u32 = 8;
const GPU_MODEL: &str = "A100-40GB";
const GPU_VRAM_GB: u32 = 40;
const ZONES: [&str; 3] = ["cn-north-1a", "cn-east-1b", "cn-south-1c"];
/// Events of a lease that ended: requested, placed, gpus_allocated,
/// started, stop_requested, ended, charge.accrued.
const EVENTS_PER_ENDED_LEASE: usize = 7;
/// Events of a lease still running: requested, placed, gpus_allocated, started.
const EVENTS_PER_LIVE_LEASE: usize = 4;
/// Room given to the log: a million events take about 0.5 GB.
const EVENTS_MAX_BYTES: i64 = 8 * 1024 * 1024 * 1024;
/// How often a starting service's `/readyz` is asked.
const READY_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Wait after readiness before memory is read, so that work begun at
/// catch-up (a first decision pass, a checkpoint) is counted.
const SETTLE_AFTER_READY: Duration = Duration::from_secs(2);
/// How long before its report is stored a node says a workload started:
/// every run then lasts at least that long (so every ended lease is billed)
/// and no node's time is after the log's or beyond the 30 s skew pricing
/// accepts.
const STARTED_BEFORE_STORED_SECS: i64 = 2;
const ADMIN_TOKEN: &str = "replay-memory-admin-token-0123456789";

#[derive(Parser)]
struct Args {
    /// Events written to the log (about: whole leases are written).
    #[arg(long, default_value_t = 1_000_000)]
    events: usize,
    /// Nodes of the fleet, 8 GPUs each; one lease per GPU stays live.
    #[arg(long, default_value_t = 64)]
    nodes: usize,
    #[arg(long, default_value_t = 200)]
    tenants: usize,
    /// Publishes whose acknowledgement may be outstanding at once.
    #[arg(long, default_value_t = 2048)]
    max_in_flight: usize,
    /// How long one service may take to catch up, seconds.
    #[arg(long, default_value_t = 1200)]
    catch_up_limit_secs: u64,
    /// Events appended while a service is down, between its kill and its
    /// second start: the tail it replays after its snapshot. A decider
    /// snapshots every 100,000 events, so just under that is the longest
    /// tail a start can meet.
    #[arg(long, default_value_t = 0)]
    tail_events: usize,
    /// Only these services (by name, comma-separated); all when absent.
    #[arg(long, value_delimiter = ',')]
    services: Vec<String>,
    /// Skip the baseline on an empty log.
    #[arg(long)]
    no_baseline: bool,
}

fn node_id(n: usize) -> String {
    format!("node-{n:04}")
}

/// The inventory the node-agent's simulated backend reports for the node,
/// so that a node-agent started on it finds itself registered.
fn node_registered(n: usize) -> NodeRegistered {
    let id = node_id(n);
    NodeRegistered {
        node_id: id.clone(),
        zone: ZONES[n % ZONES.len()].into(),
        hostname: format!("{id}.sim"),
        gpus: (0..GPUS_PER_NODE)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-{}", derived_id(&["sim-gpu", &id, &index.to_string()])),
                model: GPU_MODEL.into(),
                vram_gb: GPU_VRAM_GB,
                mig: false,
                unowned_mig_instances: Vec::new(),
            })
            .collect(),
        isolation: Isolation::Container,
        gpu_sharing: GpuSharing::HamiCore,
        fabric: None,
    }
}

fn fleet_toml(nodes: usize) -> String {
    (0..nodes)
        .map(|n| {
            let node = node_registered(n);
            format!(
                "[[node]]\nid = \"{}\"\nzone = \"{}\"\nhostname = \"{}\"\ngpu_model = \"{GPU_MODEL}\"\ngpu_count = {GPUS_PER_NODE}\nvram_gb = {GPU_VRAM_GB}\n\n",
                node.node_id, node.zone, node.hostname
            )
        })
        .collect()
}

/// One lease on GPU `gpu` of node `n`, its events as they are written.
struct Lease {
    lease_id: Uuid,
    tenant_id: Uuid,
    node: NodeRegistered,
    gpu: u32,
    started: Option<Envelope>,
}

impl Lease {
    fn new(tenant_id: Uuid, node: NodeRegistered, gpu: u32) -> Self {
        Self {
            lease_id: Uuid::now_v7(),
            tenant_id,
            node,
            gpu,
            started: None,
        }
    }

    fn begin(&mut self) -> Vec<Envelope> {
        let now = Utc::now();
        let tenant = Actor::Tenant(self.tenant_id);
        let scheduler = || Actor::Service("scheduler".into());
        let node_actor = Actor::Node(self.node.node_id.clone());
        let gpu = &self.node.gpus[self.gpu as usize];
        let requested = EventData::LeaseRequested(fixtures::whole_request(
            self.lease_id,
            self.tenant_id,
            1,
            GPU_MODEL,
        ));
        let mut placed = fixtures::placed(
            self.lease_id,
            &self.node.node_id,
            &self.node.zone,
            GPU_MODEL,
            GPU_VRAM_GB,
            &[self.gpu],
        );
        placed.gpus[0].uuid = gpu.uuid.clone();
        let allocated =
            NodeGpusAllocated::one(self.node.node_id.clone(), self.lease_id, vec![self.gpu]);
        let started = Envelope::new(
            node_actor,
            now,
            EventData::LeaseStarted(fixtures::started(
                self.lease_id,
                &self.node.node_id,
                now - chrono::Duration::seconds(STARTED_BEFORE_STORED_SECS),
            )),
        );
        self.started = Some(started.clone());
        vec![
            Envelope::new(tenant, now, requested),
            Envelope::new(scheduler(), now, EventData::LeasePlaced(placed)),
            Envelope::new(scheduler(), now, EventData::NodeGpusAllocated(allocated)),
            started,
        ]
    }

    /// Stop request, end, and the charge pricing would write for the run.
    fn finish(&self, book: &PriceBookPublished) -> Vec<Envelope> {
        let started = self
            .started
            .as_ref()
            .expect("a lease starts before it ends");
        let EventData::LeaseStarted(s) = &started.data else {
            unreachable!("started holds lease.started")
        };
        let now = Utc::now();
        let ended_at = now;
        let stop = Envelope::new(
            Actor::Tenant(self.tenant_id),
            now,
            EventData::LeaseStopRequested(LeaseStopRequested {
                lease_id: self.lease_id,
            }),
        );
        let ended = Envelope::new(
            Actor::Node(self.node.node_id.clone()),
            now,
            EventData::LeaseEnded(fixtures::ended(
                self.lease_id,
                &self.node.node_id,
                ended_at,
                EndReason::Stopped,
            )),
        );
        let segment = rating::Segment {
            lease_id: self.lease_id,
            index: 0,
            tenant_id: self.tenant_id,
            tier: Tier::Basic,
            gpus: 1,
            vram_gb_per_gpu: GPU_VRAM_GB,
            started_at: s.started_at,
            ended_at,
        };
        let charges = rating::charges(book, &segment).into_iter().map(|c| {
            Envelope::new(
                Actor::Service("pricing".into()),
                now,
                EventData::ChargeAccrued(c.clone()),
            )
            .caused_by(&ended)
            .with_id(c.charge_id)
        });
        let mut out = vec![stop, ended.clone()];
        out.extend(charges);
        out
    }
}

/// What was written, for the report.
struct Written {
    events: usize,
    ended_leases: usize,
    live_leases: usize,
    seconds: f64,
}

/// The log's writer, kept between the history and the tails appended
/// later: a tail goes on from the live leases the history left.
struct LogWriter {
    out: lh_load_tests::Appender,
    book: PriceBookPublished,
    tenants: Vec<Uuid>,
    nodes: Vec<NodeRegistered>,
    live: Vec<Option<Lease>>,
    /// Leases begun so far, which picks the next one's slot and tenant.
    begun: usize,
}

impl LogWriter {
    /// The price book, the tenants and the fleet.
    async fn start(bus: &Bus, args: &Args) -> anyhow::Result<Self> {
        lh_pricing::charges::ensure_price_book(bus, Utc::now()).await?;
        let book = rating::default_price_book(chrono::DateTime::UNIX_EPOCH);
        // The price book, appended on this fresh log by ensure_price_book.
        let mut out = lh_load_tests::Appender::new(bus.jetstream().clone(), args.max_in_flight, 1);
        let tenants: Vec<Uuid> = (0..args.tenants.max(1)).map(|_| Uuid::now_v7()).collect();
        let slots = args.nodes * GPUS_PER_NODE as usize;
        // Every tenant may hold its share of the whole fleet at once.
        let max_gpus = (slots / tenants.len() + 1) as u32 * 4;
        for &tenant_id in &tenants {
            out.append(&lh_load_tests::tenant_created(tenant_id, max_gpus))
                .await?;
        }
        let nodes: Vec<NodeRegistered> = (0..args.nodes).map(node_registered).collect();
        for node in &nodes {
            for envelope in lh_load_tests::enrolled(node.clone()) {
                out.append(&envelope).await?;
            }
        }
        Ok(Self {
            out,
            book,
            tenants,
            nodes,
            live: (0..slots).map(|_| None).collect(),
            begun: 0,
        })
    }

    /// Begins `leases` more leases, each ending the one before it on its
    /// slot; returns how many leases ended.
    async fn leases(&mut self, leases: usize) -> anyhow::Result<usize> {
        let slots = self.live.len();
        let mut ended = 0;
        for _ in 0..leases {
            let i = self.begun;
            let slot = i % slots;
            if let Some(previous) = self.live[slot].take() {
                for e in previous.finish(&self.book) {
                    self.out.append(&e).await?;
                }
                ended += 1;
            }
            let node = self.nodes[slot / GPUS_PER_NODE as usize].clone();
            let mut lease = Lease::new(
                self.tenants[i % self.tenants.len()],
                node,
                slot as u32 % GPUS_PER_NODE,
            );
            for e in lease.begin() {
                self.out.append(&e).await?;
            }
            self.live[slot] = Some(lease);
            self.begun += 1;
        }
        self.out.flush().await?;
        Ok(ended)
    }

    /// About `events` more events: whole leases, each ending the previous
    /// one on its slot once every slot has one.
    async fn events(&mut self, events: usize) -> anyhow::Result<usize> {
        let slots = self.live.len();
        let unfilled = slots.saturating_sub(self.begun);
        let leases = if events <= unfilled * EVENTS_PER_LIVE_LEASE {
            events / EVENTS_PER_LIVE_LEASE
        } else {
            unfilled + (events - unfilled * EVENTS_PER_LIVE_LEASE) / EVENTS_PER_ENDED_LEASE
        };
        self.leases(leases).await
    }
}

async fn write_log(bus: &Bus, args: &Args) -> anyhow::Result<(LogWriter, Written)> {
    let start = Instant::now();
    let mut writer = LogWriter::start(bus, args).await?;
    let slots = writer.live.len();
    let budget = args
        .events
        .saturating_sub(writer.out.appended + slots * EVENTS_PER_LIVE_LEASE);
    let ended_leases = budget / EVENTS_PER_ENDED_LEASE;
    writer.leases(ended_leases + slots).await?;
    let written = Written {
        events: writer.out.appended,
        ended_leases,
        live_leases: slots,
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok((writer, written))
}

/// Where the services run: one log, one PostgreSQL.
struct Site {
    nats_url: String,
    postgres: lh_testkit::Postgres,
    fleet_file: PathBuf,
    logs_dir: PathBuf,
}

/// One service binary and what it needs besides the common settings.
struct ServiceSpec {
    name: &'static str,
    binary: &'static str,
    database: bool,
    env: Vec<(&'static str, String)>,
    /// The variable that sets its HTTP address (the gateway serves its
    /// health routes on its API address).
    http_addr_var: &'static str,
}

/// `dir` holds the keys the gateway and audit keep across their starts.
fn services(first_node: &str, dir: &Path) -> anyhow::Result<Vec<ServiceSpec>> {
    let master_keys = dir.join("gateway-master.keys");
    std::fs::write(
        &master_keys,
        format!(
            "replay-memory {}{}\n",
            Uuid::new_v4().simple(),
            Uuid::new_v4().simple()
        ),
    )?;
    std::fs::set_permissions(
        &master_keys,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )?;
    let audit_key = dir.join("audit-signing.key");
    let plain = |name, binary| ServiceSpec {
        name,
        binary,
        database: false,
        env: Vec::new(),
        http_addr_var: "LH_HTTP_ADDR",
    };
    Ok(vec![
        ServiceSpec {
            // No node-agent sends heartbeats here: node loss is off, or the
            // scheduler would move the live leases away once caught up.
            env: vec![("LH_NODE_LOST_AFTER_MS", "0".into())],
            ..plain("scheduler", "lh-scheduler")
        },
        ServiceSpec {
            database: true,
            ..plain("pricing", "lh-pricing")
        },
        ServiceSpec {
            env: vec![
                ("LH_NODE_ID", first_node.into()),
                ("LH_RUNTIME", "sim".into()),
            ],
            ..plain("node-agent", "lh-node-agent")
        },
        plain("spot-broker", "lh-spot-broker"),
        ServiceSpec {
            database: true,
            env: vec![
                ("LH_ADMIN_TOKEN", ADMIN_TOKEN.into()),
                ("LH_MASTER_KEY_FILE", master_keys.display().to_string()),
            ],
            http_addr_var: "LH_GATEWAY_ADDR",
            ..plain("gateway", "lh-gateway")
        },
        ServiceSpec {
            database: true,
            env: vec![("LH_AUDIT_KEY_FILE", audit_key.display().to_string())],
            ..plain("audit", "lh-audit")
        },
    ])
}

/// One service's figures on one log.
struct Measured {
    catch_up: Option<Duration>,
    /// Its database, for a second start on the same one.
    database_url: Option<String>,
    head: u64,
    rss_kb: u64,
    hwm_kb: u64,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A started service binary, killed when dropped.
struct ServiceProcess(Child);

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn measure(
    site: &Site,
    spec: &ServiceSpec,
    bin_dir: &Path,
    bus: &Bus,
    label: &str,
    limit: Duration,
    database_url: Option<String>,
) -> anyhow::Result<Measured> {
    let port = free_port()?;
    let log = std::fs::File::create(site.logs_dir.join(format!("{}-{label}.log", spec.name)))?;
    let mut command = Command::new(bin_dir.join(spec.binary));
    command
        .env("LH_NATS_URL", &site.nats_url)
        .env("LH_EVENTS_MAX_BYTES", EVENTS_MAX_BYTES.to_string())
        .env("LH_FLEET_FILE", &site.fleet_file)
        .env(spec.http_addr_var, format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .stdout(log.try_clone()?)
        .stderr(log);
    let database_url = match (spec.database, database_url) {
        (false, _) => None,
        (true, Some(url)) => Some(url),
        (true, None) => Some(site.postgres.create_database().await?),
    };
    if let Some(url) = &database_url {
        command.env("DATABASE_URL", url);
    }
    for (key, value) in &spec.env {
        command.env(key, value);
    }
    let start = Instant::now();
    let mut child = ServiceProcess(
        command
            .spawn()
            .with_context(|| format!("starting {}", bin_dir.join(spec.binary).display()))?,
    );
    let http = reqwest::Client::new();
    let readyz = format!("http://127.0.0.1:{port}/readyz");
    let mut catch_up = None;
    while start.elapsed() < limit {
        if let Some(status) = child.0.try_wait()? {
            eprintln!("{} stopped ({status}); see its log", spec.name);
            break;
        }
        let ready = http
            .get(&readyz)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            catch_up = Some(start.elapsed());
            break;
        }
        tokio::time::sleep(READY_POLL_INTERVAL).await;
    }
    if catch_up.is_some() {
        tokio::time::sleep(SETTLE_AFTER_READY).await;
    }
    let (rss_kb, hwm_kb) = lh_load_tests::memory_kb(child.0.id()).unwrap_or((0, 0));
    Ok(Measured {
        catch_up,
        database_url,
        head: bus.last_sequence().await?,
        rss_kb,
        hwm_kb,
    })
}

async fn start_site(
    dir: &Path,
    nodes: usize,
    tag: &str,
) -> anyhow::Result<(lh_load_tests::NatsServer, Bus, Site)> {
    // The server's lazy fsync: how the log was made durable changes nothing
    // a replay reads, and a million appends fsynced one by one would take
    // most of the run.
    let nats = lh_load_tests::NatsServer::start(false)?;
    let mut config = BusConfig::new(nats.url(), "replay-memory");
    config.events_max_bytes = EVENTS_MAX_BYTES;
    let bus = Bus::connect(&config).await?;
    let fleet_file = dir.join(format!("fleet-{tag}.toml"));
    std::fs::write(&fleet_file, fleet_toml(nodes))?;
    let logs_dir = dir.join("logs");
    std::fs::create_dir_all(&logs_dir)?;
    let site = Site {
        nats_url: nats.url(),
        postgres: lh_testkit::Postgres::start().await?,
        fleet_file,
        logs_dir,
    };
    Ok((nats, bus, site))
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin_dir = std::env::current_exe()?
        .parent()
        .context("the binary's directory")?
        .to_path_buf();
    let dir = tempfile::tempdir()?;
    let limit = Duration::from_secs(args.catch_up_limit_secs);
    let specs: Vec<ServiceSpec> = services(&node_id(0), dir.path())?
        .into_iter()
        .filter(|s| args.services.is_empty() || args.services.iter().any(|n| n == s.name))
        .collect();
    anyhow::ensure!(!specs.is_empty(), "--services names none of the services");

    // Baseline: each service alone on a log with nothing in it.
    let mut empty = Vec::new();
    if !args.no_baseline {
        let (_nats, bus, site) = start_site(dir.path(), args.nodes, "empty").await?;
        for spec in &specs {
            empty.push(Some(
                measure(&site, spec, &bin_dir, &bus, "empty", limit, None).await?,
            ));
        }
    } else {
        empty.extend(specs.iter().map(|_| None));
    }

    let (_nats, bus, site) = start_site(dir.path(), args.nodes, "full").await?;
    let (mut writer, written) = write_log(&bus, &args).await?;
    println!(
        "replay-memory: wrote {} events in {:.1}s ({:.0}/s): {} tenants, {} nodes x {GPUS_PER_NODE} GPUs, {} leases ended (7 events each), {} live (4 events each)",
        written.events,
        written.seconds,
        written.events as f64 / written.seconds,
        args.tenants,
        args.nodes,
        written.ended_leases,
        written.live_leases
    );
    let seconds = |m: &Measured| {
        m.catch_up
            .map(|d| format!("{:.1}s", d.as_secs_f64()))
            .unwrap_or_else(|| "NEVER".into())
    };
    let mut full = Vec::new();
    let mut again = Vec::new();
    for spec in &specs {
        let m = measure(&site, spec, &bin_dir, &bus, "full", limit, None).await?;
        // Killed (as kill -9 would; `measure` drops it), the log grows by
        // the tail while it is down, and it starts again on the same log
        // and database: from its snapshot, or its projection's offset.
        let tail_from = bus.last_sequence().await?;
        let tail_started = Instant::now();
        writer.events(args.tail_events).await?;
        let tail = bus.last_sequence().await?.saturating_sub(tail_from);
        if tail > 0 {
            println!(
                "  {:<12} tail of {tail} events appended while down, in {:.1}s",
                spec.name,
                tail_started.elapsed().as_secs_f64()
            );
        }
        let r = measure(
            &site,
            spec,
            &bin_dir,
            &bus,
            "again",
            limit,
            m.database_url.clone(),
        )
        .await?;
        // Each service is stopped before the next starts; print as we go.
        println!(
            "  {:<12} ready after {}, started again: after {}",
            spec.name,
            seconds(&m),
            seconds(&r)
        );
        full.push(m);
        again.push(r);
    }

    println!(
        "{:<12} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "service", "events", "catch-up", "again", "RSS empty", "HWM empty", "RSS full", "HWM full"
    );
    let mut behind = Vec::new();
    for (((spec, e), f), a) in specs.iter().zip(&empty).zip(&full).zip(&again) {
        if f.catch_up.is_none()
            || e.as_ref().is_some_and(|e| e.catch_up.is_none())
            || a.catch_up.is_none()
        {
            behind.push(spec.name);
        }
        let (e_rss, e_hwm) = e.as_ref().map_or((0, 0), |e| (e.rss_kb, e.hwm_kb));
        println!(
            "{:<12} {:>9} {:>9.1}s {:>9.1}s {:>8.1}MB {:>8.1}MB {:>8.1}MB {:>8.1}MB",
            spec.name,
            f.head,
            f.catch_up.map(|d| d.as_secs_f64()).unwrap_or(f64::NAN),
            a.catch_up.map(|d| d.as_secs_f64()).unwrap_or(f64::NAN),
            mb(e_rss),
            mb(e_hwm),
            mb(f.rss_kb),
            mb(f.hwm_kb)
        );
    }
    anyhow::ensure!(
        behind.is_empty(),
        "did not catch up within {}s: {behind:?} (logs in {})",
        args.catch_up_limit_secs,
        dir.keep().display()
    );
    Ok(())
}
