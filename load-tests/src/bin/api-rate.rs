//! The gateway's read path under load, side by side with its own
//! `/healthz` in one run: wrk against `/healthz`, `GET /v1/leases/{id}` and
//! `GET /v1/leases`, printing requests/s, p99 and each read's ratio to
//! `/healthz`. With `--post`, the write path instead: `POST /v1/leases`
//! against the rate JetStream itself allows the same number of writers,
//! measured on the same nats-server in the same run (see [`post_mode`]).
//!
//! `load-tests/api-rate.sh [SECONDS]`  (builds this in release and runs it)
//!
//! The platform runs in this process (the test kit's `Stack`: its own
//! nats-server with `sync_interval: always` and its own PostgreSQL database
//! in temporary directories), so a run never touches `.data/` nor the ports
//! of `make up`; wrk runs as its own process against the gateway's real
//! listener. Needs `wrk` (Debian package `wrk`).

use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use clap::Parser;
use lh_test_stack::{Stack, FLEET};
use reqwest::Method;
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Seconds wrk runs against each route.
    #[arg(long, default_value_t = 10)]
    duration_secs: u64,
    /// Connections wrk keeps open.
    #[arg(long, default_value_t = 32)]
    connections: u32,
    /// wrk threads.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Leases the tenant holds (the list reads a page of them).
    #[arg(long, default_value_t = 20)]
    leases: usize,
    /// Records a system-wide `perf` profile of each route's run into this
    /// folder (`<n>.perf.data`; `perf report -i ... --sort comm,dso,sym`).
    #[arg(long)]
    perf_dir: Option<std::path::PathBuf>,
    /// Measures `POST /v1/leases` instead of the reads (see [`post_mode`]).
    #[arg(long)]
    post: bool,
    /// With `--post`: events each measurement of JetStream's own append
    /// rate appends.
    #[arg(long, default_value_t = 20_000)]
    append_events: usize,
}

/// What wrk measured of one route.
struct Rate {
    route: String,
    requests_per_s: f64,
    p99_ms: f64,
    failed: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if std::env::var("RUST_LOG").is_ok() {
        lh_telemetry::init("api-rate", lh_telemetry::LogFormat::Pretty);
    }
    Command::new("wrk")
        .arg("--version")
        .output()
        .context("wrk is not installed (apt-get install -y wrk)")?;
    if args.post {
        return post_mode(&args).await;
    }
    let stack = Stack::start_configured(FLEET, |stack| {
        stack.gateway_limits.writes_per_s = 1_000_000.0;
        stack.gateway_limits.write_burst = 1_000_000;
        stack.gateway_limits.max_pending_leases = 1_000_000;
    })
    .await;
    let (_, key) = stack
        .create_tenant("api-rate", lh_gateway::http::tenants::MAX_QUOTA_GPUS)
        .await;
    let mut lease_id = String::new();
    for _ in 0..args.leases {
        let (status, lease) = stack
            .call(
                Method::POST,
                "/v1/leases",
                &key,
                Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "tier": "basic"})),
            )
            .await;
        ensure!(status == 202, "lease refused: {status} {lease}");
        lease_id = lease["id"].as_str().context("lease id")?.to_string();
    }
    // The leases placed and started: the background work is what a quiet
    // platform does, not a backlog.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let auth = format!("Authorization: Bearer {key}");
    let routes = [
        ("/healthz".to_string(), None),
        (format!("/v1/leases/{lease_id}"), Some(auth.as_str())),
        ("/v1/leases".to_string(), Some(auth.as_str())),
    ];
    let mut rates = Vec::new();
    for (n, (path, header)) in routes.iter().enumerate() {
        let url = format!("{}{}", stack.gateway_url, path);
        let perf = match &args.perf_dir {
            Some(dir) => Some(
                Command::new("perf")
                    .args(["record", "-a", "-q", "-F", "499", "-o"])
                    .arg(dir.join(format!("{n}.perf.data")))
                    .args(["--", "sleep", &args.duration_secs.to_string()])
                    .spawn()
                    .context("running perf")?,
            ),
            None => None,
        };
        let rate = tokio::task::block_in_place(|| wrk(&args, &url, *header, None))?;
        if let Some(mut perf) = perf {
            perf.wait()?;
        }
        rates.push(Rate {
            route: path.replace(&lease_id, "{id}"),
            ..rate
        });
    }
    let healthz = rates[0].requests_per_s;
    println!(
        "api-rate: wrk -t{} -c{} -d{}s, one run",
        args.threads, args.connections, args.duration_secs
    );
    for r in &rates {
        println!(
            "{:<18} {:>10.0} req/s  p99 {:>7.2} ms  failed {:>6}  ratio to /healthz {:.3}",
            r.route,
            r.requests_per_s,
            r.p99_ms,
            r.failed,
            r.requests_per_s / healthz
        );
    }
    if rates.iter().any(|r| r.failed > 0) {
        bail!("some requests failed: the figures above are not reads");
    }
    Ok(())
}

/// What wrk runs for `--post`: one-GPU lease requests, each with an
/// Idempotency-Key of its own, keeping the id of every lease answered 202
/// and writing them, one a line, to `ids_path` when it is done.
const POST_SCRIPT: &str = r#"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"gpus": 1, "gpu_model": "A100-40GB", "tier": "basic"}'
local threads = {}
function setup(thread)
  table.insert(threads, thread)
  thread:set("thread_no", #threads)
end
local sent = 0
accepted = {}
function request()
  sent = sent + 1
  local headers = {}
  for name, value in pairs(wrk.headers) do headers[name] = value end
  headers["Idempotency-Key"] = "api-rate-" .. thread_no .. "-" .. sent
  return wrk.format(nil, nil, headers, nil)
end
function response(status, headers, body)
  if status == 202 then
    accepted[#accepted + 1] = string.match(body, '"id":"([^"]+)"')
  end
end
function done(summary, latency, requests)
  local out = assert(io.open(IDS_PATH, "w"))
  for _, thread in ipairs(threads) do
    for _, id in ipairs(thread:get("accepted")) do out:write(id, "\n") end
  end
  out:close()
end
"#;

/// `POST /v1/leases` against its ceiling, in one run on one nats-server
/// (`sync_interval: always`):
///
/// 1. the ceiling: `--connections` writers append lease requests of
///    another tenant straight onto the log, each guarded by an expected
///    subject sequence as the gateway guards its own and each waiting for
///    its acknowledgement (the gateway's projection follows them as it
///    follows the posts);
/// 2. wrk posts one-GPU leases with unique Idempotency-Keys through as
///    many connections;
/// 3. the ceiling again, so that drift between the two shows;
/// 4. every lease answered 202 must be on the log and answer a GET.
///
/// Only the gateway runs: no scheduler places or queues the leases, so a
/// lease costs its request and nothing after (placements have their own
/// harness, `lease-rate`). The tenant's write budget and pending-lease
/// limit are lifted so that every request is a write.
async fn post_mode(args: &Args) -> anyhow::Result<()> {
    let mut stack = Stack::bare(FLEET).await;
    stack.gateway_limits.writes_per_s = 1_000_000.0;
    stack.gateway_limits.write_burst = 1_000_000;
    stack.gateway_limits.max_pending_leases = 1_000_000;
    stack.start_service("gateway").await;
    stack.wait_ready().await;
    let (tenant_id, key) = stack
        .create_tenant("api-rate", lh_gateway::http::tenants::MAX_QUOTA_GPUS)
        .await;
    let bus = stack.bus().await;
    let writers = args.connections as usize;
    // Warms the stream's files and the connection.
    lh_load_tests::guarded_append_rate(&bus, 500, writers, elsewhere_requested).await?;
    let ceiling_before =
        lh_load_tests::guarded_append_rate(&bus, args.append_events, writers, elsewhere_requested)
            .await?;

    let scripts = tempfile::tempdir()?;
    let ids_path = scripts.path().join("accepted.txt");
    let script = scripts.path().join("post-lease.lua");
    std::fs::write(
        &script,
        format!(
            "IDS_PATH = {:?}\n{POST_SCRIPT}",
            ids_path.display().to_string()
        ),
    )?;
    let auth = format!("Authorization: Bearer {key}");
    let url = format!("{}/v1/leases", stack.gateway_url);
    let rate = tokio::task::block_in_place(|| wrk(args, &url, Some(&auth), Some(&script)))?;

    let ceiling_after =
        lh_load_tests::guarded_append_rate(&bus, args.append_events, writers, elsewhere_requested)
            .await?;
    let accepted: Vec<String> = std::fs::read_to_string(&ids_path)
        .context("wrk wrote no ids")?
        .lines()
        .map(str::to_string)
        .collect();
    let (on_log, missing_from_log, unreadable) =
        check_durable_and_visible(&stack, &bus, tenant_id.parse()?, &key, &accepted).await?;
    let ceiling = (ceiling_before + ceiling_after) / 2.0;
    println!(
        "api-rate --post: wrk -t{} -c{} -d{}s, one run, gateway alone (no scheduler)",
        args.threads, args.connections, args.duration_secs
    );
    println!(
        "JetStream guarded appends, {writers} writers: {ceiling_before:.0}/s before, \
         {ceiling_after:.0}/s after ({} events each)",
        args.append_events
    );
    println!(
        "POST /v1/leases   {:>8.0} req/s  p99 {:>7.2} ms  failed {:>6}  ratio to the ceiling {:.3}",
        rate.requests_per_s,
        rate.p99_ms,
        rate.failed,
        rate.requests_per_s / ceiling
    );
    println!(
        "accepted (202) {}: on the log {}, missing from the log {missing_from_log}, \
         not answering a GET {unreadable}; the tenant's requests on the log {on_log}",
        accepted.len(),
        accepted.len() - missing_from_log,
    );
    ensure!(
        missing_from_log == 0 && unreadable == 0,
        "an accepted lease was lost or not visible"
    );
    ensure!(
        rate.failed == 0,
        "some requests failed: the figures above are not all writes"
    );
    Ok(())
}

/// A lease request of a tenant nobody posts for, shaped as the gateway's:
/// what the ceiling appends.
fn elsewhere_requested() -> lh_events::Envelope {
    let tenant = lh_domain::lease::Tenant {
        id: uuid::Uuid::from_u128(0xa11e),
        max_gpus: 8,
        pending_leases: 0,
        max_pending_leases: 1,
    };
    let body = lh_domain::lease::LeaseBody {
        gpus: Some(1),
        fraction: None,
        mig_profile: None,
        gpu_model: "A100-40GB".into(),
        tier: lh_events::Tier::Basic,
        priority: 0,
        workload: None,
        max_price_cny_per_gpu_hour: None,
        zones: Vec::new(),
        regions: Vec::new(),
        recovery: None,
    };
    let requested = lh_domain::lease::request(tenant, body, None, uuid::Uuid::now_v7())
        .expect("a valid request");
    let id = requested.lease_id.to_string();
    lh_events::Envelope::new(
        lh_events::Actor::Tenant(tenant.id),
        chrono::Utc::now(),
        lh_events::EventData::LeaseRequested(requested),
    )
    .with_id(lh_events::derived_id(&["lease.requested", &id]))
}

/// How many of `tenant_id`'s lease requests the log holds, how many of
/// `accepted` it lacks, and how many of them do not answer a GET 200.
async fn check_durable_and_visible(
    stack: &Stack,
    bus: &lh_bus::Bus,
    tenant_id: uuid::Uuid,
    key: &str,
    accepted: &[String],
) -> anyhow::Result<(usize, usize, usize)> {
    let on_log: std::collections::HashSet<String> = lh_test_stack::read_log(bus)
        .await
        .into_iter()
        .filter_map(|e| match e.envelope.data {
            lh_events::EventData::LeaseRequested(r) if r.tenant_id == tenant_id => {
                Some(r.lease_id.to_string())
            }
            _ => None,
        })
        .collect();
    let missing = accepted.iter().filter(|id| !on_log.contains(*id)).count();
    let readers = 32;
    let mut tasks = Vec::new();
    for share in accepted.chunks(accepted.len().div_ceil(readers).max(1)) {
        let share = share.to_vec();
        let (http, base, key) = (
            stack.http.clone(),
            stack.gateway_url.clone(),
            key.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            let mut unreadable = 0;
            for id in share {
                let status = http
                    .get(format!("{base}/v1/leases/{id}"))
                    .bearer_auth(&key)
                    .send()
                    .await?
                    .status();
                unreadable += usize::from(status != reqwest::StatusCode::OK);
            }
            anyhow::Ok(unreadable)
        }));
    }
    let mut unreadable = 0;
    for task in tasks {
        unreadable += task.await??;
    }
    Ok((on_log.len(), missing, unreadable))
}

/// Runs wrk against `url`; its rate, p99 and non-2xx/socket-error count.
fn wrk(
    args: &Args,
    url: &str,
    header: Option<&str>,
    script: Option<&std::path::PathBuf>,
) -> anyhow::Result<Rate> {
    let mut cmd = Command::new("wrk");
    cmd.args([
        format!("-t{}", args.threads),
        format!("-c{}", args.connections),
        format!("-d{}s", args.duration_secs),
        "--latency".to_string(),
    ]);
    if let Some(h) = header {
        cmd.args(["-H", h]);
    }
    if let Some(script) = script {
        cmd.arg("-s").arg(script);
    }
    let out = cmd.arg(url).output().context("running wrk")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(out.status.success(), "wrk failed: {text}");
    let field = |prefix: &str| {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::trim)
    };
    let requests_per_s: f64 = field("Requests/sec:")
        .context("wrk printed no Requests/sec")?
        .parse()?;
    let p99_ms = duration_ms(field("99%").context("wrk printed no p99")?)?;
    let non_2xx: u64 = field("Non-2xx or 3xx responses:")
        .map(str::parse)
        .transpose()?
        .unwrap_or(0);
    // "Socket errors: connect 0, read 0, write 0, timeout 0"
    let socket_errors: u64 = field("Socket errors:")
        .map(|s| {
            s.split(',')
                .filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    Ok(Rate {
        route: url.to_string(),
        requests_per_s,
        p99_ms,
        failed: non_2xx + socket_errors,
    })
}

/// wrk's `1.23ms`, `456.00us`, `1.02s` in milliseconds.
fn duration_ms(text: &str) -> anyhow::Result<f64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1000.0)
    } else {
        bail!("wrk printed the duration {text:?}")
    };
    Ok(number.parse::<f64>()? * scale)
}
