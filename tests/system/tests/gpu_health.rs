//! The node-agent's GPU side on the whole platform: fault scripts on the
//! simulated backend drive health events the scheduler acts on, usage and
//! DCGM metrics per lease, idle reclaim by the tenant's policy, self-tests,
//! and drain / uncordon through the REST API.

use std::time::Duration;

use lh_bus::Stored;
use lh_events::{EventData, GpuHealth, IdleAction};
use lh_node_agent::RuntimeKind;
use lh_test_stack::{of_type, read_log, Stack, ADMIN_TOKEN};
use reqwest::Method;
use serde_json::{json, Value};

fn one_gpu_node(id: &str, faults: Option<&str>) -> String {
    let faults = faults.map_or(String::new(), |f| format!("faults = \"{f}\"\n"));
    format!(
        "[[node]]\nid = \"{id}\"\nzone = \"cn-north-1a\"\nhostname = \"{id}.sim\"\ngpu_model = \"A100-40GB\"\ngpu_count = 1\nvram_gb = 40\n{faults}\n"
    )
}

/// A fault script that holds GPU 0 at 0 % utilisation from the start.
const IDLE_FROM_THE_START: &str =
    "[[fault]]\nafter_secs = 0\ngpu = 0\nkind = \"utilization\"\nto_pct = 0\n";

/// A bare stack over node-a and node-b, one GPU each, each with its fault
/// script (`None`: no faults).
async fn two_nodes(faults_a: &str, faults_b: Option<&str>) -> Stack {
    let fleet = format!(
        "{}{}",
        one_gpu_node("node-a", Some("faults-a.toml")),
        one_gpu_node("node-b", faults_b.map(|_| "faults-b.toml"))
    );
    let stack = Stack::bare(&fleet).await;
    stack.write_beside_fleet("faults-a.toml", faults_a);
    if let Some(b) = faults_b {
        stack.write_beside_fleet("faults-b.toml", b);
    }
    stack
}

async fn lease(stack: &Stack, key: &str) -> String {
    stack
        .lease(key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await
}

/// The first `lease.migrated` on the log, within `secs`.
async fn first_migration(stack: &Stack, secs: u64) -> lh_events::LeaseMigrated {
    let moved = stack
        .wait_log(secs, |log| {
            of_type(log, "lease.migrated").first().map(|e| (*e).clone())
        })
        .await;
    let EventData::LeaseMigrated(m) = moved.envelope.data else {
        unreachable!()
    };
    m
}

fn health_changes(
    log: &[Stored],
    node: &str,
) -> Vec<(GpuHealth, GpuHealth, lh_events::HealthEvidence)> {
    log.iter()
        .filter_map(|e| match &e.envelope.data {
            EventData::NodeGpuHealthChanged(h) if h.node_id == node => {
                Some((h.from, h.to, h.evidence.clone()))
            }
            _ => None,
        })
        .collect()
}

/// XID 79 takes node-a's GPU off the bus while a lease runs on it: the GPU
/// turns unhealthy with the XID as evidence, the scheduler moves the lease
/// to node-b, and once the GPU answers cleanly again it is healthy. Then
/// the whole host stops (the script's node_stop): the agent goes silent,
/// the node is declared lost, and it rejoins when the host is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gpu_that_falls_off_the_bus_moves_its_lease_and_earns_its_way_back() {
    let mut stack = two_nodes(
        r#"
        [[fault]]
        after_secs = 5
        gpu = 0
        kind = "xid"
        code = 79
        [[fault]]
        after_secs = 7
        gpu = 0
        kind = "recover"
        [[fault]]
        after_secs = 10
        kind = "node_stop"
        [[fault]]
        after_secs = 15
        kind = "recover"
        "#,
        None,
    )
    .await;
    stack.node_gpus.recover_after_clean_samples = 5;
    for name in [
        "scheduler",
        "pricing",
        "audit",
        "gateway",
        "node-agent:node-a",
    ] {
        stack.start_service(name).await;
    }
    stack.wait_ready().await;
    let (_, key) = stack.create_tenant("health", 2).await;
    let id = lease(&stack, &key).await;
    let first = stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    assert_eq!(first["node_id"], "node-a");
    stack.start_service("node-agent:node-b").await;

    let m = first_migration(&stack, 15).await;
    assert_eq!(m.from_node_id, "node-a");
    assert_eq!(m.to.as_ref().unwrap().node_id, "node-b");
    let running = stack
        .wait_lease(&key, &id, |l| {
            l["state"] == "running" && l["node_id"] == "node-b"
        })
        .await;
    assert_eq!(running["migrations"], 1);

    // Back to healthy after five clean samples once the GPU answers again.
    let changes = stack
        .wait_log(15, |log| {
            let c = health_changes(log, "node-a");
            (c.len() >= 2).then_some(c)
        })
        .await;
    assert_eq!(changes[0].0, GpuHealth::Healthy);
    assert_eq!(changes[0].1, GpuHealth::Unhealthy);
    assert_eq!(changes[0].2.xid, Some(79));
    assert_eq!(changes[1].1, GpuHealth::Healthy);
    assert_eq!(changes[1].2.clean_samples, Some(5));

    // The host stops: silence, node.lost; it comes back: node.rejoined.
    let log = stack
        .wait_log(20, |log| {
            (!of_type(log, "node.rejoined").is_empty()).then(|| log.to_vec())
        })
        .await;
    let lost = of_type(&log, "node.lost");
    assert_eq!(lost.len(), 1);
    let EventData::NodeLost(lost) = &lost[0].envelope.data else {
        unreachable!()
    };
    assert_eq!(lost.node_id, "node-a");
    // Nothing else happened to the GPU meanwhile, and the lease stayed put.
    assert_eq!(health_changes(&log, "node-a").len(), 2);
    assert!(health_changes(&log, "node-b").is_empty());
    let after = stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    assert_eq!(after["node_id"], "node-b");
    assert_eq!(after["migrations"], 1);
}

/// XID 79 on node-a's GPU kills the workload running on it (the script's
/// `kills_workloads`, what a real fault does), and the workload's exit and
/// the driver's event reach the agent in either order. The lease is not
/// ended `failed`: the agent holds it, the scheduler moves it off the
/// unhealthy GPU (a failure move, downtime for the SLA) to node-b, and its
/// workload runs again there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workload_killed_by_a_gpu_fault_is_moved_not_failed() {
    let mut stack = two_nodes(
        "[[fault]]\nafter_secs = 6\ngpu = 0\nkind = \"xid\"\ncode = 79\nkills_workloads = true\n",
        None,
    )
    .await;
    stack.node_runtime = RuntimeKind::Process;
    for name in ["scheduler", "pricing", "audit", "gateway"] {
        stack.start_service(name).await;
    }
    stack.wait_ready().await;
    // The process runtime isolates nothing: a tenant the operator trusts.
    let tenant = stack
        .create_tenant_from(json!({"name": "faulted", "email": "ops@faulted.example",
                                   "quota": {"max_gpus": 1}, "trusted": true}))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_string();
    // The script's clock starts with node-a's agent.
    let fault_at = std::time::Instant::now() + Duration::from_secs(6);
    stack.start_service("node-agent:node-a").await;
    let dir = lh_testkit::shared_tempdir();
    let out = dir.path().join("runs.txt");
    // Each run is a lease user of its own: both append to one file.
    std::fs::write(&out, "").unwrap();
    std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let workload = json!({
        "command": ["sh", "-c", "echo \"$CUDA_VISIBLE_DEVICES\" >> \"$OUT\"; sleep 60"],
        "env": {"OUT": out.to_str().unwrap()}
    });
    let (status, body) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": workload})),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let first = stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    assert_eq!(first["node_id"], "node-a");
    assert!(
        std::time::Instant::now() < fault_at,
        "the lease must run before the fault for this test to mean anything"
    );
    stack.start_service("node-agent:node-b").await;

    let m = first_migration(&stack, 20).await;
    assert_eq!(m.lease_id.to_string(), id);
    // The words of a failure move (lh_domain::moves::gpu_unhealthy), which
    // the ledger counts as downtime.
    assert_eq!(m.reason, "GPU 0 of node node-a unhealthy");
    assert_eq!(m.to.as_ref().unwrap().node_id, "node-b");
    let running = stack
        .wait_lease(&key, &id, |l| {
            l["state"] == "running" && l["node_id"] == "node-b"
        })
        .await;
    assert_eq!(running["migrations"], 1);

    // Its workload ran on each GPU in turn, and nothing ended the lease.
    let mut runs = String::new();
    for _ in 0..100 {
        runs = std::fs::read_to_string(&out).unwrap_or_default();
        if runs.lines().count() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        runs.lines().collect::<Vec<_>>(),
        [
            first["gpu_uuids"][0].as_str().unwrap(),
            running["gpu_uuids"][0].as_str().unwrap()
        ]
    );
    let log = read_log(&stack.bus().await).await;
    assert!(of_type(&log, "lease.ended").is_empty(), "not failed");
    let killed = health_changes(&log, "node-a");
    assert_eq!(killed[0].1, GpuHealth::Unhealthy);
    assert_eq!(killed[0].2.xid, Some(79));

    let (s, _) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(s, 202);
    let ended = stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    assert_eq!(ended["end_reason"], "stopped");
}

/// Two leases of a tenant whose policy stops idle leases after 2 s: the one
/// on node-a (whose GPU reads 0 % though held) is reported idle once, after
/// the window, and stopped; the one on node-b (70 %) runs on, publishes its
/// usage and DCGM series labelled by lease and tenant, and is charged the
/// application XID 13 its workload causes, which leaves the GPU healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_leases_are_reclaimed_by_policy_and_busy_ones_report_usage() {
    let mut stack = two_nodes(
        IDLE_FROM_THE_START,
        Some("[[fault]]\nafter_secs = 8\ngpu = 0\nkind = \"xid\"\ncode = 13\n"),
    )
    .await;
    for name in ["scheduler", "pricing", "audit", "gateway"] {
        stack.start_service(name).await;
    }
    stack.wait_ready().await;
    let tenant = stack
        .create_tenant_from(
            json!({"name": "idler", "email": "ops@idler.example", "quota": {"max_gpus": 2},
                   "idle_policy": {"window_seconds": 2, "action": "stop"}}),
        )
        .await;
    assert_eq!(tenant["idle_policy"]["action"], "stop");
    let key = tenant["api_key"].as_str().unwrap().to_string();
    let tenant_id = tenant["id"].as_str().unwrap().to_string();

    // A bad policy names its field.
    for (policy, status, field) in [
        (
            json!({"window_seconds": 0, "action": "stop"}),
            422,
            "idle_policy.window_seconds",
        ),
        (
            json!({"window_seconds": 60, "action": "hibernate"}),
            400,
            "idle_policy.action",
        ),
    ] {
        let body = json!({"name": "x", "email": "ops@x.example", "quota": {"max_gpus": 1},
                          "idle_policy": policy});
        let (s, problem) = stack
            .call(Method::POST, "/v1/tenants", ADMIN_TOKEN, Some(body))
            .await;
        assert_eq!(s, status, "{problem}");
        assert_eq!(problem["field"], field);
    }

    // One lease per node: start the agents one at a time.
    stack.start_service("node-agent:node-a").await;
    stack.wait_ready().await;
    let idle = lease(&stack, &key).await;
    let idle_running = stack
        .wait_lease(&key, &idle, |l| l["state"] == "running")
        .await;
    assert_eq!(idle_running["node_id"], "node-a");
    stack.start_service("node-agent:node-b").await;
    stack.wait_ready().await;
    let busy = lease(&stack, &key).await;
    let busy_running = stack
        .wait_lease(&key, &busy, |l| l["state"] == "running")
        .await;
    assert_eq!(busy_running["node_id"], "node-b");

    let ended = stack
        .wait_lease(&key, &idle, |l| l["state"] == "ended")
        .await;
    assert_eq!(ended["end_reason"], "stopped", "{ended}");

    // Usage of the busy lease on the telemetry stream.
    let bus = stack.bus().await;
    let usage: lh_events::telemetry::LeaseUsage = serde_json::from_slice(
        &bus.last_telemetry(&lh_events::subject::usage_of_lease(busy.parse().unwrap()))
            .await
            .unwrap()
            .expect("a usage sample"),
    )
    .unwrap();
    assert_eq!(usage.node_id, "node-b");
    assert_eq!(usage.tenant_id.unwrap().to_string(), tenant_id);
    assert_eq!(usage.gpus.len(), 1);
    assert_eq!(usage.gpus[0].utilization_pct, Some(70));
    assert_eq!(usage.gpus[0].memory_used_mib, 40 * 1024 / 4);
    assert!(!usage.gpus[0].shared);

    // DCGM series on node-b's /metrics, labelled by lease and tenant.
    let metrics = stack
        .http
        .get(format!(
            "http://{}/metrics",
            stack.http_addr("node-agent:node-b")
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let util = metrics
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{"))
        .unwrap_or_else(|| panic!("no DCGM series in:\n{metrics}"));
    assert!(util.contains(&format!("lease=\"{busy}\"")), "{util}");
    assert!(util.contains(&format!("tenant=\"{tenant_id}\"")), "{util}");
    assert!(util.ends_with(" 70"), "{util}");

    // The application XID is the busy lease's; node-b's GPU stays healthy.
    let log = stack
        .wait_log(15, |log| {
            (!of_type(log, "lease.gpu_fault").is_empty()).then(|| log.to_vec())
        })
        .await;
    let EventData::LeaseGpuFault(fault) = &of_type(&log, "lease.gpu_fault")[0].envelope.data else {
        unreachable!()
    };
    assert_eq!(fault.lease_id.to_string(), busy);
    assert_eq!(fault.xid, 13);
    assert!(health_changes(&log, "node-b").is_empty());

    // Idle: once, for the idle lease only, and only after the window.
    let idles = of_type(&log, "lease.idle_detected");
    assert_eq!(idles.len(), 1, "one report");
    let EventData::LeaseIdleDetected(report) = &idles[0].envelope.data else {
        unreachable!()
    };
    assert_eq!(report.lease_id.to_string(), idle);
    assert_eq!(report.action, IdleAction::Stop);
    assert_eq!(report.window_seconds, 2);
    assert!(report.at - report.idle_since >= chrono::Duration::seconds(2));
    let started: chrono::DateTime<chrono::Utc> = idle_running["started_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(report.idle_since >= started, "idle counted from the start");
    let stop = of_type(&log, "lease.stop_requested");
    assert_eq!(stop.len(), 1);
    assert!(matches!(
        &stop[0].envelope.actor,
        lh_events::Actor::Node(n) if n == "node-a"
    ));
    assert!(stop[0].sequence > idles[0].sequence);
    let still = stack
        .wait_lease(&key, &busy, |l| l["state"] == "running")
        .await;
    assert_eq!(still["node_id"], "node-b");
}

/// Self-tests every 2 s, 1 s long, on free GPUs: GPU 0 passes; GPU 1,
/// hot from the start, is degraded after its window, fails its self-test
/// (unhealthy), cools down, and its next self-test brings it straight back
/// (clean samples alone would take 1,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn self_tests_fail_a_hot_gpu_and_bring_it_back_once_cool() {
    let fleet = "[[node]]\nid = \"node-a\"\nzone = \"z\"\nhostname = \"a.sim\"\ngpu_model = \"A100-40GB\"\ngpu_count = 2\nvram_gb = 40\nfaults = \"faults-a.toml\"\n";
    let mut stack = Stack::bare(fleet).await;
    stack.write_beside_fleet(
        "faults-a.toml",
        r#"
        [[fault]]
        after_secs = 0
        gpu = 1
        kind = "temperature"
        to_c = 92
        [[fault]]
        after_secs = 4
        gpu = 1
        kind = "recover"
        "#,
    );
    stack.node_gpus.degraded_window_secs = 1;
    stack.node_gpus.recover_after_clean_samples = 1_000;
    stack.node_gpus.self_test_every_secs = 2;
    stack.node_gpus.self_test_secs = 1;
    for name in ["scheduler", "node-agent:node-a"] {
        stack.start_service(name).await;
    }
    let log = stack
        .wait_log(20, |log| {
            let back = health_changes(log, "node-a")
                .iter()
                .any(|(_, to, ev)| *to == GpuHealth::Healthy && ev.self_test_passed == Some(true));
            back.then(|| log.to_vec())
        })
        .await;
    let tests: Vec<(u32, bool)> = log
        .iter()
        .filter_map(|e| match &e.envelope.data {
            EventData::NodeGpuSelfTested(t) => Some((t.gpu_index, t.passed)),
            _ => None,
        })
        .collect();
    assert!(tests.contains(&(0, true)), "{tests:?}");
    assert!(!tests.contains(&(0, false)), "{tests:?}");
    let gpu1: Vec<bool> = tests.iter().filter(|t| t.0 == 1).map(|t| t.1).collect();
    assert_eq!(gpu1.first(), Some(&false), "{tests:?}");
    assert_eq!(gpu1.last(), Some(&true), "{tests:?}");
    let changes: Vec<(GpuHealth, GpuHealth)> = health_changes(&log, "node-a")
        .into_iter()
        .map(|(f, t, _)| (f, t))
        .collect();
    assert_eq!(
        changes,
        vec![
            (GpuHealth::Healthy, GpuHealth::Degraded),
            (GpuHealth::Degraded, GpuHealth::Unhealthy),
            (GpuHealth::Unhealthy, GpuHealth::Healthy),
        ]
    );
}

/// Drain and uncordon through the API: `move` sends a running lease
/// elsewhere, `finish` leaves it where it is; neither node takes new
/// leases until it is uncordoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_moves_or_keeps_leases_and_uncordon_takes_new_ones() {
    let fleet = format!(
        "{}{}{}",
        one_gpu_node("node-a", None),
        one_gpu_node("node-b", None),
        one_gpu_node("node-c", None)
    );
    let stack = Stack::start(&fleet).await;
    let (_, key) = stack.create_tenant("drainer", 3).await;

    // Errors first.
    let drain = |node: &str| format!("/v1/nodes/{node}/drain");
    for (node, key, body, status, field) in [
        ("node-a", key.as_str(), json!({"mode": "move"}), 403, None),
        (
            "node-z",
            ADMIN_TOKEN,
            json!({"mode": "move"}),
            404,
            Some("id"),
        ),
        (
            "node-a",
            ADMIN_TOKEN,
            json!({"mode": "evict"}),
            400,
            Some("mode"),
        ),
        (
            "node-a",
            "wrong-key",
            json!({"mode": "move"}),
            401,
            Some("Authorization"),
        ),
    ] {
        let (s, p) = stack
            .call(Method::POST, &drain(node), key, Some(body))
            .await;
        assert_eq!(s, status, "{p}");
        if let Some(field) = field {
            assert_eq!(p["field"], field, "{p}");
        }
    }

    let first = lease(&stack, &key).await;
    let placed = stack
        .wait_lease(&key, &first, |l| l["state"] == "running")
        .await;
    let x = placed["node_id"].as_str().unwrap().to_string();
    let (s, body) = stack
        .call(
            Method::POST,
            &drain(&x),
            ADMIN_TOKEN,
            Some(json!({"mode": "move", "reason": "kernel upgrade"})),
        )
        .await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(body["cordoned"], true);
    assert_eq!(body["drain"], "move");
    let moved = stack
        .wait_lease(&key, &first, |l| {
            l["state"] == "running" && l["node_id"] != Value::String(x.clone())
        })
        .await;
    let y = moved["node_id"].as_str().unwrap().to_string();
    assert_eq!(moved["migrations"], 1);

    // Finish: the lease stays on y; the next one goes to the third node.
    let (s, _) = stack
        .call(
            Method::POST,
            &drain(&y),
            ADMIN_TOKEN,
            Some(json!({"mode": "finish"})),
        )
        .await;
    assert_eq!(s, 202);
    let second = lease(&stack, &key).await;
    let placed2 = stack
        .wait_lease(&key, &second, |l| l["state"] == "running")
        .await;
    let z = placed2["node_id"].as_str().unwrap().to_string();
    assert!(z != x && z != y, "{x} {y} {z}");
    let third = lease(&stack, &key).await;
    let queued = stack
        .wait_lease(&key, &third, |l| l["state"] == "queued")
        .await;
    assert_eq!(queued["node_id"], Value::Null);
    let kept = stack
        .wait_lease(&key, &first, |l| l["state"] == "running")
        .await;
    assert_eq!(kept["node_id"], Value::String(y.clone()));
    assert_eq!(kept["migrations"], 1);

    // Uncordon x: the queued lease goes there.
    let (s, body) = stack
        .call(
            Method::POST,
            &format!("/v1/nodes/{x}/uncordon"),
            ADMIN_TOKEN,
            None,
        )
        .await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(body["cordoned"], false);
    let placed3 = stack
        .wait_lease(&key, &third, |l| l["state"] == "running")
        .await;
    assert_eq!(placed3["node_id"], Value::String(x));
}

/// A tenant whose policy suspends idle leases: the lease on node-a (0 %
/// though held) is suspended after its window (GPUs freed, run billed up
/// to then), resumed through the API, placed on node-b (node-a drained),
/// runs there, and its invoice bills the two runs and nothing in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_lease_is_suspended_resumed_elsewhere_and_billed_per_run() {
    let mut stack = two_nodes(IDLE_FROM_THE_START, None).await;
    for name in [
        "scheduler",
        "pricing",
        "audit",
        "gateway",
        "node-agent:node-a",
    ] {
        stack.start_service(name).await;
    }
    stack.wait_ready().await;
    let tenant = stack
        .create_tenant_from(
            json!({"name": "sleeper", "email": "ops@sleeper.example", "quota": {"max_gpus": 1},
                   "idle_policy": {"window_seconds": 2, "action": "suspend"}}),
        )
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_string();
    let id = lease(&stack, &key).await;
    stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;

    // Resuming a running lease is a conflict.
    let resume = format!("/v1/leases/{id}/resume");
    let (s, p) = stack.call(Method::POST, &resume, &key, None).await;
    assert_eq!(s, 409, "{p}");

    let suspended = stack
        .wait_lease(&key, &id, |l| l["state"] == "suspended")
        .await;
    assert_eq!(suspended["node_id"], Value::Null);
    assert_eq!(suspended["gpu_uuids"], json!([]));
    assert!(suspended["idle_since"].is_string(), "{suspended}");
    assert!(suspended["suspended_at"].is_string(), "{suspended}");

    // Its GPU is free: the quota counts nothing while suspended.
    let (s, _) = stack
        .call(
            Method::POST,
            "/v1/nodes/node-a/drain",
            ADMIN_TOKEN,
            Some(json!({"mode": "finish"})),
        )
        .await;
    assert_eq!(s, 202);
    stack.start_service("node-agent:node-b").await;
    stack.wait_ready().await;
    let (s, body) = stack.call(Method::POST, &resume, &key, None).await;
    assert_eq!(s, 202, "{body}");
    let resumed = stack
        .wait_lease(&key, &id, |l| {
            l["state"] == "running" && l["node_id"] == "node-b"
        })
        .await;
    assert_eq!(resumed["suspended_at"], suspended["suspended_at"]);
    // Busy on node-b: not suspended again.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    let (s, _) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(s, 202);
    stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;

    let log = lh_test_stack::read_log(&stack.bus().await).await;
    let EventData::LeaseSuspended(sus) = &of_type(&log, "lease.suspended")[0].envelope.data else {
        unreachable!()
    };
    assert_eq!(of_type(&log, "lease.suspended").len(), 1);
    assert_eq!(sus.node_id, "node-a");
    let starts = lh_test_stack::starts(&log);
    assert_eq!(
        starts.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
        vec!["node-a", "node-b"]
    );
    let EventData::LeaseEnded(end) = &of_type(&log, "lease.ended")[0].envelope.data else {
        unreachable!()
    };
    let runs = [(starts[0].1, sus.suspended_at), (starts[1].1, end.ended_at)];
    assert!(runs[0].1 < runs[1].0, "the suspension is not billed");
    stack.assert_runs_billed(&key, 40, &runs).await;
    stack.assert_gateway_rebuilds_identically().await;
}

/// With a load command, a self-test is that command on the GPU under test:
/// it sees the GPU's UUID in CUDA_VISIBLE_DEVICES, and the test passes only
/// when it exits 0 (GPU 0 here) and fails otherwise (GPU 1, which becomes
/// unhealthy).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_self_test_runs_the_load_command_on_the_gpu_under_test() {
    let fleet = "[[node]]\nid = \"node-a\"\nzone = \"z\"\nhostname = \"a.sim\"\ngpu_model = \"A100-40GB\"\ngpu_count = 2\nvram_gb = 40\n";
    let mut stack = Stack::bare(fleet).await;
    let seen = stack.fleet_file.parent().unwrap().to_path_buf();
    stack.node_gpus.self_test_every_secs = 2;
    stack.node_gpus.self_test_secs = 1;
    stack.node_gpus.self_test_command = Some(format!(
        "echo \"$CUDA_VISIBLE_DEVICES $LH_SELF_TEST_SECS\" > {}/gpu-$LH_GPU_INDEX; sleep 0.3; [ \"$LH_GPU_INDEX\" = 0 ] || exit 7",
        seen.display()
    ));
    for name in ["scheduler", "node-agent:node-a"] {
        stack.start_service(name).await;
    }
    let log = stack
        .wait_log(20, |log| {
            let tested: Vec<_> = log
                .iter()
                .filter_map(|e| match &e.envelope.data {
                    EventData::NodeGpuSelfTested(t) => Some(t.clone()),
                    _ => None,
                })
                .collect();
            let unhealthy = health_changes(log, "node-a")
                .iter()
                .any(|(_, to, _)| *to == GpuHealth::Unhealthy);
            (tested.iter().any(|t| t.gpu_index == 0) && unhealthy).then(|| log.to_vec())
        })
        .await;
    let tested: Vec<lh_events::NodeGpuSelfTested> = log
        .iter()
        .filter_map(|e| match &e.envelope.data {
            EventData::NodeGpuSelfTested(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    let gpu0 = tested.iter().find(|t| t.gpu_index == 0).unwrap();
    assert!(gpu0.passed, "{gpu0:?}");
    let gpu1 = tested.iter().find(|t| t.gpu_index == 1).unwrap();
    assert!(!gpu1.passed, "{gpu1:?}");
    assert!(gpu1.detail.contains("exit status: 7"), "{gpu1:?}");
    let EventData::NodeRegistered(node) = &of_type(&log, "node.registered")[0].envelope.data else {
        unreachable!()
    };
    for gpu in &node.gpus {
        let env = std::fs::read_to_string(seen.join(format!("gpu-{}", gpu.index))).unwrap();
        assert_eq!(env.trim(), format!("{} 1", gpu.uuid));
    }
}
