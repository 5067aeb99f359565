//! The chaos harness's long run, against the platform `make up` started:
//! tenants lease (whole GPUs, shares, MIG instances, spot; stops; retries
//! with Idempotency-Keys) while every service, nats-server and PostgreSQL
//! are killed with SIGKILL in turn and started again by `scripts/up.sh`.
//! Afterwards it checks from the log and the API that no accepted lease was
//! lost or doubled, no GPU was ever over its capacity, every run was
//! charged once, the invoices equal a rebuild, audit verifies and every
//! service is ready, and prints one line:
//!
//! `chaos: kills=K accepted=A lost=0 duplicated=0 overcommitted=0 charge_mismatch=0 dead=0`
//!
//! exiting non-zero when any count but the first two is not zero. Run it
//! through `load-tests/chaos.sh [SECONDS]`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use lh_bus::{Bus, BusConfig};
use lh_service::CancellationToken;
use lh_test_stack::chaos::{self, Report};
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// How long traffic and kills go on, in seconds.
    #[arg(long, default_value_t = 300)]
    duration_secs: u64,
    /// Tenants leasing at once.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    #[arg(long, env = "LH_GATEWAY_URL", default_value = "http://127.0.0.1:8080")]
    gateway: String,
    #[arg(long, env = "LH_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats: String,
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/leasehold"
    )]
    database_url: String,
    /// The repository `make up` ran in (its .data/ holds the pid files).
    #[arg(long, default_value = ".")]
    root: PathBuf,
    /// Only check the log as it is (no traffic, no kills).
    #[arg(long)]
    check_only: bool,
}

/// Everything `make up` runs, with how long each stays down. A node-agent
/// stays down past the scheduler's loss window, so its leases move.
const VICTIMS: &[(&str, u64)] = &[
    ("scheduler", 2),
    ("pricing", 2),
    ("node-agent-a", 5),
    ("spot-broker", 2),
    ("gateway", 2),
    ("audit", 2),
    ("nats", 3),
    ("node-agent-d", 5),
    ("postgres", 3),
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let root = args.root.canonicalize()?;
    let admin = std::fs::read_to_string(root.join(".data/admin-token"))?
        .trim()
        .to_string();
    let http = reqwest::Client::new();
    let mut report = Report::default();

    let stop = CancellationToken::new();
    let mut clients = Vec::new();
    let clients_wanted = if args.check_only { 0 } else { args.clients };
    for c in 0..clients_wanted {
        let key = create_tenant(&http, &args.gateway, &admin, c).await?;
        clients.push(tokio::spawn(chaos::client(
            http.clone(),
            args.gateway.clone(),
            key,
            format!("chaos-{}-{c}", std::process::id()),
            stop.clone(),
        )));
    }
    let started = Instant::now();
    let mut victims = VICTIMS.iter().cycle();
    while !args.check_only && started.elapsed() < Duration::from_secs(args.duration_secs) {
        let (victim, down_secs) = victims.next().expect("a cycle never ends");
        tokio::time::sleep(Duration::from_secs(3)).await;
        if kill(&root, victim)? {
            report.kills += 1;
            eprintln!(
                "chaos: killed {victim} at {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_secs(*down_secs)).await;
        bring_back(&root)?;
    }
    stop.cancel();
    let mut accepted = Vec::new();
    for client in clients {
        accepted.extend(client.await?);
    }
    eprintln!(
        "chaos: traffic stopped; {} leases accepted; waiting for them to end and be billed",
        accepted.len()
    );

    let mut config = BusConfig::new(args.nats.clone(), "lh-chaos");
    let env = |name: &str| std::env::var(name).ok();
    config.credentials = lh_bus::Credentials::from_env(std::env::args(), env)?;
    config.tls = lh_bus::TlsFiles::from_env(env)?;
    let bus = Bus::connect(&config).await?;
    let (log, stuck) = chaos::settle(
        &bus,
        &http,
        &args.gateway,
        &admin,
        &accepted,
        Duration::from_secs(180),
    )
    .await;
    report.add_checks(&chaos::check_log(&log, &accepted));
    report.charge_mismatch += rebuild_differences(&args).await?;
    report.dead = dead(&http, &args.gateway, &admin, &bus).await + stuck.len();
    eprintln!("chaos: events {:?}", chaos::event_counts(&log));
    for (lease, events) in chaos::charge_mismatches(&log).iter().take(5) {
        eprintln!("chaos: lease {lease} is not charged once per hour of its runs:");
        for e in events {
            eprintln!("chaos:   {e}");
        }
    }
    println!("{report}");
    if !report.is_clean() {
        std::process::exit(1);
    }
    Ok(())
}

async fn create_tenant(
    http: &reqwest::Client,
    gateway: &str,
    admin: &str,
    n: usize,
) -> anyhow::Result<String> {
    let body = json!({
        "name": format!("chaos-{}-{n}", std::process::id()),
        "email": "ops@chaos.example",
        "quota": {"max_gpus": 64},
    });
    let tenant: Value = http
        .post(format!("{gateway}/v1/tenants"))
        .bearer_auth(admin)
        .json(&body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    tenant["api_key"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no api_key in {tenant}"))
}

/// SIGKILL of `victim`'s process; false when it was not running.
fn kill(root: &Path, victim: &str) -> anyhow::Result<bool> {
    let pid_file = match victim {
        "postgres" => root.join(".data/pg/data/postmaster.pid"),
        other => root.join(format!(".data/pids/{other}.pid")),
    };
    let Ok(text) = std::fs::read_to_string(&pid_file) else {
        return Ok(false);
    };
    let Some(pid) = text.lines().next().map(str::trim) else {
        return Ok(false);
    };
    Ok(Command::new("kill").args(["-9", pid]).status()?.success())
}

/// `scripts/up.sh` starts whatever is not running; a PostgreSQL killed a
/// moment ago may need a few tries while its old processes leave.
fn bring_back(root: &Path) -> anyhow::Result<()> {
    for attempt in 1..=10 {
        let status = Command::new(root.join("scripts/up.sh"))
            .env("LH_UP_NO_BUILD", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?;
        if status.success() {
            return Ok(());
        }
        eprintln!("chaos: scripts/up.sh failed (attempt {attempt}); retrying");
        std::thread::sleep(Duration::from_secs(2));
    }
    anyhow::bail!("scripts/up.sh could not bring the platform back")
}

/// Tables of the gateway's and pricing's projections that differ from a
/// replay of the log.
async fn rebuild_differences(args: &Args) -> anyhow::Result<usize> {
    // Let both projections reach the head first.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let common = lh_service::CommonArgs::for_test(&args.nats);
    let gateway = lh_gateway::Config {
        common: common.clone(),
        gateway_addr: "127.0.0.1:0".into(),
        database_url: args.database_url.clone().into(),
        schema: lh_gateway::DEFAULT_SCHEMA.into(),
        admin_token: Some("unused-for-a-rebuild-0123456789abcdef".into()),
        admin_token_file: None,
        auditor_token: None,
        auditor_token_file: None,
        admin_keys_file: None,
        oidc: Default::default(),
        console_sign_in: Default::default(),
        lease_web: Default::default(),
        // A rebuild replays the log; it opens no tenant key.
        master_key_file: "unused-for-a-rebuild".into(),
        limits: Default::default(),
        front: Default::default(),
        usage: Default::default(),
        sessions: Default::default(),
        templates_file: None,
        ssh: Default::default(),
        storage: Default::default(),
    };
    run_as(&args.root, "gateway");
    let g = lh_gateway::rebuild(&gateway, "gateway_chaos", false, |_, _| {}).await?;
    let pricing = lh_pricing::Config::for_test(&args.nats, &args.database_url);
    run_as(&args.root, "pricing");
    let p = lh_pricing::rebuild(&pricing, "pricing_chaos", false, |_, _| {}).await?;
    let differing: Vec<_> = g
        .tables
        .iter()
        .chain(&p.tables)
        .filter(|c| c.live != c.rebuilt)
        .collect();
    for c in &differing {
        eprintln!(
            "chaos: table {} differs from a rebuild: {:?} vs {:?}",
            c.table, c.live, c.rebuilt
        );
    }
    Ok(differing.len())
}

/// A rebuild reads what its service reads, and `make up`'s NATS lets each
/// user read only that: the gateway's rebuild reads usage from the
/// telemetry stream, which the auditor may not, and the server answers a
/// refused lookup with silence, a timeout. So each rebuild connects as its
/// own service when `make up`'s keys are there. The clients are done by
/// now: nothing else reads the environment while it changes.
fn run_as(root: &Path, user: &str) {
    let seed = root.join(format!(".data/nats/auth/keys/{user}.nk"));
    if seed.exists() {
        std::env::set_var("LH_NATS_USER", user);
        std::env::set_var("LH_NATS_NKEY_SEED_FILE", seed);
    }
}

/// Services not ready (by their `/readyz`), plus one for an audit
/// verification that is not ok.
async fn dead(http: &reqwest::Client, gateway: &str, admin: &str, bus: &Bus) -> usize {
    let ports = [9101, 9103, 9104, 9105, 9110, 9111, 9112, 9113];
    let mut dead = 0;
    let mut urls: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}/readyz"))
        .collect();
    urls.push(format!("{gateway}/readyz"));
    for url in urls {
        let mut ready = false;
        for _ in 0..60 {
            if let Ok(r) = http.get(&url).send().await {
                if r.status().is_success() {
                    ready = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if !ready {
            eprintln!("chaos: {url} is not ready");
            dead += 1;
        }
    }
    let head = bus.last_sequence().await.unwrap_or(0);
    let mut verified = false;
    for _ in 0..120 {
        let answer = http
            .get(format!("{gateway}/v1/audit/verify"))
            .bearer_auth(admin)
            .send()
            .await;
        if let Ok(r) = answer {
            let body: Value = r.json().await.unwrap_or(Value::Null);
            if body["events"].as_u64().unwrap_or(0) >= head {
                verified = body["ok"] == true;
                if !verified {
                    eprintln!("chaos: audit verify: {body}");
                }
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    dead + usize::from(!verified)
}
