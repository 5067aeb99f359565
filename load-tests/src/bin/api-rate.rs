//! The gateway's read path under load, side by side with its own
//! `/healthz` in one run: wrk against `/healthz`, `GET /v1/leases/{id}` and
//! `GET /v1/leases`, printing requests/s, p99 and each read's ratio to
//! `/healthz`; with `--post`, `POST /v1/leases` after them.
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
use lh_testkit::stack::{Stack, FLEET};
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
    /// Also runs `POST /v1/leases` (one-GPU leases, most of them queued)
    /// last, with the tenant's write limits lifted.
    #[arg(long)]
    post: bool,
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
    let mut routes = vec![
        ("/healthz".to_string(), None),
        (format!("/v1/leases/{lease_id}"), Some(auth.as_str())),
        ("/v1/leases".to_string(), Some(auth.as_str())),
    ];
    // wrk posts only through a script.
    let scripts = tempfile::tempdir()?;
    let post_script = scripts.path().join("post-lease.lua");
    std::fs::write(
        &post_script,
        "wrk.method = \"POST\"\n\
         wrk.headers[\"Content-Type\"] = \"application/json\"\n\
         wrk.body = '{\"gpus\": 1, \"gpu_model\": \"A100-40GB\", \"tier\": \"basic\"}'\n",
    )?;
    if args.post {
        routes.push(("POST /v1/leases".to_string(), Some(auth.as_str())));
    }
    let mut rates = Vec::new();
    for (n, (path, header)) in routes.iter().enumerate() {
        let (url, script) = match path.strip_prefix("POST ") {
            Some(path) => (format!("{}{}", stack.gateway_url, path), Some(&post_script)),
            None => (format!("{}{}", stack.gateway_url, path), None),
        };
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
        let rate = tokio::task::block_in_place(|| wrk(&args, &url, *header, script))?;
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
