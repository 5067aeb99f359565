//! MIG leases end to end through the REST API: instances are cut by
//! NVIDIA's slot rules on a GPU in MIG mode, a profile that finds no room
//! waits and is placed once an instance ends (its slices are free again),
//! whole GPUs never land on a MIG GPU, and each instance is billed by its
//! memory. The node-agent makes each instance on the (simulated) GPU for
//! its lease, the workload runs on it, it is gone once the lease ends, and
//! a restarted agent adopts the instances of its leases and leaves every
//! other instance alone, telling the scheduler of it so that no lease is
//! placed over it until an operator destroys it.

use std::time::{Duration, Instant};

use lh_events::{EndReason, EventData, GpuInfo, MigInstance, StartedMigDevice};
use lh_node_agent::gpu::backend::sim::fleet::FleetFile;
use lh_node_agent::gpu::backend::sim::SimBackend;
use lh_node_agent::gpu::backend::{GpuBackend, MigDevice};
use lh_node_agent::RuntimeKind;
use lh_test_stack::{expected_charge, of_type, read_log, Stack};
use reqwest::Method;
use serde_json::{json, Value};

/// One A100 in MIG mode and one A100 that is not.
const MIG_AND_PLAIN: &str = r#"
[[node]]
id = "node-m"
zone = "cn-north-1a"
hostname = "gpu-m.sim"
gpu_model = "A100-40GB"
gpu_count = 1
vram_gb = 40
mig_gpus = [0]

[[node]]
id = "node-a"
zone = "cn-north-1a"
hostname = "gpu-a.sim"
gpu_model = "A100-40GB"
gpu_count = 1
vram_gb = 40
"#;

async fn mig(stack: &Stack, key: &str, profile: &str) -> String {
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            key,
            Some(json!({"mig_profile": profile, "gpu_model": "A100-40GB"})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    assert_eq!(b["mig_profile"], profile);
    assert_eq!(b["gpus"], 1);
    b["id"].as_str().unwrap().to_string()
}

fn instance(lease: &Value) -> (String, Value, Value) {
    (
        lease["node_id"].as_str().unwrap().to_string(),
        lease["gpu_indices"].clone(),
        lease["mig_instance"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mig_instances_follow_the_slot_rules_wait_for_room_and_bill_by_memory() {
    let stack = Stack::start(MIG_AND_PLAIN).await;
    let (_, key) = stack.create_tenant("mig", 4).await;

    // Bad MIG requests name the field.
    for (body, field, says) in [
        (
            json!({"mig_profile": "1g.5gb", "gpu_model": "L4-24GB"}),
            "mig_profile",
            "no MIG mode",
        ),
        (
            json!({"mig_profile": "1g.10gb", "gpu_model": "A100-40GB"}),
            "mig_profile",
            "1g.5gb",
        ),
        (
            json!({"gpus": 1, "mig_profile": "1g.5gb", "gpu_model": "A100-40GB"}),
            "mig_profile",
            "one of",
        ),
        (
            json!({"gpu_fraction": {"milli": 100, "vram_gb": 1}, "mig_profile": "1g.5gb", "gpu_model": "A100-40GB"}),
            "gpu_fraction",
            "one of",
        ),
    ] {
        let (s, p) = stack
            .call(Method::POST, "/v1/leases", &key, Some(body))
            .await;
        assert_eq!((s, p["field"].as_str()), (422, Some(field)), "{p}");
        assert!(p["detail"].as_str().unwrap().contains(says), "{p}");
    }

    // Two 3g.20gb instances share the MIG GPU, in NVIDIA's slots 4 and 0.
    let a = mig(&stack, &key, "3g.20gb").await;
    let a_run = stack
        .wait_lease(&key, &a, |l| l["state"] == "running")
        .await;
    assert_eq!(
        instance(&a_run),
        (
            "node-m".into(),
            json!([0]),
            json!({"profile": "3g.20gb", "start": 4})
        )
    );
    let a_device = started_devices(&read_log(&stack.bus().await).await, &a);
    assert_eq!(a_device.len(), 1);
    assert_eq!(
        sim_instances(&stack, "node-m"),
        [MigDevice {
            uuid: a_device[0].uuid.clone(),
            profile: "3g.20gb".into(),
            gpu_instance_start: Some(4),
        }]
    );
    let b = mig(&stack, &key, "3g.20gb").await;
    let b_run = stack
        .wait_lease(&key, &b, |l| l["state"] == "running")
        .await;
    assert_eq!(
        instance(&b_run),
        (
            "node-m".into(),
            json!([0]),
            json!({"profile": "3g.20gb", "start": 0})
        )
    );

    // A whole GPU goes to the GPU outside MIG mode.
    let w_run = stack
        .running(&key, json!({"gpus": 1, "gpu_model": "A100-40GB"}))
        .await;
    let w = w_run["id"].as_str().unwrap().to_string();
    assert_eq!(w_run["node_id"], "node-a");
    assert!(w_run.get("mig_instance").is_none());

    // The two instances cover all eight memory slices: a 1g.5gb waits.
    let c = mig(&stack, &key, "1g.5gb").await;
    let c_queued = stack.wait_lease(&key, &c, |l| l["state"] == "queued").await;
    assert!(
        c_queued["queued_reason"]
            .as_str()
            .unwrap()
            .contains("no room for a 1g.5gb instance"),
        "{c_queued}"
    );

    // The first instance ends and is destroyed; the 1g.5gb takes its slices.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (s, body) = stack
        .call(Method::POST, &format!("/v1/leases/{a}/stop"), &key, None)
        .await;
    assert_eq!(s, 202, "{body}");
    let c_run = stack
        .wait_lease(&key, &c, |l| l["state"] == "running")
        .await;
    let (node, gpus, inst) = instance(&c_run);
    assert_eq!((node.as_str(), gpus), ("node-m", json!([0])));
    assert_eq!(inst["profile"], "1g.5gb");
    assert!(inst["start"].as_u64().unwrap() >= 4, "{inst}");

    let log = read_log(&stack.bus().await).await;
    for placed in of_type(&log, "lease.placed") {
        let EventData::LeasePlaced(p) = &placed.envelope.data else {
            unreachable!()
        };
        if p.node_id == "node-m" {
            assert_eq!(p.decision.policy, "mig-best-fit");
            assert!(p.gpus[0].mig_instance.is_some());
        } else {
            assert_eq!(p.decision.policy, "leasehold");
        }
    }
    // Node allocations carry the instance too, for the node-agent.
    let allocations: Vec<_> = of_type(&log, "node.gpus_allocated")
        .into_iter()
        .filter_map(|e| match &e.envelope.data {
            EventData::NodeGpusAllocated(n) if n.node_id == "node-m" => Some(n.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(allocations.len(), 3);
    assert!(allocations
        .iter()
        .all(|n| n.allocations[0].mig_instance.is_some()));

    tokio::time::sleep(Duration::from_millis(1200)).await;
    for id in [&b, &c, &w] {
        let (s, body) = stack
            .call(Method::POST, &format!("/v1/leases/{id}/stop"), &key, None)
            .await;
        assert_eq!(s, 202, "{body}");
    }
    for id in [&a, &b, &c, &w] {
        stack.wait_lease(&key, id, |l| l["state"] == "ended").await;
    }

    // A MIG instance is billed by its memory (3g.20gb: 20 GB, 1g.5gb: 5 GB).
    let log = read_log(&stack.bus().await).await;
    let expected: Vec<(String, u32)> = vec![(a, 20), (b, 20), (c, 5), (w, 40)];
    let period = expected_charge(&log, &expected[0].0, 20)
        .2
        .format("%Y-%m")
        .to_string();
    let invoice = stack.wait_invoice(&key, &period, 4).await;
    for (id, vram) in &expected {
        let (seconds, amount, _) = expected_charge(&log, id, *vram);
        let line = invoice["lines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["lease_id"] == id.as_str())
            .unwrap_or_else(|| panic!("no line for {id}: {invoice}"));
        assert_eq!(line["vram_gb"], *vram, "{line}");
        assert_eq!(line["billed_seconds"], seconds, "{line}");
        assert_eq!(line["amount"], amount.to_string(), "{line}");
    }

    stack.assert_gateway_rebuilds_identically().await;
}

/// The MIG devices `lease.started` reports for lease `id`.
fn started_devices(log: &[lh_bus::Stored], id: &str) -> Vec<StartedMigDevice> {
    of_type(log, "lease.started")
        .into_iter()
        .find_map(|e| match &e.envelope.data {
            EventData::LeaseStarted(s) if s.lease_id.to_string() == id => {
                Some(s.mig_devices.clone())
            }
            _ => None,
        })
        .expect("the lease started")
}

/// The MIG instances on GPU 0 of simulated node `node`, as its GPU (the
/// simulated backend's state, which outlives agents) has them now.
fn sim_instances(stack: &Stack, node: &str) -> Vec<MigDevice> {
    let fleet = FleetFile::load(&stack.fleet_file).unwrap();
    let node = fleet.node(node, &stack.fleet_file).unwrap();
    let gpu = SimBackend::for_node(node, &stack.fleet_file).unwrap();
    gpu.inventory().unwrap()[0].mig_devices.clone()
}

/// Waits until the instances on GPU 0 of `node` pass `pred`.
async fn wait_instances(
    stack: &Stack,
    node: &str,
    pred: impl Fn(&[MigDevice]) -> bool,
) -> Vec<MigDevice> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = sim_instances(stack, node);
        if pred(&now) {
            return now;
        }
        assert!(Instant::now() < deadline, "instances stay {now:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const ONE_MIG_A100: &str = r#"
[[node]]
id = "node-m"
zone = "cn-north-1a"
hostname = "gpu-m.sim"
gpu_model = "A100-40GB"
gpu_count = 1
vram_gb = 40
mig_gpus = [0]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mig_workload_runs_on_the_instance_made_for_it_which_goes_with_the_lease() {
    let stack =
        Stack::start_configured(ONE_MIG_A100, |s| s.node_runtime = RuntimeKind::Process).await;
    let tenant = stack
        .create_tenant_from(json!({
            "name": "migrun",
            "email": "ops@migrun.example",
            "quota": {"max_gpus": 1},
            "trusted": true,
        }))
        .await;
    let key = tenant["api_key"].as_str().unwrap().to_string();
    let dir = lh_testkit::shared_tempdir();
    let out = dir.path().join("devices.txt");
    let (s, b) = stack
        .call(
            Method::POST,
            "/v1/leases",
            &key,
            Some(json!({
                "mig_profile": "2g.10gb",
                "gpu_model": "A100-40GB",
                "workload": {
                    "command": ["sh", "-c", "echo \"$CUDA_VISIBLE_DEVICES\" > \"$OUT\"; sleep 2"],
                    "env": {"OUT": out.to_str().unwrap()},
                },
            })),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    let id = b["id"].as_str().unwrap().to_string();
    stack
        .wait_lease(&key, &id, |l| l["state"] == "running")
        .await;
    let made = started_devices(&read_log(&stack.bus().await).await, &id);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0].gpu_index, 0);
    assert!(made[0].uuid.starts_with("MIG-"), "{made:?}");
    let on_gpu = sim_instances(&stack, "node-m");
    assert_eq!(on_gpu.len(), 1);
    assert_eq!(on_gpu[0].uuid, made[0].uuid);
    assert_eq!(on_gpu[0].profile, "2g.10gb");

    let ended = stack.wait_lease(&key, &id, |l| l["state"] == "ended").await;
    assert_eq!(ended["end_reason"], "completed", "{ended}");
    // The workload saw the instance, not its GPU.
    let seen = std::fs::read_to_string(&out).unwrap();
    assert_eq!(seen.trim(), made[0].uuid);
    wait_instances(&stack, "node-m", |i| i.is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_agent_adopts_its_leases_instances_and_keeps_leases_off_others() {
    let mut stack = Stack::start(ONE_MIG_A100).await;
    let (_, key) = stack.create_tenant("migrestart", 4).await;
    let a = mig(&stack, &key, "3g.20gb").await;
    stack
        .wait_lease(&key, &a, |l| l["state"] == "running")
        .await;
    let a_device = started_devices(&read_log(&stack.bus().await).await, &a);
    assert_eq!(a_device.len(), 1);

    // While the agent is down, someone cuts a 1g.5gb at slot 0 by hand.
    stack.kill_service("node-agent:node-m").await;
    let fleet = FleetFile::load(&stack.fleet_file).unwrap();
    let node = fleet.node("node-m", &stack.fleet_file).unwrap();
    let by_hand = SimBackend::for_node(node, &stack.fleet_file)
        .unwrap()
        .create_mig_instance(0, "1g.5gb", 0)
        .unwrap();
    stack.start_service("node-agent:node-m").await;

    // A stop of the lease reaches the instance it adopted: it is
    // destroyed; the one nobody holds stays.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (s, body) = stack
        .call(Method::POST, &format!("/v1/leases/{a}/stop"), &key, None)
        .await;
    assert_eq!(s, 202, "{body}");
    stack.wait_lease(&key, &a, |l| l["state"] == "ended").await;
    let left = wait_instances(&stack, "node-m", |i| {
        i.iter().all(|d| d.uuid != a_device[0].uuid)
    })
    .await;
    assert_eq!(left, std::slice::from_ref(&by_hand));

    // The agent tells the scheduler of it: its node registers it.
    let unowned = wait_registered(&stack, "node-m", |gpu| {
        !gpu.unowned_mig_instances.is_empty()
    })
    .await;
    assert_eq!(
        unowned,
        [MigInstance {
            profile: "1g.5gb".into(),
            start: 0
        }]
    );

    // It is not reused, and no lease is placed over it: a 4g.20gb (slot 0
    // only) waits, saying why, instead of failing to get its instance.
    let c = mig(&stack, &key, "4g.20gb").await;
    let c_queued = stack.wait_lease(&key, &c, |l| l["state"] == "queued").await;
    let why = c_queued["queued_reason"].as_str().unwrap();
    assert!(
        why.contains("MIG instances that belong to no lease") && why.contains("4g.20gb"),
        "{c_queued}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, still) = stack
        .call(Method::GET, &format!("/v1/leases/{c}"), &key, None)
        .await;
    assert_eq!(still["state"], "queued", "{still}");
    assert_eq!(
        sim_instances(&stack, "node-m"),
        std::slice::from_ref(&by_hand)
    );

    // The operator destroys it: the node registers again without it, and
    // the lease gets slot 0.
    SimBackend::for_node(node, &stack.fleet_file)
        .unwrap()
        .destroy_mig_instance(0, &by_hand.uuid)
        .unwrap();
    wait_registered(&stack, "node-m", |gpu| gpu.unowned_mig_instances.is_empty()).await;
    let c_run = stack
        .wait_lease(&key, &c, |l| l["state"] == "running")
        .await;
    assert_eq!(
        instance(&c_run),
        (
            "node-m".into(),
            json!([0]),
            json!({"profile": "4g.20gb", "start": 0})
        )
    );
    let c_device = started_devices(&read_log(&stack.bus().await).await, &c);
    assert_eq!(sim_instances(&stack, "node-m")[0].uuid, c_device[0].uuid);

    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (s, body) = stack
        .call(Method::POST, &format!("/v1/leases/{c}/stop"), &key, None)
        .await;
    assert_eq!(s, 202, "{body}");
    stack.wait_lease(&key, &c, |l| l["state"] == "ended").await;
    wait_instances(&stack, "node-m", |i| i.is_empty()).await;
    // No lease failed for it.
    let log = read_log(&stack.bus().await).await;
    let failed: Vec<_> = of_type(&log, "lease.ended")
        .into_iter()
        .filter(|e| matches!(&e.envelope.data, EventData::LeaseEnded(x) if x.reason == EndReason::Failed))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
}

/// Waits until the last registration of `node` on the log has its GPU 0
/// pass `pred`; its unowned MIG instances.
async fn wait_registered(
    stack: &Stack,
    node: &str,
    pred: impl Fn(&GpuInfo) -> bool,
) -> Vec<MigInstance> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = read_log(&stack.bus().await).await;
        let last = of_type(&log, "node.registered")
            .into_iter()
            .filter_map(|e| match &e.envelope.data {
                EventData::NodeRegistered(r) if r.node_id == node => Some(r.gpus[0].clone()),
                _ => None,
            })
            .last();
        if let Some(gpu) = last.filter(|g| pred(g)) {
            return gpu.unowned_mig_instances;
        }
        assert!(Instant::now() < deadline, "{node} never registered so");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
