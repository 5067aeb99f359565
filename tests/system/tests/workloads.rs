//! Workloads end to end with the process runtime: the command sees its
//! GPUs in `CUDA_VISIBLE_DEVICES`, its exit ends the lease with the exit
//! code, a stop is SIGTERM then a grace period, and a command that cannot
//! start fails the lease without billing it. The process runtime isolates
//! no tenant from the host, so these tenants are trusted; an untrusted
//! one's lease waits for a node that isolates it. Escapes are refused at
//! the gateway: an image that reads as a CLI flag, variables that would
//! reconfigure the host. Environment values never enter the log: the node
//! a lease runs on fetches them from the gateway, and nobody else can.
//! A share on a node whose MPS probe works runs as an MPS client, its
//! limits set through the daemon before it starts (a fake control binary).
//! On the container runtime (real podman) a lease starts, and is billed,
//! from when its container runs: a pull that hangs is not billed.

use std::time::Duration;

use lh_events::{EndReason, EventData};
use lh_node_agent::RuntimeKind;
use lh_test_stack::{of_type, read_log, Stack, TWO_A100};
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
    stack.create_trusted_tenant(name, max_gpus).await
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
    let dir = lh_testkit::shared_tempdir();

    for (workload, field) in [
        (json!({"command": []}), "workload.command"),
        (json!({"command": [""]}), "workload.command"),
        (
            json!({"command": ["true"], "env": {"1BAD": "x"}}),
            "workload.env",
        ),
        (
            json!({"command": ["true"], "network": "tenant"}),
            "workload.network",
        ),
    ] {
        assert_refused(&stack, &key, workload, field).await;
    }
    // A network the API does not know is a malformed body.
    let unknown = json!({"image": "localhost/leasehold/base", "network": "everywhere"});
    let (s, p) = request_with(&stack, &key, &unknown).await;
    assert_eq!(
        (s, p["field"].as_str()),
        (400, Some("workload.network")),
        "{p}"
    );

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
    let dir = lh_testkit::shared_tempdir();
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

/// Polls `path` until it holds something.
async fn written(path: &std::path::Path) -> String {
    for _ in 0..200 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if !text.is_empty() {
                return text;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} was never written", path.display());
}

/// A workload's environment reaches its workload but not the log, is given
/// only to the node its lease runs on and only while it runs, and is
/// destroyed with its tenant's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn environment_values_reach_the_workload_but_never_the_log_nor_another_node() {
    use lh_rpc::workload_env::{fetch, WorkloadEnvReply};
    let stack = Stack::start_configured(TWO_A100, |s| s.node_runtime = RuntimeKind::Process).await;
    let tenant = stack
        .create_tenant_from(json!({
            "name": "holds-secrets",
            "email": "ops@holds-secrets.example",
            "quota": {"max_gpus": 2},
            "trusted": true,
        }))
        .await;
    let tenant_id = tenant["id"].as_str().unwrap().to_string();
    let key = tenant["api_key"].as_str().unwrap().to_string();
    let secret = format!("hf_{}", uuid::Uuid::new_v4().simple());
    let dir = lh_testkit::shared_tempdir();
    let out = dir.path().join("token.txt");
    let id = lease_with(
        &stack,
        &key,
        json!({
            "command": ["sh", "-c", "printf '%s' \"$SECRET_TOKEN\" > \"$OUT\"; sleep 60"],
            "env": {"OUT": out.to_str().unwrap(), "SECRET_TOKEN": secret},
        }),
    )
    .await;
    let running = stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    assert_eq!(written(&out).await, secret, "the workload sees its value");

    // Retried with one Idempotency-Key: the same values name the same
    // lease; other values are another request.
    let keyed = |token: String| {
        let stack = &stack;
        let key = &key;
        let out = out.clone();
        async move {
            let resp = stack
                .http
                .post(format!("{}/v1/leases", stack.gateway_url))
                .bearer_auth(key)
                .header("Idempotency-Key", "env-order-7")
                .json(&json!({"gpus": 1, "gpu_model": "A100-40GB", "workload": {
                    "command": ["sh", "-c", "sleep 60"],
                    "env": {"OUT": out.to_str().unwrap(), "SECRET_TOKEN": token},
                }}))
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let (first, a) = keyed(secret.clone()).await;
    let (again, b) = keyed(secret.clone()).await;
    assert_eq!((first, again), (202, 202), "{a} {b}");
    assert_eq!(a["id"], b["id"]);
    assert_eq!(a["workload"]["env"], b["workload"]["env"]);
    let (other, c) = keyed(format!("{secret}-changed")).await;
    assert_eq!(other, 409, "{c}");
    let retried = a["id"].as_str().unwrap().to_string();
    let (status, body) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{retried}/stop"),
            &key,
            None,
        )
        .await;
    assert_eq!(status, 202, "{body}");
    stack
        .wait_lease(&key, &retried, |l| l["state"] == "ended")
        .await;
    assert_eq!(
        running["workload"]["env"]["names"],
        json!(["OUT", "SECRET_TOKEN"]),
        "{running}"
    );
    assert!(!running.to_string().contains(&secret), "{running}");

    // The request names the variables; no stored event holds the value.
    let log = read_log(&stack.bus().await).await;
    let request = of_type(&log, "lease.requested")
        .into_iter()
        .find_map(|e| match &e.envelope.data {
            EventData::LeaseRequested(r) if r.lease_id.to_string() == id => Some(r.clone()),
            _ => None,
        })
        .expect("the request is on the log");
    let workload = request.workload.expect("it runs a workload");
    assert!(workload.env.is_empty(), "values in the event: {workload:?}");
    let env_ref = workload.env_ref.expect("the event refers to the values");
    assert_eq!(env_ref.names, ["OUT", "SECRET_TOKEN"]);
    for event in &log {
        assert!(
            !String::from_utf8_lossy(&event.payload).contains(&secret),
            "{} holds the value",
            event.envelope.event_type
        );
    }

    // Its node is given the values; another node, asking on its own
    // subject, is not.
    let bus = stack.bus().await;
    let lease_id: uuid::Uuid = id.parse().unwrap();
    let node = running["node_id"].as_str().unwrap().to_string();
    let wait = Duration::from_secs(5);
    match fetch(&bus, &node, lease_id, false, wait).await.unwrap() {
        WorkloadEnvReply::Values { values, .. } => assert_eq!(values["SECRET_TOKEN"], secret),
        other => panic!("its node is not given its values: {other:?}"),
    }
    let other_node = fetch(&bus, "node-elsewhere", lease_id, false, wait)
        .await
        .unwrap();
    assert!(
        matches!(other_node, WorkloadEnvReply::NotYet { .. }),
        "{other_node:?}"
    );

    // Once the lease has ended, not even its node.
    let (status, body) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(status, 202, "{body}");
    stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    let ended = fetch(&bus, &node, lease_id, false, wait).await.unwrap();
    assert!(
        matches!(ended, WorkloadEnvReply::Refused { .. }),
        "{ended:?}"
    );

    // Erasing the tenant destroys the sealed values with its key.
    let pool = sqlx::PgPool::connect(&stack.database_url).await.unwrap();
    let stored = |pool: sqlx::PgPool, tenant: uuid::Uuid| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM gateway_keys.workload_env WHERE tenant_id = $1",
        )
        .bind(tenant)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let tenant_uuid: uuid::Uuid = tenant_id.parse().unwrap();
    assert_eq!(
        stored(pool.clone(), tenant_uuid).await,
        2,
        "one row a lease"
    );
    let sealed: Vec<String> =
        sqlx::query_scalar("SELECT sealed FROM gateway_keys.workload_env WHERE tenant_id = $1")
            .bind(tenant_uuid)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(
        sealed.iter().all(|s| !s.contains(&secret)),
        "stored in clear"
    );
    for (path, body) in [
        (format!("/v1/tenants/{tenant_id}/suspend"), json!({})),
        (format!("/v1/tenants/{tenant_id}/erase"), json!({})),
    ] {
        let (status, answer) = stack
            .call(Method::POST, &path, lh_test_stack::ADMIN_TOKEN, Some(body))
            .await;
        assert!(status == 200 || status == 202, "{path}: {status} {answer}");
    }
    assert_eq!(
        stored(pool, tenant_uuid).await,
        0,
        "the sealed values are gone"
    );
}

/// A fake `nvidia-cuda-mps-control` (and `nvidia-smi` beside it) that
/// records each command in `calls`, keeping its daemon as a file.
fn fake_mps(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = dir.display();
    let control = format!(
        r#"#!/bin/sh
umask 000
if [ "$1" = "-d" ]; then echo "-d $CUDA_VISIBLE_DEVICES" >> '{d}/calls'; touch "$CUDA_MPS_PIPE_DIRECTORY/daemon"; exit 0; fi
read -r cmd
echo "$cmd" >> '{d}/calls'
[ -e "$CUDA_MPS_PIPE_DIRECTORY/daemon" ] || exit 1
case "$cmd" in
  quit) rm -f "$CUDA_MPS_PIPE_DIRECTORY/daemon" ;;
  get_default_active_thread_percentage) echo 100.0 ;;
esac
"#
    );
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for (name, text) in [
        ("nvidia-cuda-mps-control", control),
        (
            "nvidia-smi",
            format!("#!/bin/sh\numask 000\necho \"nvidia-smi $*\" >> '{d}/calls'\n"),
        ),
    ] {
        std::fs::write(bin.join(name), text).unwrap();
        std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin.join("nvidia-cuda-mps-control")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_share_on_an_mps_node_runs_as_an_mps_client_with_its_limits_set_before_it_starts() {
    let dir = lh_testkit::shared_tempdir();
    let control = fake_mps(dir.path());
    let stack = Stack::start_configured(TWO_A100, |s| {
        s.node_runtime = RuntimeKind::Process;
        s.node_mps_control = Some(control.clone());
    })
    .await;
    let key = trusted_tenant(&stack, "mps", 2).await;
    let calls = || std::fs::read_to_string(dir.path().join("calls")).unwrap_or_default();
    let seen = dir.path().join("seen.txt");
    let script = format!(
        "echo \"$CUDA_MPS_PIPE_DIRECTORY\" > \"$OUT\"; echo workload >> '{}/calls'",
        dir.path().display()
    );
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({
                "gpu_fraction": {"milli": 250, "vram_gb": 10},
                "gpu_model": "A100-40GB",
                "workload": {"command": ["sh", "-c", script], "env": {"OUT": seen.to_str().unwrap()}},
            })),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let id = b["id"].as_str().unwrap().to_string();
    let end = stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    assert_eq!(end["end_reason"], "completed", "{end}");
    // Placed at all: the process runtime enforces no share by itself.
    let log = read_log(&stack.bus().await).await;
    let registered = of_type(&log, "node.registered");
    assert!(
        !registered.is_empty()
            && registered.iter().all(|e| matches!(&e.envelope.data,
                EventData::NodeRegistered(n) if n.gpu_sharing == lh_events::GpuSharing::Mps)),
        "every node declares mps"
    );
    let pipe = std::fs::read_to_string(&seen).unwrap();
    assert!(
        pipe.trim().ends_with("/pipe") && pipe.contains("/mps/gpu"),
        "{pipe}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !calls().contains("-c DEFAULT") {
        assert!(std::time::Instant::now() < deadline, "{}", calls());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let calls = calls();
    let at = |line: &str| {
        calls
            .lines()
            .collect::<Vec<_>>()
            .iter()
            .rposition(|l| *l == line)
            .unwrap_or_else(|| panic!("{line:?} not in {calls}"))
    };
    assert!(
        at("set_default_device_pinned_mem_limit 0 10G") < at("workload"),
        "{calls}"
    );
    assert!(
        at("set_default_active_thread_percentage 25") < at("workload"),
        "{calls}"
    );
    assert!(at("workload") < at("quit"), "{calls}");
}

/// On an MPS node a GPU hosts shares of one size: a second size goes to the
/// other GPU, a third waits (saying why) until a GPU empties, then runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_mps_node_places_one_share_size_per_gpu_and_a_third_size_waits_for_an_empty_gpu() {
    let dir = lh_testkit::shared_tempdir();
    let control = fake_mps(dir.path());
    let stack = Stack::start_configured(TWO_A100, |s| {
        s.node_runtime = RuntimeKind::Process;
        s.node_mps_control = Some(control.clone());
    })
    .await;
    let key = trusted_tenant(&stack, "mps-sizes", 4).await;
    let share = |milli: u32, vram_gb: u32| {
        json!({
            "gpu_fraction": {"milli": milli, "vram_gb": vram_gb},
            "gpu_model": "A100-40GB",
            "workload": {"command": ["sleep", "600"]},
        })
    };
    let mut ids = Vec::new();
    for (milli, vram_gb) in [(250, 10), (250, 10), (500, 20), (125, 5)] {
        let (s, b) = stack
            .call(
                Method::POST,
                "/v1/leases",
                &key,
                Some(share(milli, vram_gb)),
            )
            .await;
        assert_eq!(s, 202, "{b}");
        ids.push(b["id"].as_str().unwrap().to_string());
    }
    let mut gpus = Vec::new();
    for id in &ids[..3] {
        let l = stack
            .wait_lease(&key, id, |l| l["state"] == "running")
            .await;
        gpus.push(l["gpu_indices"].clone());
    }
    assert_eq!(gpus[0], gpus[1], "equal sizes share a GPU");
    assert_ne!(gpus[0], gpus[2], "another size goes to the other GPU");
    let queued = stack
        .wait_lease(&key, &ids[3], |l| l["state"] == "queued")
        .await;
    let reason = queued["queued_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("no GPU of an MPS node hosts only shares of this size"),
        "{queued}"
    );

    // The 20 GB share ends: its GPU is empty and takes the 5 GB one.
    let (s, b) = stack
        .call(
            Method::POST,
            &format!("/v1/leases/{}/stop", ids[2]),
            &key,
            None,
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let moved_in = stack
        .wait_lease(&key, &ids[3], |l| l["state"] == "running")
        .await;
    assert_eq!(moved_in["gpu_indices"], gpus[2]);
    for id in [&ids[0], &ids[1], &ids[3]] {
        let (s, b) = stack
            .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
            .await;
        assert_eq!(s, 202, "{b}");
    }
}

/// Through the simulated fleet's MPS: two shares of one GPU, one asking
/// for more GPU memory than it rents. It gets the allocation error, its
/// lease fails naming the cause, and the share beside it keeps its memory
/// and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_share_over_its_gpu_memory_fails_inside_its_own_lease_only() {
    let dir = lh_testkit::shared_tempdir();
    let tools = lh_node_agent::gpu::backend::sim::mps::install(dir.path()).unwrap();
    let stack = Stack::start_configured(TWO_A100, |s| {
        s.node_runtime = RuntimeKind::Process;
        s.node_mps_control = Some(tools.control.clone());
    })
    .await;
    let key = trusted_tenant(&stack, "mps-limits", 2).await;
    let alloc = tools.alloc.display().to_string();
    let release = dir.path().join("release");
    let share = |script: String| {
        json!({
            "gpu_fraction": {"milli": 250, "vram_gb": 10},
            "gpu_model": "A100-40GB",
            "workload": {"command": ["sh", "-c", script]},
        })
    };
    // The neighbour holds 8 of its 10 GiB until the other has failed.
    let neighbour_script = format!(
        "'{alloc}' 8192 600 & a=$!; while [ ! -e '{}' ]; do sleep 0.05; done; kill $a; wait $a; '{alloc}' 8192",
        release.display()
    );
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(share(neighbour_script)),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let neighbour = b["id"].as_str().unwrap().to_string();
    let running = stack
        .wait_lease(&key, &neighbour, |l| l["state"] == "running")
        .await;
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(share(format!("'{alloc}' 12288"))),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let greedy = b["id"].as_str().unwrap().to_string();
    let failed = stack
        .wait_lease(&key, &greedy, |l| l["state"] == "ended")
        .await;
    assert_eq!(
        running["gpu_indices"], failed["gpu_indices"],
        "one GPU: {failed}"
    );
    assert_eq!(
        (&failed["end_reason"], &failed["failure"]),
        (&json!("failed"), &json!("gpu_memory_exceeded")),
        "{failed}"
    );
    // The tenant reads why in the log its node kept.
    let (s, log) = stack
        .call(
            Method::GET,
            &format!("/v1/leases/{greedy}/logs"),
            &key,
            None,
        )
        .await;
    assert_eq!((s, &log["finished"]), (200, &json!(true)), "{log}");
    assert!(
        lh_node_agent::workload::stderr::failure_in(log["data"].as_str().unwrap()).is_some(),
        "{log}"
    );
    let view = stack
        .wait_lease(&key, &neighbour, |l| l["state"] == "running")
        .await;
    assert_eq!(view["failure"], Value::Null, "{view}");
    std::fs::write(&release, "").unwrap();
    let completed = stack
        .wait_lease(&key, &neighbour, |l| l["state"] == "ended")
        .await;
    assert_eq!(completed["end_reason"], "completed", "{completed}");
    let log = read_log(&stack.bus().await).await;
    assert_eq!(
        ended(&log, &greedy).failure,
        Some(lh_events::LeaseFailure::GpuMemoryExceeded)
    );
    assert_eq!(ended(&log, &neighbour).failure, None);
}

/// GETs `/v1/leases/{id}/logs?{query}` as `key`: the status and the answer.
async fn logs(stack: &Stack, key: &str, id: &str, query: &str) -> (u16, Value) {
    stack
        .call(
            Method::GET,
            &format!("/v1/leases/{id}/logs?{query}"),
            key,
            None,
        )
        .await
}

/// A workload's stdout and stderr land in one log on its node, in the
/// order written; the gateway reads it from that node by offset, a piece
/// at a time, without repeats; the tenant's CLI follows it to the end; a
/// log past its limit keeps its newest part and says how much went before;
/// another tenant does not see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workload_s_output_is_read_in_order_by_offset_and_keeps_its_newest_part() {
    let mut stack = Stack::start_configured(TWO_A100, |s| {
        s.node_runtime = RuntimeKind::Process;
        s.node_lease_log_limits = Some((4096, Duration::from_millis(200)));
    })
    .await;
    let key = trusted_tenant(&stack, "logs", 2).await;
    let (_, other) = stack.create_tenant("other", 1).await;

    // Both streams, interleaved; a pause, so a reader catches it running.
    let both = lease_with(
        &stack,
        &key,
        json!({"command": ["sh", "-c",
            "for i in $(seq 1 20); do echo \"out $i\"; echo \"err $i\" >&2; done; sleep 2; echo 'ünïcode end'"]}),
    )
    .await;
    let mut expected: String = (1..=20).map(|i| format!("out {i}\nerr {i}\n")).collect();
    expected.push_str("ünïcode end\n");
    let (mut text, mut offset, mut reads) = (Vec::new(), 0u64, 0);
    loop {
        let (s, page) = logs(&stack, &key, &both, &format!("offset={offset}&max_bytes=7")).await;
        reads += 1;
        assert!(reads < 2_000, "the log never finished: {page}");
        // Before it runs too: empty, saying why, so a follower waits.
        assert_eq!(s, 200, "{page}");
        if page["detail"].is_string() {
            assert_eq!(
                (page["data"].as_str(), &page["finished"]),
                (Some(""), &json!(false))
            );
        }
        assert!(page["next_offset"].as_u64().unwrap() >= offset, "{page}");
        assert!(page["data"].as_str().unwrap().len() <= 7, "{page}");
        text.extend_from_slice(page["data"].as_str().unwrap().as_bytes());
        offset = page["next_offset"].as_u64().unwrap();
        if page["finished"] == true && offset == page["size"].as_u64().unwrap() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(String::from_utf8(text).unwrap(), expected);
    stack
        .wait_lease(&key, &both, |l| l["state"] == "ended")
        .await;
    let (s, last) = logs(&stack, &key, &both, "tail=14").await;
    assert_eq!(
        (s, last["data"].as_str()),
        (200, Some("ünïcode end\n")),
        "{last}"
    );
    assert!(last["node_id"].is_string(), "{last}");
    let (s, as_admin) = logs(&stack, lh_test_stack::ADMIN_TOKEN, &both, "").await;
    assert_eq!(
        (s, as_admin["data"].as_str()),
        (200, Some(expected.as_str()))
    );
    // The admin's read is in the trail; the tenant's own reads are not
    // accesses to record; an auditor reads no workload's output.
    let bus = stack.bus().await;
    let reads: Vec<_> = lh_test_stack::read_log(&bus)
        .await
        .into_iter()
        .filter_map(|e| match e.envelope.data {
            lh_events::EventData::AuditAccessed(a) if a.route == "/v1/leases/{id}/logs" => {
                Some((e.envelope.actor.principal(), a.filter["lease_id"].clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(reads, [("admin:bootstrap".to_string(), both.clone())]);
    let (s, p) = logs(&stack, lh_test_stack::AUDITOR_TOKEN, &both, "").await;
    assert_eq!(s, 403, "{p}");
    let (s, p) = logs(&stack, &other, &both, "").await;
    assert_eq!(s, 404, "another tenant's lease: {p}");
    for (query, field) in [
        ("max_bytes=0", "max_bytes"),
        ("max_bytes=262145", "max_bytes"),
        ("offset=0&tail=5", "tail"),
    ] {
        let (s, p) = logs(&stack, &key, &both, query).await;
        assert_eq!((s, p["field"].as_str()), (422, Some(field)), "{query}: {p}");
    }

    // Over the 4096-byte limit: the newest part stays, offsets hold.
    let long = lease_with(
        &stack,
        &key,
        json!({"command": ["sh", "-c", "seq -f 'line %05g' 1 3000; sleep 1.5; echo the-end"]}),
    )
    .await;
    stack
        .wait_lease(&key, &long, |l| l["state"] == "ended")
        .await;
    let (s, kept) = logs(&stack, &key, &long, "").await;
    assert_eq!(s, 200, "{kept}");
    let written = 3000 * "line 00001\n".len() as u64 + "the-end\n".len() as u64;
    assert_eq!(
        kept["size"], written,
        "offsets count every byte written: {kept}"
    );
    let dropped = kept["dropped_before"].as_u64().unwrap();
    assert!(dropped > 0 && dropped < written, "{kept}");
    let data = kept["data"].as_str().unwrap();
    assert!(data.len() <= 4096, "{}", data.len());
    let mut lines = data.lines();
    let marker = lines.next().unwrap();
    assert!(
        marker.starts_with("[leasehold: ") && marker.ends_with(" bytes of older output dropped]"),
        "{marker}"
    );
    let rest: Vec<&str> = lines.collect();
    assert_eq!(rest.last(), Some(&"the-end"));
    let first: u64 = rest[0]["line ".len()..].parse().unwrap();
    let numbers: Vec<String> = (first..=3000).map(|n| format!("line {n:05}")).collect();
    assert_eq!(
        rest[..rest.len() - 1],
        numbers,
        "the newest lines, all of them"
    );
    // The first kept line is where it was written.
    let (_, at) = logs(
        &stack,
        &key,
        &long,
        &format!("offset={}&max_bytes=11", (first - 1) * 11),
    )
    .await;
    assert_eq!(at["data"], format!("line {first:05}\n"), "{at}");

    // The CLI follows a running workload to its end and exits 0.
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("key");
    std::fs::write(&key_file, &key).unwrap();
    let followed = lease_with(
        &stack,
        &key,
        json!({"command": ["sh", "-c", "echo one; sleep 2; echo two >&2; sleep 1; echo three"]}),
    )
    .await;
    let argv: Vec<String> = [
        "lh",
        "--gateway-url",
        &stack.gateway_url,
        "--api-key-file",
        key_file.to_str().unwrap(),
        "lease",
        "logs",
        &followed,
        "--follow",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let out = tokio::time::timeout(Duration::from_secs(60), lh_cli::capture(argv))
        .await
        .expect("the CLI stops following when the workload ends");
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "one\ntwo\nthree\n"),
        "{}",
        out.stderr
    );

    // Its node gone quiet: 503 naming the node, within the 5 s it gets.
    let (_, page) = logs(&stack, &key, &followed, "").await;
    let node = page["node_id"].as_str().unwrap().to_string();
    stack.kill_service(&format!("node-agent:{node}")).await;
    let asked = std::time::Instant::now();
    let (s, p) = logs(&stack, &key, &followed, "").await;
    assert_eq!(s, 503, "{p}");
    assert!(p["detail"].as_str().unwrap().contains(&node), "{p}");
    assert!(asked.elapsed() < Duration::from_secs(10));
}

/// A simulated node runs no workload: asked for a running lease's log, the
/// gateway says so instead of pretending the log was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_simulated_node_says_its_lease_never_ran_a_command() {
    let stack = Stack::start(TWO_A100).await;
    let (_, key) = stack.create_tenant("sim-logs", 1).await;
    let lease = stack
        .running(
            &key,
            json!({"gpus": 1, "gpu_model": "A100-40GB", "tier": "basic",
                   "workload": {"command": ["sh", "-c", "echo hello"]}}),
        )
        .await;
    let id = lease["id"].as_str().unwrap();
    let (status, body) = stack
        .call(Method::GET, &format!("/v1/leases/{id}/logs"), &key, None)
        .await;
    assert_eq!(status, 404, "{body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("simulates its workloads") && detail.contains(id),
        "{body}"
    );
}

/// What this kind of host needs of podman (no systemd; crun refuses its
/// cgroups).
pub(crate) const PODMAN_ARGS: [&str; 4] = ["--cgroup-manager", "cgroupfs", "--runtime", "runc"];

/// A fleet of one node of `gpus` A100s whose id is the test's own: the
/// agents of tests running at once on this host each reconcile the
/// containers of their node id, and would reap another's of the same one.
pub(crate) fn own_node_fleet(gpus: u32, faults: Option<&str>) -> (String, String) {
    let id = format!("node-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let faults = faults.map_or(String::new(), |f| format!("faults = \"{f}\"\n"));
    let fleet = format!(
        "[[node]]\nid = \"{id}\"\nzone = \"cn-north-1a\"\nhostname = \"{id}.sim\"\n\
         gpu_model = \"A100-40GB\"\ngpu_count = {gpus}\nvram_gb = 40\n{faults}"
    );
    (id, fleet)
}

/// Makes the base image the container leases run (`scripts/images.sh`
/// locks against tests making it at once).
pub(crate) fn base_image() {
    let status = std::process::Command::new(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/images.sh"),
    )
    .arg("base")
    .status()
    .expect("scripts/images.sh runs");
    assert!(status.success(), "scripts/images.sh base: {status}");
}

/// Seconds between a lease's `started_at` and `ended_at`.
fn billed_secs(lease: &Value) -> f64 {
    let at = |field: &str| {
        chrono::DateTime::parse_from_rfc3339(lease[field].as_str().unwrap_or_else(|| {
            panic!("{field} in {lease}");
        }))
        .unwrap()
    };
    (at("ended_at") - at("started_at")).num_milliseconds() as f64 / 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_container_lease_starts_and_is_billed_from_when_its_container_runs() {
    base_image();
    let (_, fleet) = own_node_fleet(2, None);
    let stack = Stack::start_configured(&fleet, |s| {
        s.node_runtime = RuntimeKind::Podman;
        s.node_container_args = PODMAN_ARGS.map(String::from).into();
        s.node_container_start_timeout_secs = 10;
    })
    .await;
    let key = trusted_tenant(&stack, "pulls", 2).await;

    // A registry that takes the connection and never answers: the pull
    // hangs until the start deadline. Nothing ran, so nothing is billed.
    let registry = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = registry.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in registry.incoming().flatten() {
            held.push(stream);
        }
    });
    let stuck = lease_with(
        &stack,
        &key,
        json!({"image": format!("127.0.0.1:{port}/never/answers:1"), "command": ["true"]}),
    )
    .await;
    let stuck_end = stack
        .wait_lease(&key, &stuck, |l| l["state"] == "ended")
        .await;
    assert_eq!(stuck_end["end_reason"], "failed", "{stuck_end}");
    assert_eq!(stuck_end["failure"], "start_timeout", "{stuck_end}");
    assert!(
        stuck_end["started_at"].is_null(),
        "never started: {stuck_end}"
    );

    // A container that runs five seconds is billed about five.
    let runs = lease_with(
        &stack,
        &key,
        json!({"image": "localhost/leasehold/base", "command": ["sleep", "5"]}),
    )
    .await;
    let runs_end = stack
        .wait_lease(&key, &runs, |l| l["state"] == "ended")
        .await;
    assert_eq!(runs_end["end_reason"], "completed", "{runs_end}");
    let billed = billed_secs(&runs_end);
    assert!((3.5..8.0).contains(&billed), "{billed} s: {runs_end}");
}

/// A container lease whose GPU falls off the bus moves to the node's other
/// GPU, and its new container runs there: it starts once the old one (of
/// the same name) is gone, not beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_container_lease_moved_within_its_node_runs_again_on_its_new_gpu() {
    base_image();
    let (node, fleet) = own_node_fleet(2, Some("faults-a.toml"));
    let mut stack = Stack::bare(&fleet).await;
    stack.write_beside_fleet(
        "faults-a.toml",
        "[[fault]]\nafter_secs = 8\ngpu = 0\nkind = \"xid\"\ncode = 79\n",
    );
    stack.node_runtime = RuntimeKind::Podman;
    stack.node_container_args = PODMAN_ARGS.map(String::from).into();
    for name in ["scheduler", "pricing", "audit", "gateway"] {
        stack.start_service(name).await;
    }
    stack.start_service(&format!("node-agent:{node}")).await;
    stack.wait_ready().await;
    let key = trusted_tenant(&stack, "moves", 1).await;
    let id = lease_with(
        &stack,
        &key,
        json!({"image": "localhost/leasehold/base", "command": ["sh", "-c", "echo up; sleep 300"]}),
    )
    .await;
    let first = stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    assert_eq!(first["gpu_indices"], json!([0]), "{first}");
    stack
        .wait_log(60, |log| {
            of_type(log, "lease.migrated")
                .iter()
                .any(|e| {
                    e.envelope
                        .data
                        .lease_id()
                        .is_some_and(|l| l.to_string() == id)
                })
                .then_some(())
        })
        .await;
    let moved = stack
        .wait_lease(&key, &id, |l| {
            (l["gpu_indices"] == json!([1]) && l["state"] == "running") || l["state"] == "ended"
        })
        .await;
    assert_eq!(moved["state"], "running", "{moved}");
    // Its container runs again, for the new placement: the old one stopped
    // and was removed first, or the new one's name would be taken.
    let name = format!("lh-{id}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let running = std::process::Command::new("podman")
            .args(PODMAN_ARGS)
            .args([
                "ps",
                "--filter",
                &format!("name={name}"),
                "--filter",
                "status=running",
            ])
            .args(["--format", "{{.Names}} {{.Labels}}"])
            .output()
            .unwrap();
        let running = String::from_utf8_lossy(&running.stdout).into_owned();
        let gpu_devices = std::process::Command::new("podman")
            .args(PODMAN_ARGS)
            .args([
                "inspect",
                "--format",
                "{{range .Config.Env}}{{.}} {{end}}",
                &name,
            ])
            .output()
            .unwrap();
        let gpu_devices = String::from_utf8_lossy(&gpu_devices.stdout).into_owned();
        let new_gpu = format!(
            "CUDA_VISIBLE_DEVICES={}",
            moved["gpu_uuids"][0].as_str().unwrap()
        );
        if running.contains(&name) && gpu_devices.contains(&new_gpu) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "running: {running:?}, devices: {gpu_devices:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let still = stack.wait_lease(&key, &id, |_| true).await;
    assert_eq!(still["state"], "running", "{still}");
    let (s, body) = stack
        .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
        .await;
    assert_eq!(s, 202, "{body}");
    stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
}
