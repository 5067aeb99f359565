//! Sessions into a lease, measured through the whole path (docs/adr/030):
//! client → gateway → NATS → node agent → the lease's container, and back.
//!
//! `cargo run --release -p lh-load-tests --bin session-bench -- --gateway http://127.0.0.1:8080 --admin-key-file .data/admin-token`
//!
//! On a running platform whose nodes run containers (`make up` where podman
//! works), it makes a tenant and a lease on `localhost/leasehold/base`, then:
//! - keystroke echo: one byte at a time into `cat` on a terminal, each
//!   waited for until its echo comes back (the line discipline echoes it,
//!   as a shell's prompt would): p50, p99 and max over `--keystrokes`;
//! - port-forward throughput: a port in the container that sends zeros
//!   (busybox `nc -e cat /dev/zero`), read through `port-forward` for
//!   `--bytes`, against a direct loopback TCP copy of as many bytes in the
//!   same run (a local thread sending zeros, one reading them), as a ratio.
//!
//! The lease is stopped at the end.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

#[derive(Parser)]
struct Args {
    /// The gateway's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    gateway: String,
    /// File holding an admin token (makes the tenant).
    #[arg(long, default_value = ".data/admin-token")]
    admin_key_file: std::path::PathBuf,
    /// Keystrokes echoed (after 50 to warm up).
    #[arg(long, default_value_t = 1000)]
    keystrokes: usize,
    /// Bytes read through the forwarded port, and copied directly.
    #[arg(long, default_value_t = 512 * 1024 * 1024)]
    bytes: u64,
    /// Times each throughput is measured (the best counts).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    key: &str,
    body: Option<Value>,
) -> anyhow::Result<Value> {
    let mut request = http.request(method, url).bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await?;
    let status = response.status();
    let value: Value = response.json().await.unwrap_or(Value::Null);
    anyhow::ensure!(status.is_success(), "{status}: {value}");
    Ok(value)
}

async fn open(gateway: &str, key: &str, path: &str, protocol: &str) -> anyhow::Result<Ws> {
    let url = format!("{}{path}", gateway.replacen("http", "ws", 1));
    let mut request = url.into_client_request()?;
    request
        .headers_mut()
        .insert("Authorization", format!("Bearer {key}").parse()?);
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol.parse()?);
    Ok(tokio_tungstenite::connect_async(request).await?.0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn mib_per_s(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / took.as_secs_f64()
}

/// A direct loopback TCP copy of `bytes` zeros, one thread sending, one
/// reading: what the forwarded port is compared with.
fn loopback_copy(bytes: u64) -> Duration {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let sender = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let chunk = vec![0u8; 64 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            s.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let started = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    while got < bytes {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got += n as u64;
    }
    let took = started.elapsed();
    sender.join().unwrap();
    took
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let http = reqwest::Client::new();
    let admin = std::fs::read_to_string(&args.admin_key_file)?
        .trim()
        .to_string();
    let gw = args.gateway.trim_end_matches('/').to_string();
    let name = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let tenant = call(&http, reqwest::Method::POST, format!("{gw}/v1/tenants"), &admin, Some(json!({
        "name": name, "email": format!("ops@{name}.example"), "quota": {"max_gpus": 1}, "trusted": true,
    }))).await?;
    let key = tenant["api_key"].as_str().unwrap().to_string();
    let lease = call(
        &http,
        reqwest::Method::POST,
        format!("{gw}/v1/leases"),
        &key,
        Some(json!({
            "gpus": 1, "gpu_model": "A100-40GB",
            "workload": {"image": "localhost/leasehold/base",
                "command": ["sh", "-c", "nc -ll -p 9001 -e cat /dev/zero & exec sleep 3600"]},
        })),
    )
    .await?;
    let id = lease["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let lease = call(
            &http,
            reqwest::Method::GET,
            format!("{gw}/v1/leases/{id}"),
            &key,
            None,
        )
        .await?;
        match lease["state"].as_str() {
            Some("running") => break,
            Some("ended" | "rejected") => anyhow::bail!("the lease did not run: {lease}"),
            _ if Instant::now() > deadline => {
                anyhow::bail!("the lease is not running after 120 s: {lease}")
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    // The port's listener starts with the container.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Keystroke echo through a terminal.
    let mut ws = open(
        &gw,
        &key,
        &format!("/v1/leases/{id}/exec?command=cat&stdin=true&tty=true"),
        "v5.channel.k8s.io",
    )
    .await?;
    let mut latencies = Vec::with_capacity(args.keystrokes);
    for i in 0..args.keystrokes + 50 {
        let byte = b'a' + (i % 26) as u8;
        let sent = Instant::now();
        ws.send(Message::Binary(vec![0, byte].into())).await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), ws.next()).await? {
                Some(Ok(Message::Binary(b))) if b.first() == Some(&1) && b[1..].contains(&byte) => {
                    break
                }
                Some(Ok(_)) => continue,
                other => anyhow::bail!("the echo stopped: {other:?}"),
            }
        }
        if i >= 50 {
            latencies.push(sent.elapsed());
        }
    }
    let _ = ws.close(None).await;
    latencies.sort();
    let (p50, p99, max) = (
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        *latencies.last().unwrap(),
    );
    println!(
        "keystroke echo over {} keystrokes: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        latencies.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );

    // Port-forward throughput against a direct loopback copy, alternating.
    let (mut best_forward, mut best_direct) = (Duration::MAX, Duration::MAX);
    for round in 0..args.rounds {
        let mut ws = open(
            &gw,
            &key,
            &format!("/v1/leases/{id}/port-forward?port=9001"),
            "v1.port-forward.leasehold.dev",
        )
        .await?;
        let started = Instant::now();
        let (mut got, mut messages) = (0u64, 0u64);
        while got < args.bytes {
            match tokio::time::timeout(Duration::from_secs(30), ws.next()).await? {
                Some(Ok(Message::Binary(b))) if b.first() == Some(&0) => {
                    got += b.len() as u64 - 1;
                    messages += 1;
                }
                Some(Ok(Message::Binary(_))) | Some(Ok(Message::Ping(_))) => {}
                other => anyhow::bail!("the forward stopped at {got} bytes: {other:?}"),
            }
        }
        let forward = started.elapsed();
        let _ = ws.close(None).await;
        let direct = tokio::task::spawn_blocking({
            let bytes = args.bytes;
            move || loopback_copy(bytes)
        })
        .await?;
        println!(
            "round {}: port-forward {:.0} MiB/s ({} KiB a message on average), direct loopback {:.0} MiB/s",
            round + 1,
            mib_per_s(args.bytes, forward),
            got / messages.max(1) / 1024,
            mib_per_s(args.bytes, direct)
        );
        best_forward = best_forward.min(forward);
        best_direct = best_direct.min(direct);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (forward, direct) = (
        mib_per_s(args.bytes, best_forward),
        mib_per_s(args.bytes, best_direct),
    );
    println!(
        "port-forward best {forward:.0} MiB/s against direct loopback best {direct:.0} MiB/s: ratio {:.3}",
        forward / direct
    );
    let _ = call(
        &http,
        reqwest::Method::POST,
        format!("{gw}/v1/leases/{id}/stop"),
        &key,
        None,
    )
    .await;
    Ok(())
}
