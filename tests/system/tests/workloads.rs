//! Workloads end to end with the process runtime: the command sees its
//! GPUs in `CUDA_VISIBLE_DEVICES`, its exit ends the lease with the exit
//! code, a stop is SIGTERM then a grace period, and a command that cannot
//! start fails the lease without billing it. The process runtime isolates
//! no tenant from the host, so these tenants are trusted; an untrusted
//! one's lease waits for a node that isolates it. Escapes are refused at
//! the gateway: an image that reads as a CLI flag, variables that would
//! reconfigure the host.

use std::time::Duration;

use lh_events::{EndReason, EventData};
use lh_node_agent::RuntimeKind;
use lh_testkit::stack::{of_type, read_log, Stack, TWO_A100};
use reqwest::Method;
use serde_json::{json, Value};

/// Asks for one A100 running `workload`: the status and the answer.
async fn request_with(stack: &Stack, key: &str, workload: &Value) -> (u16, Value) {
    stack
        .call(
            Method::POST,
            "/v1/leases",
            key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": workload})),
        )
        .await
}

async fn lease_with(stack: &Stack, key: &str, workload: Value) -> String {
    let (s, b) = request_with(stack, key, &workload).await;
    assert_eq!(s, 202, "{b}");
    assert_eq!(b["workload"]["command"], workload["command"]);
    b["id"].as_str().unwrap().to_string()
}

/// A tenant an operator vouches for (`"trusted": true`): its API key.
async fn trusted_tenant(stack: &Stack, name: &str, max_gpus: u32) -> String {
    let tenant = stack
        .create_tenant_from(json!({
            "name": name,
            "email": format!("ops@{name}.example"),
            "quota": {"max_gpus": max_gpus},
            "trusted": true,
        }))
        .await;
    tenant["api_key"].as_str().unwrap().to_string()
}

/// A lease with `workload` is refused with a 422 naming `field`.
async fn assert_refused(stack: &Stack, key: &str, workload: Value, field: &str) {
    let (s, p) = request_with(stack, key, &workload).await;
    assert_eq!(
        (s, p["field"].as_str()),
        (422, Some(field)),
        "{workload}: {p}"
    );
}

fn ended(log: &[lh_bus::Stored], id: &str) -> lh_events::LeaseEnded {
    of_type(log, "lease.ended")
        .into_iter()
        .find_map(|e| match &e.envelope.data {
            EventData::LeaseEnded(x) if x.lease_id.to_string() == id => Some(x.clone()),
            _ => None,
        })
        .expect("the lease ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workloads_run_with_their_gpus_end_with_their_exit_and_stop_gracefully() {
    let stack = Stack::start_configured(TWO_A100, |s| s.node_runtime = RuntimeKind::Process).await;
    let key = trusted_tenant(&stack, "runs", 2).await;
    let dir = tempfile::tempdir().unwrap();

    for (workload, field) in [
        (json!({"command": []}), "workload.command"),
        (json!({"command": [""]}), "workload.command"),
        (
            json!({"command": ["true"], "env": {"1BAD": "x"}}),
            "workload.env",
        ),
    ] {
        assert_refused(&stack, &key, workload, field).await;
    }

    // Its GPU and its lease id in the environment; exit 3 fails the lease.
    let out = dir.path().join("env.txt");
    let a = lease_with(
        &stack,
        &key,
        json!({
            "command": ["sh", "-c", "echo \"$CUDA_VISIBLE_DEVICES $LEASEHOLD_LEASE_ID\" > \"$OUT\"; sleep 1; exit 3"],
            "env": {"OUT": out.to_str().unwrap()}
        }),
    )
    .await;
    let a_run = stack
        .wait_lease(&key, &a, |l| l["state"] == "running")
        .await;
    let a_end = stack.wait_lease(&key, &a, |l| l["state"] == "ended").await;
    assert_eq!(a_end["end_reason"], "failed");
    let seen = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        seen.trim(),
        format!("{} {a}", a_run["gpu_uuids"][0].as_str().unwrap())
    );

    // A workload that traps SIGTERM is stopped within the grace period.
    let term = dir.path().join("term.txt");
    let b = lease_with(
        &stack,
        &key,
        json!({
            "command": ["sh", "-c", "trap 'echo term > \"$OUT\"; exit 0' TERM; while true; do sleep 0.1; done"],
            "env": {"OUT": term.to_str().unwrap()}
        }),
    )
    .await;
    stack
        .wait_lease(&key, &b, |l| l["state"] == "running")
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, body) = stack
        .call(Method::POST, &format!("/v1/leases/{b}/stop"), &key, None)
        .await;
    assert_eq!(s, 202, "{body}");
    let b_end = stack.wait_lease(&key, &b, |l| l["state"] == "ended").await;
    assert_eq!(b_end["end_reason"], "stopped");
    assert_eq!(std::fs::read_to_string(&term).unwrap().trim(), "term");

    // Exit 0 completes it; a binary that does not exist fails it unstarted.
    let c = lease_with(&stack, &key, json!({"command": ["true"]})).await;
    let d = lease_with(
        &stack,
        &key,
        json!({"command": ["/nonexistent/lh-test-binary"]}),
    )
    .await;
    let c_end = stack.wait_lease(&key, &c, |l| l["state"] == "ended").await;
    assert_eq!(c_end["end_reason"], "completed");
    let d_end = stack.wait_lease(&key, &d, |l| l["state"] == "ended").await;
    assert_eq!(d_end["end_reason"], "failed");
    assert!(d_end["started_at"].is_null(), "{d_end}");

    let log = read_log(&stack.bus().await).await;
    let codes = [&a, &b, &c, &d].map(|id| {
        let e = ended(&log, id);
        (e.reason, e.exit_code)
    });
    assert_eq!(
        codes,
        [
            (EndReason::Failed, Some(3)),
            (EndReason::Stopped, Some(0)),
            (EndReason::Completed, Some(0)),
            (EndReason::Failed, None),
        ]
    );
    let started_d = of_type(&log, "lease.started").into_iter().any(
        |e| matches!(&e.envelope.data, EventData::LeaseStarted(s) if s.lease_id.to_string() == d),
    );
    assert!(!started_d, "a workload that never ran never started");
}

/// Two one-GPU A100 nodes.
const TWO_NODES: &str = r#"
[[node]]
id = "node-a"
zone = "cn-north-1a"
hostname = "gpu-a.sim"
gpu_model = "A100-40GB"
gpu_count = 1
vram_gb = 40

[[node]]
id = "node-d"
zone = "cn-north-1b"
hostname = "gpu-d.sim"
gpu_model = "A100-40GB"
gpu_count = 1
vram_gb = 40
"#;

/// A node-agent keeps the workloads of its own leases only; a lease that
/// moves to it from a lost node has its request read back from the log,
/// and its workload runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_moved_from_a_lost_node_runs_its_workload_on_the_new_one() {
    let mut stack =
        Stack::start_configured(TWO_NODES, |s| s.node_runtime = RuntimeKind::Process).await;
    let key = trusted_tenant(&stack, "moves", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("starts.txt");
    let id = lease_with(
        &stack,
        &key,
        json!({
            "command": ["sh", "-c", "echo \"$LEASEHOLD_LEASE_ID\" >> \"$OUT\"; sleep 30"],
            "env": {"OUT": out.to_str().unwrap()}
        }),
    )
    .await;
    let first = stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    let from = first["node_id"].as_str().unwrap().to_string();
    stack.kill_service(&format!("node-agent:{from}")).await;
    let moved = stack
        .wait_lease(&key, &id, |l| {
            l["state"] == "running" && l["node_id"].as_str() != Some(from.as_str())
        })
        .await;
    assert_ne!(moved["node_id"], first["node_id"]);
    let mut starts = String::new();
    for _ in 0..100 {
        starts = std::fs::read_to_string(&out).unwrap_or_default();
        if starts.lines().count() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        starts.lines().collect::<Vec<_>>(),
        [id.as_str(), id.as_str()]
    );
    let (s, _) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(s, 202);
    stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
}

/// Each escape a tenant could try through its workload is refused at the
/// gateway with a 422 naming the field at fault; nothing reaches the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workloads_that_would_escape_are_refused_naming_the_field() {
    let stack = Stack::start(TWO_A100).await;
    let (_, key) = stack.create_tenant("escapes", 1).await;
    let cases = [
        (
            json!({"image": "--volume=/:/host", "command": ["chroot", "/host"]}),
            "workload.image",
        ),
        (json!({"image": "-v"}), "workload.image"),
        (json!({"image": "--privileged"}), "workload.image"),
        (json!({"image": "ubuntu --gpus=all"}), "workload.image"),
        (json!({"image": "Ubuntu"}), "workload.image"),
        (json!({"image": "a".repeat(256)}), "workload.image"),
    ];
    let env_cases = [
        ("LD_PRELOAD", "/tmp/x.so"),
        ("LD_LIBRARY_PATH", "/tmp"),
        ("DOCKER_HOST", "tcp://evil:2375"),
        ("CONTAINER_HOST", "ssh://evil"),
        ("https_proxy", "http://evil:3128"),
        ("CUDA_VISIBLE_DEVICES", "all"),
        ("A", "x\nLD_PRELOAD=/tmp/x.so"),
    ]
    .map(|(name, value)| {
        (
            json!({"command": ["sh"], "env": {name: value}}),
            format!("workload.env.{name}"),
        )
    });
    let cases = cases
        .into_iter()
        .map(|(w, f)| (w, f.to_string()))
        .chain(env_cases);
    for (workload, field) in cases {
        assert_refused(&stack, &key, workload, &field).await;
    }
    let log = read_log(&stack.bus().await).await;
    assert!(of_type(&log, "lease.requested").is_empty());
}

/// The process runtime isolates no tenant from the host: an untrusted
/// tenant's lease waits, saying why, while a trusted tenant's runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_untrusted_tenant_waits_for_an_isolating_node_while_a_trusted_one_runs() {
    let stack = Stack::start_configured(TWO_A100, |s| s.node_runtime = RuntimeKind::Process).await;
    let (_, untrusted) = stack.create_tenant("untrusted", 1).await;
    let trusted = trusted_tenant(&stack, "trusted", 1).await;
    let waits = lease_with(&stack, &untrusted, json!({"command": ["sleep", "30"]})).await;
    let queued = stack
        .wait_lease(&untrusted, &waits, |l| l["state"] == "queued")
        .await;
    let reason = queued["queued_reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("no isolating runtime for untrusted tenants"),
        "{queued}"
    );
    let runs = lease_with(&stack, &trusted, json!({"command": ["sleep", "30"]})).await;
    stack
        .wait_lease(&trusted, &runs, |l| l["state"] == "running")
        .await;
    let (_, still) = stack
        .call(
            Method::GET,
            &format!("/v1/leases/{waits}"),
            &untrusted,
            None,
        )
        .await;
    assert_eq!(still["state"], "queued", "{still}");
}

/// A GPU share's caps hold only where HAMi-core enforces them: on a node
/// that declares no sharing enforcement the share waits, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_share_waits_on_a_fleet_that_enforces_no_gpu_sharing() {
    let fleet = TWO_A100.replace("vram_gb = 40", "vram_gb = 40\ngpu_sharing = \"none\"");
    let stack = Stack::start(&fleet).await;
    let (_, key) = stack.create_tenant("shares", 1).await;
    let share = stack
        .lease(
            &key,
            json!({"gpu_fraction": {"milli": 500, "vram_gb": 10}, "gpu_model": "A100-40GB"}),
        )
        .await;
    let queued = stack
        .wait_lease(&key, &share, |l| l["state"] == "queued")
        .await;
    let reason = queued["queued_reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("no node enforces GPU memory sharing"),
        "{queued}"
    );
    let whole = stack
        .lease(&key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    stack
        .wait_lease(&key, &whole, |l| l["state"] == "running")
        .await;
}
