//! The chaos harness, short: tenants lease whole GPUs, shares, MIG
//! instances and spot GPUs, with Idempotency-Keys and retries, while every
//! service, nats-server and PostgreSQL are killed in turn and started
//! again. Afterwards, from the log and the API: no accepted lease lost or
//! doubled, no GPU ever over its capacity, every run charged once,
//! invoices equal to a rebuild, audit verified, every service ready. The
//! long run is `load-tests/chaos.sh` against `make up`.

use std::time::Duration;

use lh_test_stack::chaos::{self, Report};
use lh_test_stack::{Stack, ADMIN_TOKEN};
use reqwest::Method;

/// Two A100 nodes (one can take the other's leases) and an H100 node with
/// two GPUs in MIG mode.
const CHAOS_FLEET: &str = r#"
[[node]]
id = "node-a"
zone = "cn-north-1a"
hostname = "gpu-a.sim"
gpu_model = "A100-40GB"
gpu_count = 4
vram_gb = 40

[[node]]
id = "node-c"
zone = "cn-south-1c"
hostname = "gpu-c.sim"
gpu_model = "H100-80GB"
gpu_count = 4
vram_gb = 80
mig_gpus = [2, 3]

[[node]]
id = "node-d"
zone = "cn-north-1b"
hostname = "gpu-d.sim"
gpu_model = "A100-40GB"
gpu_count = 4
vram_gb = 40
"#;

const CLIENTS: usize = 3;
/// How long a victim stays down before it is started again.
const DOWN: Duration = Duration::from_millis(1_500);
/// Longer than the scheduler's 3 s loss window.
const NODE_DOWN: Duration = Duration::from_millis(4_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_is_lost_doubled_overcommitted_or_misbilled_through_kills() {
    let mut stack = Stack::start_with_own_postgres(CHAOS_FLEET).await;
    let stop = lh_service::CancellationToken::new();
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (_, key) = stack.create_tenant(&format!("chaos-{c}"), 64).await;
        clients.push(tokio::spawn(chaos::client(
            stack.http.clone(),
            stack.gateway_url.clone(),
            key.clone(),
            format!("c{c}"),
            stop.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut report = Report::default();
    let services = [
        "scheduler",
        "pricing",
        "spot-broker",
        "audit",
        "gateway",
        "node-agent:node-a",
    ];
    for victim in services {
        stack.kill_service(victim).await;
        report.kills += 1;
        // A node-agent stays down past the loss window: its leases move.
        let down = if victim.starts_with("node-agent") {
            NODE_DOWN
        } else {
            DOWN
        };
        tokio::time::sleep(down).await;
        stack.start_service(victim).await;
        tokio::time::sleep(DOWN).await;
    }
    stack.nats.server().kill();
    report.kills += 1;
    tokio::time::sleep(DOWN).await;
    stack.nats.server().restart().await.unwrap();
    tokio::time::sleep(DOWN * 2).await;
    let postgres = stack.own_postgres.as_mut().unwrap();
    postgres.kill();
    report.kills += 1;
    tokio::time::sleep(DOWN).await;
    postgres.restart().await.unwrap();
    tokio::time::sleep(DOWN * 2).await;

    stop.cancel();
    let mut accepted = Vec::new();
    for client in clients {
        accepted.extend(client.await.unwrap());
    }
    stack.wait_ready().await;

    // Every accepted lease ends (each client stopped its own; a stop that
    // fell into an outage is sent again), and every run is charged.
    let bus = stack.bus().await;
    let (log, stuck) = chaos::settle(
        &bus,
        &stack.http,
        &stack.gateway_url,
        ADMIN_TOKEN,
        &accepted,
        Duration::from_secs(60),
    )
    .await;
    report.add_checks(&chaos::check_log(&log, &accepted));
    report.charge_mismatch += stack.rebuild_differences().await;

    let head = bus.last_sequence().await.unwrap();
    let mut verified = false;
    for _ in 0..200 {
        let (status, body) = stack
            .call(Method::GET, "/v1/audit/verify", ADMIN_TOKEN, None)
            .await;
        if status == 200 && body["events"].as_u64().unwrap_or(0) >= head {
            verified = body["ok"] == true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    report.dead += usize::from(!verified) + stack.exited_services().len() + stuck.len();

    println!("{report}");
    println!("events: {:?}", chaos::event_counts(&log));
    let bytes = bus
        .stream_figures(lh_events::subject::EVENTS_STREAM)
        .await
        .unwrap()
        .bytes;
    println!(
        "log: {} messages, {bytes} bytes stored, {} bytes a message on average",
        head,
        bytes / head.max(1)
    );
    assert!(
        report.accepted >= 10,
        "too little traffic to judge: {report}"
    );
    assert!(report.is_clean(), "{report}");
}
